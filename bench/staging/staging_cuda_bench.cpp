// The staging ring on the cuda platform, side by side with the raw CUDA baselines in one run,
// 4 KiB .. 256 MiB (wall time, each iteration ends with the stream synchronized):
//
//   staging/cuda_upload/<peer>/<bytes>
//     ceiling               cudaMemcpyAsync from pinned memory
//     memcpy_pageable       cudaMemcpy from pageable memory
//     memcpy_async_pageable cudaMemcpyAsync from pageable memory
//     ring_pageable         copy_to_device from pageable memory through the ring
//     ring_in_place         reserve + commit, the data produced in the ring
//   staging/cuda_download/<peer>/<bytes>
//     ceiling               cudaMemcpyAsync to pinned memory
//     memcpy_pageable       cudaMemcpy to pageable memory
//     memcpy_async_pageable cudaMemcpyAsync to pageable memory
//     ring_pageable         copy_from_device to pageable memory through the ring
//
// Without a CUDA device it says so and exits 0. CUSTODY_BENCH_SHORT=1 keeps to sizes up to 1 MiB.
#include <custody/platform/cuda.hpp>
#include <custody/staging/staging_ring.hpp>

#include "../../tests/support/cuda_pinned_host.hpp"
#include "ratio_reporter.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

using custody::cuda::platform;
using ring_t = custody::staging::staging_ring<custody::test::cuda_pinned_host>;

constexpr std::size_t ring_capacity = std::size_t{64} << 20;
constexpr std::size_t ring_chunk = std::size_t{2} << 20;

ring_t& shared_ring() {
    static ring_t ring([] {
        custody::staging::ring_options o;
        o.capacity = ring_capacity;
        o.chunk_bytes = ring_chunk;
        return o;
    }());
    return ring;
}

custody::cuda::stream& shared_stream() {
    static custody::cuda::stream s(0);
    return s;
}

struct device_buffer {
    void* ptr = nullptr;
    explicit device_buffer(std::size_t n) {
        CUSTODY_CUDA_TRY(cudaMalloc(&ptr, n));
        CUSTODY_CUDA_TRY(cudaMemset(ptr, 0, n)); // legacy stream: finished before non-blocking streams copy
        CUSTODY_CUDA_TRY(cudaDeviceSynchronize());
    }
    ~device_buffer() { CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFree(ptr)); }
    device_buffer(const device_buffer&) = delete;
    device_buffer& operator=(const device_buffer&) = delete;
};

struct pinned_buffer {
    std::byte* ptr = nullptr;
    std::size_t bytes;
    explicit pinned_buffer(std::size_t n) : bytes(n) {
        ptr = static_cast<std::byte*>(custody::test::cuda_pinned_host{}.allocate_sync(n, 256));
        std::memset(ptr, 1, n);
    }
    ~pinned_buffer() { custody::test::cuda_pinned_host{}.deallocate_sync(ptr, bytes, 256); }
    pinned_buffer(const pinned_buffer&) = delete;
    pinned_buffer& operator=(const pinned_buffer&) = delete;
};

using body = std::function<void(std::byte* host, void* device, std::size_t n, cudaStream_t s)>;

/// Runs `step` per iteration over a host buffer (pinned or pageable) and a device buffer of n bytes.
void run(benchmark::State& state, std::size_t n, bool pinned, const body& step) {
    device_buffer dev(n);
    std::unique_ptr<pinned_buffer> pin;
    std::vector<std::byte> pageable;
    std::byte* host = nullptr;
    if (pinned) {
        pin = std::make_unique<pinned_buffer>(n);
        host = pin->ptr;
    } else {
        pageable.assign(n, std::byte{1});
        host = pageable.data();
    }
    const cudaStream_t s = shared_stream().view().get();
    step(host, dev.ptr, n, s); // warm up: first-touch, mappings
    CUSTODY_CUDA_TRY(cudaStreamSynchronize(s));
    for (auto _ : state) {
        step(host, dev.ptr, n, s);
        CUSTODY_CUDA_TRY(cudaStreamSynchronize(s));
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
}

void register_all(std::size_t max_size) {
    struct peer {
        const char* scenario;
        const char* name;
        bool pinned;
        body step;
    };
    const std::vector<peer> peers = {
        {"staging/cuda_upload", "ceiling", true,
         [](std::byte* h, void* d, std::size_t n, cudaStream_t s) {
             CUSTODY_CUDA_TRY(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
         }},
        {"staging/cuda_upload", "memcpy_pageable", false,
         [](std::byte* h, void* d, std::size_t n, cudaStream_t) {
             CUSTODY_CUDA_TRY(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
         }},
        {"staging/cuda_upload", "memcpy_async_pageable", false,
         [](std::byte* h, void* d, std::size_t n, cudaStream_t s) {
             CUSTODY_CUDA_TRY(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
         }},
        {"staging/cuda_upload", "ring_pageable", false,
         [](std::byte* h, void* d, std::size_t n, cudaStream_t s) {
             shared_ring().copy_to_device(std::span<const std::byte>(h, n), static_cast<std::byte*>(d), s);
         }},
        {"staging/cuda_upload", "ring_in_place", false,
         [](std::byte*, void* d, std::size_t n, cudaStream_t s) {
             auto* dst = static_cast<std::byte*>(d);
             for (std::size_t done = 0; done < n;) {
                 const std::size_t k = std::min(ring_chunk, n - done);
                 shared_ring().commit(shared_ring().reserve<std::byte>(k), dst + done, s);
                 done += k;
             }
         }},
        {"staging/cuda_download", "ceiling", true,
         [](std::byte* h, void* d, std::size_t n, cudaStream_t s) {
             CUSTODY_CUDA_TRY(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
         }},
        {"staging/cuda_download", "memcpy_pageable", false,
         [](std::byte* h, void* d, std::size_t n, cudaStream_t) {
             CUSTODY_CUDA_TRY(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
         }},
        {"staging/cuda_download", "memcpy_async_pageable", false,
         [](std::byte* h, void* d, std::size_t n, cudaStream_t s) {
             CUSTODY_CUDA_TRY(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
         }},
        {"staging/cuda_download", "ring_pageable", false,
         [](std::byte* h, void* d, std::size_t n, cudaStream_t s) {
             shared_ring().copy_from_device(static_cast<const std::byte*>(d), std::span<std::byte>(h, n), s);
         }},
    };
    for (std::size_t n = 4096; n <= max_size; n *= 16) {
        for (const peer& p : peers) {
            const std::string name = std::string(p.scenario) + "/" + p.name + "/" + std::to_string(n);
            benchmark::RegisterBenchmark(name.c_str(), [n, p](benchmark::State& st) { run(st, n, p.pinned, p.step); })
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
        }
    }
}

} // namespace

int main(int argc, char** argv) {
    if (custody::cuda::device_count() == 0) {
        std::printf("bench_staging_cuda: no CUDA device; nothing to measure\n");
        return 0;
    }
    const char* short_env = std::getenv("CUSTODY_BENCH_SHORT");
    const bool short_mode = short_env != nullptr && std::string(short_env) == "1";
    register_all(short_mode ? (std::size_t{1} << 20) : (std::size_t{256} << 20));
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    custody::bench::ratio_reporter reporter({"ceiling", "memcpy_pageable", "memcpy_async_pageable"});
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return 0;
}
