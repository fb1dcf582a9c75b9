/// @file
/// `cuda_malloc`: device memory from cudaMalloc, bound to one device.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/detail/cuda_leaf.hpp>

#include <cstddef>
#include <new>

namespace custody::resource {

/// Device memory from cudaMalloc/cudaFree on one device.
///
/// Device binding: every call runs with the resource's device current, whatever the calling
/// thread has current, and restores it. Stream semantics: cudaMalloc is synchronous, so memory is
/// usable by work on any stream at once; deallocate on a stream first waits for that stream (the
/// memory may still be in use by work enqueued on it), then frees. Prefer a pool on top: every call
/// here is a driver call. Thread safety: thread-safe. Alignment: at most 256 (what cudaMalloc
/// guarantees). Interchangeable with any cuda_malloc of the same device.
class cuda_malloc final : public detail::synchronous_cuda_leaf<cuda_malloc> {
public:
    static constexpr const char* name = "cuda_malloc";
    static constexpr std::size_t max_alignment = 256;
    static constexpr bool interchangeable = true;

    explicit cuda_malloc(int device = cuda::current_device()) noexcept : synchronous_cuda_leaf(device) {}

    void* raw_allocate_sync(std::size_t bytes, std::size_t) {
        cuda::device_guard guard(device());
        void* ptr = nullptr;
        return detail::allocated(cudaMalloc(&ptr, bytes), "cudaMalloc") ? ptr : nullptr;
    }
    void raw_deallocate_sync(void* ptr, std::size_t, std::size_t) noexcept {
        cuda::device_guard guard(device(), std::nothrow);
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFree(ptr));
    }

    friend void get_property(const cuda_malloc&, device_accessible) noexcept {}
};

static_assert(try_allocatable_resource<cuda_malloc>);
static_assert(has_property<cuda_malloc, device_accessible>);

} // namespace custody::resource
