// The stream-ordered pool against the CUDA allocators on a GPU, side by side in one run: cudaMalloc,
// cudaMallocAsync from a warm pool whose release threshold is the maximum, and CUB's
// CachingDeviceAllocator; and virtual_memory alone (each pair maps and unmaps whole 2 MiB granules,
// memory that goes back to the device as cudaFree's does). One allocate + free pair on a stream,
// 64 B .. 64 MiB, host time.
// Names are pair/<resource>/<bytes>. Without a device it says so and exits cleanly.
#include <custody/platform/cuda.hpp>
#include <custody/platform/cuda_vmm.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/virtual_memory.hpp>

#include <custody/resource/cuda_malloc.hpp>

#include <benchmark/benchmark.h>
#include <cub/util_allocator.cuh>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <memory>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

custody::cuda::stream& bench_stream() {
    static custody::cuda::stream s(0);
    return s;
}

void pair_pool(benchmark::State& state) {
    custody::pool::stream_ordered_pool<custody::resource::cuda_malloc> pool(custody::pool::pool_options{}, 0);
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto s = bench_stream().view();
    pool.deallocate(s, pool.allocate(s, n, 256), n, 256);
    for (auto _ : state) {
        void* p = pool.allocate(s, n, 256);
        benchmark::DoNotOptimize(p);
        pool.deallocate(s, p, n, 256);
    }
    state.SetItemsProcessed(state.iterations());
}

void pair_cuda_malloc(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    for (auto _ : state) {
        void* p = nullptr;
        if (cudaMalloc(&p, n) != cudaSuccess) state.SkipWithError("cudaMalloc failed");
        benchmark::DoNotOptimize(p);
        cudaFree(p);
    }
    state.SetItemsProcessed(state.iterations());
}

void pair_cuda_malloc_async(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto s = bench_stream().view().get();
    cudaMemPool_t mem_pool = nullptr;
    cudaDeviceGetDefaultMemPool(&mem_pool, 0);
    std::uint64_t threshold = UINT64_MAX;
    cudaMemPoolSetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    void* warm = nullptr;
    cudaMallocAsync(&warm, n, s);
    cudaFreeAsync(warm, s);
    cudaStreamSynchronize(s);
    for (auto _ : state) {
        void* p = nullptr;
        if (cudaMallocAsync(&p, n, s) != cudaSuccess) state.SkipWithError("cudaMallocAsync failed");
        benchmark::DoNotOptimize(p);
        cudaFreeAsync(p, s);
    }
    cudaStreamSynchronize(s);
    state.SetItemsProcessed(state.iterations());
}

void pair_cub(benchmark::State& state) {
    // Bins 8^3 (512 B) .. 8^9 (128 MiB), so that every size measured is cached; no cap on the cache.
    cub::CachingDeviceAllocator allocator(8, 3, 9, cub::CachingDeviceAllocator::INVALID_SIZE, false);
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto s = bench_stream().view().get();
    void* warm = nullptr;
    allocator.DeviceAllocate(0, &warm, n, s);
    allocator.DeviceFree(0, warm);
    for (auto _ : state) {
        void* p = nullptr;
        if (allocator.DeviceAllocate(0, &p, n, s) != cudaSuccess) state.SkipWithError("CUB allocation failed");
        benchmark::DoNotOptimize(p);
        allocator.DeviceFree(0, p);
    }
    state.SetItemsProcessed(state.iterations());
}

void pair_virtual_memory(benchmark::State& state) {
    if (!custody::cuda::vmm::supported(0)) {
        state.SkipWithError("device 0 has no virtual memory management");
        return;
    }
    custody::resource::virtual_memory<custody::cuda::vmm> memory(0, std::size_t{8} << 30);
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto s = bench_stream().view();
    for (auto _ : state) {
        void* p = memory.allocate(s, n, 256);
        benchmark::DoNotOptimize(p);
        memory.deallocate(s, p, n, 256);
    }
    state.SetItemsProcessed(state.iterations());
}

} // namespace

int main(int argc, char** argv) {
    if (custody::cuda::device_count() == 0) {
        std::puts("no CUDA device: the pool's cuda benchmarks were not run");
        return 0;
    }
    for (auto [name, fn] : {std::pair{"pair/pool", &pair_pool}, std::pair{"pair/cudaMalloc", &pair_cuda_malloc},
                            std::pair{"pair/cudaMallocAsync", &pair_cuda_malloc_async}, std::pair{"pair/cub_caching", &pair_cub},
                            std::pair{"pair/virtual_memory", &pair_virtual_memory}}) {
        benchmark::RegisterBenchmark(name, fn)->RangeMultiplier(8)->Range(64, 64 * MiB)->UseRealTime();
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
