/// @file
/// `pinned_host`: page-locked host memory from cudaHostAlloc, readable by host and devices.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/detail/cuda_leaf.hpp>

#include <cstddef>
#include <new>

namespace custody::resource {

/// Page-locked ("pinned") host memory from cudaHostAlloc(cudaHostAllocPortable), so copies to and
/// from any device run asynchronously at full bandwidth. Expensive to allocate (it pins pages):
/// allocate once and reuse, which is what staging::staging_ring does.
///
/// Device binding: allocations are made with the resource's device current (the context they are
/// registered in); the portable flag makes them usable from every device. Stream semantics:
/// cudaHostAlloc is synchronous; deallocate on a stream waits for that stream, then frees.
/// Thread safety: thread-safe. Alignment: at most 4096 (a page). Interchangeable with any
/// pinned_host.
class pinned_host final : public detail::synchronous_cuda_leaf<pinned_host> {
public:
    static constexpr const char* name = "pinned_host";
    static constexpr std::size_t max_alignment = 4096;
    static constexpr bool interchangeable = true;

    explicit pinned_host(int device = cuda::current_device()) noexcept : synchronous_cuda_leaf(device) {}

    void* raw_allocate_sync(std::size_t bytes, std::size_t) {
        cuda::device_guard guard(device());
        void* ptr = nullptr;
        return detail::allocated(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable), "cudaHostAlloc") ? ptr : nullptr;
    }
    void raw_deallocate_sync(void* ptr, std::size_t, std::size_t) noexcept {
        cuda::device_guard guard(device(), std::nothrow);
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFreeHost(ptr));
    }

    friend void get_property(const pinned_host&, host_accessible) noexcept {}
    friend void get_property(const pinned_host&, device_accessible) noexcept {}
};

static_assert(try_allocatable_resource<pinned_host>);

} // namespace custody::resource
