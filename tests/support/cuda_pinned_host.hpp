// A minimal pinned host resource (cudaHostAlloc) for the cuda staging tests and benchmarks, so they
// do not depend on the library's own pinned resource.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/cuda.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace custody::test {

/// Page-locked host memory from cudaHostAlloc (portable: usable from every device).
/// Thread-safe; stateless; any two instances are interchangeable.
struct cuda_pinned_host {
    using stream_type = cuda::stream_view;

    void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        check_alignment(alignment);
        if (bytes == 0) return nullptr;
        void* p = nullptr;
        CUSTODY_CUDA_TRY(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
        return p;
    }
    void deallocate_sync(void* p, std::size_t, std::size_t) noexcept {
        if (p != nullptr) CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFreeHost(p));
    }
    void* allocate(stream_type, std::size_t bytes, std::size_t alignment) { return allocate_sync(bytes, alignment); }
    void deallocate(stream_type s, void* p, std::size_t bytes, std::size_t alignment) noexcept {
        if (p == nullptr) return;
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaStreamSynchronize(s.get()));
        deallocate_sync(p, bytes, alignment);
    }
    friend bool operator==(const cuda_pinned_host&, const cuda_pinned_host&) noexcept { return true; }
    friend void get_property(const cuda_pinned_host&, host_accessible) noexcept {}
};

} // namespace custody::test
