/// @file
/// `pinned_host`: page-locked host memory from cudaHostAlloc, readable by host and devices.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/detail/cuda_leaf.hpp>
#include <custody/resource/detail/over_aligned.hpp>

#include <cstddef>
#include <cstdint>
#include <new>

namespace custody::resource {

/// Page-locked ("pinned") host memory from cudaHostAlloc(cudaHostAllocPortable), so copies to and
/// from any device run asynchronously at full bandwidth. Expensive to allocate (it pins pages):
/// allocate once and reuse, which is what staging::staging_ring does.
///
/// Device binding: allocations are made with the resource's device current (the context they are
/// registered in); the portable flag makes them usable from every device. Stream semantics:
/// cudaHostAlloc is synchronous; deallocate on a stream waits for that stream, then frees.
/// Thread safety: thread-safe. Interchangeable with any pinned_host.
///
/// Alignment: at most 4096 (a page). cudaHostAlloc documents 256 bytes only (every CUDA allocation
/// routine is "aligned to at least 256 bytes"; page alignment is what current drivers happen to
/// return, not a promise). Requests up to 256 go to cudaHostAlloc as they are; a stronger alignment
/// a allocates bytes + a pinned bytes and aligns inside (detail::over_aligned), so the promise holds
/// whatever the driver returns. Statistics count the caller's bytes.
class pinned_host final : public detail::synchronous_cuda_leaf<pinned_host> {
public:
    static constexpr const char* name = "pinned_host";
    static constexpr std::size_t max_alignment = 4096;
    static constexpr bool interchangeable = true;
    /// What cudaHostAlloc guarantees.
    static constexpr std::size_t host_alloc_alignment = 256;

    explicit pinned_host(int device = cuda::current_device()) noexcept : synchronous_cuda_leaf(device) {}

    void* raw_allocate_sync(std::size_t bytes, std::size_t alignment) {
        const std::size_t extra = over::extra(alignment);
        if (bytes > SIZE_MAX - extra) return nullptr;
        cuda::device_guard guard(device());
        void* base = nullptr;
        if (!detail::allocated(cudaHostAlloc(&base, bytes + extra, cudaHostAllocPortable), "cudaHostAlloc")) {
            return nullptr;
        }
        return over::place(base, alignment);
    }
    void raw_deallocate_sync(void* ptr, std::size_t, std::size_t alignment) noexcept {
        cuda::device_guard guard(device(), std::nothrow);
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFreeHost(over::base_of(ptr, alignment)));
    }

    friend void get_property(const pinned_host&, host_accessible) noexcept {}
    friend void get_property(const pinned_host&, device_accessible) noexcept {}

private:
    using over = detail::over_aligned<host_alloc_alignment>;
};

static_assert(try_allocatable_resource<pinned_host>);

} // namespace custody::resource
