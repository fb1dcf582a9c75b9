// capture_ops for the cuda platform: device memory with a pinned host copy, host function nodes
// (cudaLaunchHostFunc), and the runtime's error names.
#pragma once

#include "capture_cases.hpp"

#include <custody/core/error.hpp>
#include <custody/platform/cuda.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <string>

namespace custody_test {

template <>
struct capture_ops<custody::cuda::platform> {
    using stream_view = custody::cuda::stream_view;

    /// `n` bytes of device memory that captured work writes, and pinned host memory it copies to.
    class memory {
    public:
        explicit memory(std::size_t n) : size_(n) {
            void* device = nullptr;
            void* host = nullptr;
            CUSTODY_CUDA_TRY(cudaMalloc(&device, n));
            if (cudaMallocHost(&host, n) != cudaSuccess) {
                static_cast<void>(cudaGetLastError());
                static_cast<void>(cudaFree(device));
                throw custody::error("cudaMallocHost failed");
            }
            device_ = static_cast<unsigned char*>(device);
            host_ = static_cast<unsigned char*>(host);
            std::fill(host_, host_ + n, static_cast<unsigned char>(0xEE));
            CUSTODY_CUDA_TRY(cudaMemset(device_, 0xEE, n));
        }
        memory(const memory&) = delete;
        memory& operator=(const memory&) = delete;
        ~memory() {
            static_cast<void>(cudaFree(device_));
            static_cast<void>(cudaFreeHost(host_));
        }
        [[nodiscard]] unsigned char* device() noexcept { return device_; }
        [[nodiscard]] const unsigned char* host() const noexcept { return host_; }
        [[nodiscard]] unsigned char* host_target() noexcept { return host_; }
        [[nodiscard]] std::size_t size() const noexcept { return size_; }

    private:
        std::size_t size_;
        unsigned char* device_ = nullptr;
        unsigned char* host_ = nullptr;
    };

    static void bump(stream_view s, std::atomic<int>& counter) {
        CUSTODY_CUDA_TRY(cudaLaunchHostFunc(
            s.get(), [](void* c) { static_cast<std::atomic<int>*>(c)->fetch_add(1); }, &counter));
    }

    template <class F>
    static std::string violation(F&& f) {
        try {
            f();
        } catch (const custody::cuda_error& e) {
            return e.error_name();
        }
        return {};
    }
};

} // namespace custody_test
