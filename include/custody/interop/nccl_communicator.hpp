/// @file
/// NCCL communicators as owning handles, the all-gather that lets bind_device check device claims
/// over a communicator, and GPU identities (UUIDs) for that check.
#pragma once

#include <custody/core/error.hpp>
#include <custody/interop/bind_device.hpp>
#include <custody/core/rank.hpp>
#include <custody/platform/cuda.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdio>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace custody::interop::nccl {

/// The UUID of CUDA device `device` as nvidia-smi prints it ("GPU-8-4-4-4-12 hex digits"): the
/// identity two processes compare, whatever ordinals CUDA_VISIBLE_DEVICES gave them.
[[nodiscard]] inline std::string device_uuid(int device) {
    cudaDeviceProp prop{};
    CUSTODY_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
    std::string text = "GPU-";
    for (int i = 0; i < 16; ++i) {
        char hex[3];
        std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(prop.uuid.bytes[i]));
        text += hex;
        if (i == 3 || i == 5 || i == 7 || i == 9) text += '-';
    }
    return text;
}

/// A fresh unique id for ncclCommInitRank; created by one rank and sent to the others out of band.
[[nodiscard]] inline ncclUniqueId make_unique_id() {
    ncclUniqueId id{};
    CUSTODY_NCCL_TRY(ncclGetUniqueId(&id));
    return id;
}

/// An owning NCCL communicator on one device.
///
/// Construction is collective (ncclCommInitRank: every rank of `world_size` must construct its own
/// with the same id) and runs with `device` current, restoring the caller's device. Destruction
/// calls ncclCommDestroy on that device; failures there are reported through custody's callback,
/// never thrown.
/// Ownership: move-only; a moved-from communicator owns nothing (get() == nullptr).
/// Thread safety: as NCCL's: one communicator must not be used by two threads at once.
/// Stream semantics: collectives run on the stream the caller passes to NCCL.
class communicator {
public:
    /// Joins the communicator `id` as `rank` of `world_size`, on `device`. Throws nccl_error.
    communicator(const ncclUniqueId& id, int rank, int world_size, int device) : device_(device) {
        custody::cuda::device_guard guard(device);
        CUSTODY_NCCL_TRY(ncclCommInitRank(&comm_, world_size, id, rank));
        rank_ = rank;
        size_ = world_size;
    }

    /// Joins as described by `rank` (rank and world size), on `device`.
    communicator(const ncclUniqueId& id, const rank_info& rank, int device)
        : communicator(id, rank.rank, rank.world_size, device) {}

    /// Takes ownership of an initialized `comm` (which must have been made on `device`).
    static communicator adopt(ncclComm_t comm, int device) {
        communicator c;
        c.comm_ = comm;
        c.device_ = device;
        CUSTODY_NCCL_TRY(ncclCommUserRank(comm, &c.rank_));
        CUSTODY_NCCL_TRY(ncclCommCount(comm, &c.size_));
        return c;
    }

    communicator(communicator&& other) noexcept
        : comm_(std::exchange(other.comm_, nullptr)), device_(other.device_), rank_(other.rank_), size_(other.size_) {}
    communicator& operator=(communicator&& other) noexcept {
        if (this != &other) {
            reset();
            comm_ = std::exchange(other.comm_, nullptr);
            device_ = other.device_;
            rank_ = other.rank_;
            size_ = other.size_;
        }
        return *this;
    }
    communicator(const communicator&) = delete;
    communicator& operator=(const communicator&) = delete;
    ~communicator() { reset(); }

    [[nodiscard]] ncclComm_t get() const noexcept { return comm_; }
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] int rank() const noexcept { return rank_; }
    [[nodiscard]] int size() const noexcept { return size_; }

    /// Gives up ownership: the caller destroys the returned communicator.
    [[nodiscard]] ncclComm_t release() noexcept { return std::exchange(comm_, nullptr); }

private:
    communicator() = default;

    void reset() noexcept {
        if (comm_ == nullptr) return;
        custody::cuda::device_guard guard(device_, std::nothrow);
        const ncclResult_t status = ncclCommDestroy(comm_);
        if (status != ncclSuccess) report_noexcept_failure("ncclCommDestroy", ncclGetErrorString(status));
        comm_ = nullptr;
    }

    ncclComm_t comm_ = nullptr;
    int device_ = -1;
    int rank_ = -1;
    int size_ = 0;
};

/// All-gathers device claims over a communicator (one ncclAllGather of sizeof(device_claim) bytes
/// per rank through a temporary device buffer on the communicator's device), for bind_device.
/// Collective; blocks until the gather has finished. Thread safety: as the communicator.
class claim_exchange_over {
public:
    explicit claim_exchange_over(communicator& comm) noexcept : comm_(&comm) {}

    std::vector<device_claim> all_gather(const device_claim& mine) {
        constexpr std::size_t bytes = sizeof(device_claim);
        const auto n = static_cast<std::size_t>(comm_->size());
        custody::cuda::device_guard guard(comm_->device());
        custody::cuda::stream stream(comm_->device());
        void* buffer = nullptr;
        CUSTODY_CUDA_TRY(cudaMalloc(&buffer, bytes * (n + 1)));
        std::vector<device_claim> all(n);
        try {
            auto* base = static_cast<char*>(buffer);
            CUSTODY_CUDA_TRY(cudaMemcpyAsync(base + bytes * n, &mine, bytes, cudaMemcpyHostToDevice, stream.view().get()));
            CUSTODY_NCCL_TRY(ncclAllGather(base + bytes * n, base, bytes, ncclChar, comm_->get(), stream.view().get()));
            CUSTODY_CUDA_TRY(cudaMemcpyAsync(all.data(), base, bytes * n, cudaMemcpyDeviceToHost, stream.view().get()));
            custody::cuda::platform::synchronize(stream.view());
        } catch (...) {
            custody::cuda::platform::synchronize(stream.view());
            CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFree(buffer));
            throw;
        }
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFree(buffer));
        return all;
    }

private:
    communicator* comm_;
};
static_assert(claim_exchange<claim_exchange_over>);

/// Binds this rank to its CUDA device and checks over `comm` (made on device_for(rank)) that no two
/// ranks on one host chose one GPU, comparing GPU UUIDs. See interop::bind_device.
inline device_binding bind_device(const rank_info& rank, communicator& comm, binding_options options = {}) {
    if (!options.identify) options.identify = &device_uuid;
    const int expected = device_for<custody::cuda::platform>(validate_rank(rank));
    if (comm.device() != expected) {
        throw rank_error("custody: rank " + std::to_string(rank.rank) + " would bind device " +
                         std::to_string(expected) + " but its communicator lives on device " +
                         std::to_string(comm.device()));
    }
    claim_exchange_over exchange(comm);
    return interop::bind_device<custody::cuda::platform>(rank, exchange, options);
}

} // namespace custody::interop::nccl
