/// @file
/// `managed`: unified memory from cudaMallocManaged, accessible from host and devices.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/detail/cuda_leaf.hpp>

#include <cstddef>
#include <new>

namespace custody::resource {

/// Unified memory from cudaMallocManaged(cudaMemAttachGlobal), migrated on demand between host and
/// devices.
///
/// Safety limit: a request larger than the device's total memory is refused as exhaustion
/// (custody::out_of_memory) before it reaches the driver, because oversubscribing managed memory
/// can stall the whole GPU rather than fail the call.
/// Device binding: allocations are made with the resource's device current. Stream semantics:
/// cudaMallocManaged is synchronous; deallocate on a stream waits for that stream, then frees.
/// Thread safety: thread-safe. Alignment: at most 256. Interchangeable with any managed resource
/// of the same device.
class managed final : public detail::synchronous_cuda_leaf<managed> {
public:
    static constexpr const char* name = "managed";
    static constexpr std::size_t max_alignment = 256;
    static constexpr bool interchangeable = true;

    explicit managed(int device = cuda::current_device()) : synchronous_cuda_leaf(device) {
        cuda::device_guard guard(device);
        std::size_t free_bytes = 0;
        CUSTODY_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_));
    }

    /// The largest request this resource passes to the driver: the device's total memory.
    [[nodiscard]] std::size_t limit() const noexcept { return total_; }

    void* raw_allocate_sync(std::size_t bytes, std::size_t) {
        if (bytes > total_) return nullptr;
        cuda::device_guard guard(device());
        void* ptr = nullptr;
        return detail::allocated(cudaMallocManaged(&ptr, bytes, cudaMemAttachGlobal), "cudaMallocManaged") ? ptr
                                                                                                            : nullptr;
    }
    void raw_deallocate_sync(void* ptr, std::size_t, std::size_t) noexcept {
        cuda::device_guard guard(device(), std::nothrow);
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFree(ptr));
    }

    friend void get_property(const managed&, host_accessible) noexcept {}
    friend void get_property(const managed&, device_accessible) noexcept {}

private:
    std::size_t total_ = 0;
};

static_assert(try_allocatable_resource<managed>);

} // namespace custody::resource
