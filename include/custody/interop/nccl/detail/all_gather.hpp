/// @file
/// The one all-gather of raw bytes custody's NCCL helpers run (device claims, host names, live
/// summaries): host bytes in, every rank's bytes out, through scratch memory on the communicator's
/// device.
#pragma once

#include <custody/core/error.hpp>
#include <custody/platform/cuda.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <source_location>
#include <vector>

namespace custody::interop::nccl::detail {

/// Device memory on the current device for one collective, freed on every path. Not copyable.
class nccl_scratch {
public:
    explicit nccl_scratch(std::size_t bytes) { CUSTODY_CUDA_TRY(cudaMalloc(&ptr_, bytes)); }
    ~nccl_scratch() { CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFree(ptr_)); }
    nccl_scratch(const nccl_scratch&) = delete;
    nccl_scratch& operator=(const nccl_scratch&) = delete;
    [[nodiscard]] char* get() const noexcept { return static_cast<char*>(ptr_); }

private:
    void* ptr_ = nullptr;
};

/// All-gathers `slot` (the same size on every rank) over `comm`, on `stream`, and returns
/// size(comm) * slot.size() bytes, rank r's slot at r * slot.size(). The scratch buffers, the copies
/// and the gather run with the communicator's device current (whatever the caller has current),
/// which is restored; `stream` must belong to that device. Collective; blocks until `stream` is
/// done. Throws custody::cuda_error / nccl_error; scratch memory is freed on every path.
inline std::vector<char> all_gather_bytes(const std::vector<char>& slot, ncclComm_t comm, cudaStream_t stream) {
    int world = 0;
    int device = 0;
    CUSTODY_NCCL_TRY(ncclCommCount(comm, &world));
    CUSTODY_NCCL_TRY(ncclCommCuDevice(comm, &device));
    cuda::device_guard guard(device);
    const std::size_t slot_bytes = slot.size();
    std::vector<char> all(slot_bytes * static_cast<std::size_t>(world));
    nccl_scratch send(slot_bytes);
    nccl_scratch recv(all.size());
    try {
        CUSTODY_CUDA_TRY(cudaMemcpyAsync(send.get(), slot.data(), slot_bytes, cudaMemcpyHostToDevice, stream));
        CUSTODY_NCCL_TRY(ncclAllGather(send.get(), recv.get(), slot_bytes, ncclChar, comm, stream));
        CUSTODY_CUDA_TRY(cudaMemcpyAsync(all.data(), recv.get(), all.size(), cudaMemcpyDeviceToHost, stream));
        CUSTODY_CUDA_TRY(cudaStreamSynchronize(stream));
    } catch (...) {
        // Work already enqueued may still use the scratch memory: wait before it is freed.
        static_cast<void>(cudaStreamSynchronize(stream));
        throw;
    }
    return all;
}

} // namespace custody::interop::nccl::detail
