// Small cuda-platform leaf resources for the interop tests: device memory (cudaMallocAsync) and
// memory both sides can touch (cudaMallocManaged), with custody's leaf contract and properties.
#pragma once

#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/detail/leaf.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace custody::test {

/// A minimal cuda-platform leaf (cudaMallocAsync / cudaFreeAsync) with the device_accessible
/// property, standing in for the toolkit resources in this test.
class test_device_memory final
    : public custody::resource::detail::leaf<test_device_memory, custody::cuda::platform> {
public:
    static constexpr const char* name = "test_device_memory";
    static constexpr std::size_t max_alignment = 256;
    static constexpr bool interchangeable = true;

    explicit test_device_memory(int device) noexcept : leaf(device) {}

    void* raw_allocate(stream_type s, std::size_t bytes, std::size_t) noexcept {
        void* p = nullptr;
        if (cudaMallocAsync(&p, bytes, s.get()) != cudaSuccess) {
            static_cast<void>(cudaGetLastError());
            return nullptr;
        }
        return p;
    }
    void raw_deallocate(stream_type s, void* p, std::size_t, std::size_t) noexcept {
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFreeAsync(p, s.get()));
    }
    void* raw_allocate_sync(std::size_t bytes, std::size_t) noexcept {
        void* p = nullptr;
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
            static_cast<void>(cudaGetLastError());
            return nullptr;
        }
        return p;
    }
    void raw_deallocate_sync(void* p, std::size_t, std::size_t) noexcept { CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFree(p)); }

    friend void get_property(const test_device_memory&, custody::device_accessible) noexcept {}
};

/// A cuda-platform resource whose memory both sides can touch (as pinned or managed memory).
class test_managed_memory final
    : public custody::resource::detail::leaf<test_managed_memory, custody::cuda::platform> {
public:
    static constexpr const char* name = "test_managed_memory";
    static constexpr std::size_t max_alignment = 256;
    static constexpr bool interchangeable = true;

    explicit test_managed_memory(int device) noexcept : leaf(device) {}

    void* raw_allocate(stream_type, std::size_t bytes, std::size_t alignment) noexcept {
        return raw_allocate_sync(bytes, alignment);
    }
    void raw_deallocate(stream_type s, void* p, std::size_t bytes, std::size_t alignment) noexcept {
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaStreamSynchronize(s.get()));
        raw_deallocate_sync(p, bytes, alignment);
    }
    void* raw_allocate_sync(std::size_t bytes, std::size_t) noexcept {
        void* p = nullptr;
        if (cudaMallocManaged(&p, bytes) != cudaSuccess) {
            static_cast<void>(cudaGetLastError());
            return nullptr;
        }
        return p;
    }
    void raw_deallocate_sync(void* p, std::size_t, std::size_t) noexcept { CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFree(p)); }

    friend void get_property(const test_managed_memory&, custody::device_accessible) noexcept {}
    friend void get_property(const test_managed_memory&, custody::host_accessible) noexcept {}
};

} // namespace custody::test
