/// @file
/// NCCL communicators as owning handles that claim their GPU before NCCL sees it, the all-gather
/// that lets bind_device check device claims over a communicator, and GPU identities (UUIDs).
#pragma once

#include <custody/core/error.hpp>
#include <custody/core/rank.hpp>
#include <custody/interop/bind_device.hpp>
#include <custody/interop/device_lock.hpp>
#include <custody/interop/gpu_name.hpp>
#include <custody/interop/nccl/detail/all_gather.hpp>
#include <custody/platform/cuda.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace custody::interop::nccl {

/// The UUID of CUDA device `device` as nvidia-smi prints it ("GPU-8-4-4-4-12 hex digits",
/// interop/gpu_name.hpp): the identity two processes compare, whatever ordinals
/// CUDA_VISIBLE_DEVICES gave them.
[[nodiscard]] inline std::string device_uuid(int device) {
    cudaDeviceProp prop{};
    CUSTODY_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
    unsigned char bytes[16];
    std::memcpy(bytes, prop.uuid.bytes, sizeof bytes);
    return gpu_name(bytes);
}

/// A fresh unique id for ncclCommInitRank; created by one rank and sent to the others out of band.
[[nodiscard]] inline ncclUniqueId make_unique_id() {
    ncclUniqueId id{};
    CUSTODY_NCCL_TRY(ncclGetUniqueId(&id));
    return id;
}

/// An owning NCCL communicator on one device.
///
/// Construction first claims the device for this process (a device_lock on the GPU's UUID, see
/// interop/device_lock.hpp): a second process of the host on the same GPU fails at once with
/// duplicate_device_error naming both ranks and the holder's process, before ncclCommInitRank
/// (which would fail with "Duplicate GPU detected", or wait for the missing rank). The ranks that
/// got their claim wait in ncclCommInitRank until the launcher stops them. Several communicators of
/// one process on one GPU share the claim. Then ncclCommInitRank is collective (every rank of
/// `world_size` must construct its own with the same id) and runs with `device` current, restoring
/// the caller's device. Destruction calls ncclCommDestroy on that device, then drops the claim;
/// failures there are reported through custody's callback, never thrown.
/// Ownership: move-only; a moved-from communicator owns nothing (get() == nullptr).
/// Thread safety: as NCCL's: one communicator must not be used by two threads at once.
/// Stream semantics: collectives run on the stream the caller passes to NCCL.
class communicator {
public:
    /// Joins the communicator `id` as `rank` of `world_size`, on `device`. Throws
    /// duplicate_device_error when another process of the host holds the GPU, rank_error when the
    /// claim cannot be taken (device_lock_options), nccl_error / cuda_error.
    communicator(const ncclUniqueId& id, int rank, int world_size, int device,
                 const device_lock_options& lock_options = {})
        : lock_(device_lock::claim(device_uuid(device), rank, device, lock_options)), device_(device) {
        custody::cuda::device_guard guard(device);
        CUSTODY_NCCL_TRY(ncclCommInitRank(&comm_, world_size, id, rank));
        rank_ = rank;
        size_ = world_size;
    }

    /// Joins as described by `rank` (rank and world size), on `device`.
    communicator(const ncclUniqueId& id, const rank_info& rank, int device, const device_lock_options& lock_options = {})
        : communicator(id, rank.rank, rank.world_size, device, lock_options) {}

    /// Takes ownership of an initialized `comm` (which must have been made on `device`). Claims
    /// nothing: NCCL has already seen the device.
    static communicator adopt(ncclComm_t comm, int device) {
        communicator c;
        c.comm_ = comm;
        c.device_ = device;
        CUSTODY_NCCL_TRY(ncclCommUserRank(comm, &c.rank_));
        CUSTODY_NCCL_TRY(ncclCommCount(comm, &c.size_));
        return c;
    }

    communicator(communicator&& other) noexcept
        : lock_(std::move(other.lock_)), comm_(std::exchange(other.comm_, nullptr)), device_(other.device_),
          rank_(other.rank_), size_(other.size_) {}
    communicator& operator=(communicator&& other) noexcept {
        if (this != &other) {
            reset();
            lock_ = std::move(other.lock_);
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

    /// The claim on the device (empty for an adopted communicator).
    [[nodiscard]] const device_lock& claim() const noexcept { return lock_; }

    /// Gives up ownership: the caller destroys the returned communicator. The claim on the device
    /// stays with this handle until it is destroyed.
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

    device_lock lock_; // declared first: released after the communicator is destroyed
    ncclComm_t comm_ = nullptr;
    int device_ = -1;
    int rank_ = -1;
    int size_ = 0;
};

/// All-gathers device claims over a communicator (one ncclAllGather of sizeof(device_claim) bytes
/// per rank through temporary device memory on the communicator's device), for bind_device.
/// Collective; blocks until the gather has finished. Thread safety: as the communicator.
class claim_exchange_over {
public:
    explicit claim_exchange_over(communicator& comm) noexcept : comm_(&comm) {}

    std::vector<device_claim> all_gather(const device_claim& mine) {
        custody::cuda::stream stream(comm_->device());
        std::vector<char> slot(sizeof(device_claim));
        std::memcpy(slot.data(), &mine, sizeof mine);
        const std::vector<char> bytes = detail::all_gather_bytes(slot, comm_->get(), stream.view().get());
        std::vector<device_claim> all(bytes.size() / sizeof(device_claim));
        std::memcpy(all.data(), bytes.data(), all.size() * sizeof(device_claim));
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
