// A minimal cudaMalloc leaf for the pool's cuda test and benchmark: the pool needs an upstream on
// the cuda platform, and this one keeps them independent of the library's own cuda leaves.
#pragma once

#include <custody/platform/cuda.hpp>
#include <custody/resource/detail/leaf.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace custody::test {

/// cudaMalloc/cudaFree on one device. Frees are synchronous (cudaFree waits for the device), which
/// is what stream-ordered semantics need at the least. Maximum alignment 256 (cudaMalloc's).
class cuda_device_memory final : public custody::resource::detail::leaf<cuda_device_memory, cuda::platform> {
public:
    static constexpr const char* name = "cuda_device_memory";
    static constexpr std::size_t max_alignment = 256;
    static constexpr bool interchangeable = true;

    explicit cuda_device_memory(int device = 0) noexcept : leaf(device) {}

    void* raw_allocate_sync(std::size_t bytes, std::size_t) noexcept {
        void* p = nullptr;
        cuda::detail::on_device_noexcept(device(), [&] {
            if (cudaMalloc(&p, bytes) != cudaSuccess) {
                static_cast<void>(cudaGetLastError());
                p = nullptr;
            }
        });
        return p;
    }
    void raw_deallocate_sync(void* ptr, std::size_t, std::size_t) noexcept {
        cuda::detail::on_device_noexcept(device(), [&] { CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFree(ptr)); });
    }
    void* raw_allocate(stream_type, std::size_t bytes, std::size_t alignment) noexcept {
        return raw_allocate_sync(bytes, alignment);
    }
    void raw_deallocate(stream_type, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        raw_deallocate_sync(ptr, bytes, alignment);
    }
};

} // namespace custody::test
