/// @file
/// `cuda_async`: stream-ordered device memory from cudaMallocAsync on a device's memory pool.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/detail/cuda_leaf.hpp>

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>

namespace custody::resource {

/// Device memory from cudaMallocFromPoolAsync/cudaFreeAsync on a device's default memory pool.
///
/// The pool's release threshold is set (by default to the maximum) so that memory freed back to
/// the pool stays there across synchronizations: a warm pool stays warm instead of returning
/// memory to the driver at every cudaStreamSynchronize. The threshold is a property of the
/// device's default pool, shared with every other user of that pool in the process; trim() gives
/// what it retains back to the device (a stream_ordered_pool over it calls it when it trims).
///
/// Device binding: every call runs with the resource's device current. Stream semantics: those of
/// cudaMallocAsync (the driver tracks reuse across streams with its own events); the synchronous
/// pair allocates on the legacy default stream and waits for it. Thread safety: thread-safe.
/// Alignment: at most 256. Interchangeable with any cuda_async of the same device.
class cuda_async final : public detail::leaf<cuda_async, cuda::platform> {
public:
    static constexpr const char* name = "cuda_async";
    static constexpr std::size_t max_alignment = 256;
    static constexpr bool interchangeable = true;
    /// Blocks are ordered on the stream they are allocated on (a pool that grows over it takes its
    /// chunks on a stream of its own and waits for it: pool/detail/chunked_growth.hpp).
    static constexpr bool allocates_in_stream_order = true;

    /// Uses `device`'s default pool and sets its release threshold. Throws custody::error if the
    /// device does not support memory pools, custody::cuda_error if a call fails.
    explicit cuda_async(int device = cuda::current_device(), std::uint64_t release_threshold = UINT64_MAX)
        : leaf(device) {
        cuda::device_guard guard(device);
        int supported = 0;
        CUSTODY_CUDA_TRY(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
        if (supported == 0) {
            throw error("custody: device " + std::to_string(device) + " does not support cudaMallocAsync pools");
        }
        CUSTODY_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool_, device));
        CUSTODY_CUDA_TRY(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &release_threshold));
    }

    [[nodiscard]] cudaMemPool_t pool_handle() const noexcept { return pool_; }

    /// Bytes the driver pool holds beyond its live allocations (ReservedMemCurrent minus
    /// UsedMemCurrent): memory given back that the rest of the device (NCCL, cuBLAS, cudaMalloc)
    /// cannot use until trim(). 0 if the query fails.
    [[nodiscard]] std::size_t retained_bytes() const noexcept {
        std::uint64_t reserved = 0; // cuuint64_t
        std::uint64_t used = 0;
        if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
            cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
            static_cast<void>(cudaGetLastError());
            return 0;
        }
        return reserved > used ? static_cast<std::size_t>(reserved - used) : 0;
    }

    /// Gives what the driver pool retains back to the device (cudaMemPoolTrimTo(pool, 0)), once
    /// the frees enqueued on the device's legacy stream have run; returns the bytes given back.
    /// Blocks while the legacy stream finishes. Throws custody::cuda_error.
    std::size_t trim() {
        cuda::device_guard guard(device());
        CUSTODY_CUDA_TRY(cudaStreamSynchronize(nullptr));
        const std::size_t before = retained_bytes();
        CUSTODY_CUDA_TRY(cudaMemPoolTrimTo(pool_, 0));
        const std::size_t after = retained_bytes();
        return before > after ? before - after : 0;
    }

    void* raw_allocate(stream_type stream, std::size_t bytes, std::size_t) {
        cuda::device_guard guard(device());
        void* ptr = nullptr;
        return detail::allocated(cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream.get()), "cudaMallocFromPoolAsync")
                   ? ptr
                   : nullptr;
    }
    void raw_deallocate(stream_type stream, void* ptr, std::size_t, std::size_t) noexcept {
        cuda::device_guard guard(device(), std::nothrow);
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFreeAsync(ptr, stream.get()));
    }
    void* raw_allocate_sync(std::size_t bytes, std::size_t alignment) {
        void* ptr = raw_allocate(stream_type{}, bytes, alignment);
        if (ptr != nullptr) {
            const cudaError_t status = cudaStreamSynchronize(nullptr);
            if (status != cudaSuccess) {
                raw_deallocate(stream_type{}, ptr, bytes, alignment);
                CUSTODY_CUDA_TRY(status);
            }
        }
        return ptr;
    }
    void raw_deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        raw_deallocate(stream_type{}, ptr, bytes, alignment);
    }

    friend void get_property(const cuda_async&, device_accessible) noexcept {}

private:
    cudaMemPool_t pool_ = nullptr;
};

static_assert(try_allocatable_resource<cuda_async>);

} // namespace custody::resource
