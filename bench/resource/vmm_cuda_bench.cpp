// virtual_memory on a GPU against the CUDA allocators, side by side in one run: one allocate +
// deallocate pair, 2 MiB (one granule) .. 64 MiB, host time. Peers: cudaMalloc + cudaFree (memory
// that goes back to the device, as virtual_memory's does) and cudaMallocAsync + cudaFreeAsync from
// the default pool with its release threshold at the maximum (memory kept cached).
// Names are pair/<peer>/<bytes>. Without a device it says so and exits cleanly.
#include <custody/platform/cuda.hpp>
#include <custody/platform/cuda_vmm.hpp>
#include <custody/resource/virtual_memory.hpp>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>

namespace {

custody::cuda::stream& bench_stream() {
    static custody::cuda::stream s(0);
    return s;
}

void pair_virtual_memory(benchmark::State& state) {
    custody::resource::virtual_memory<custody::cuda::vmm> r(0, std::size_t{8} << 30);
    const auto n = static_cast<std::size_t>(state.range(0));
    for (auto _ : state) {
        void* p = r.allocate_sync(n, 256);
        benchmark::DoNotOptimize(p);
        r.deallocate_sync(p, n, 256);
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
    for (auto _ : state) {
        void* p = nullptr;
        if (cudaMallocAsync(&p, n, s) != cudaSuccess) state.SkipWithError("cudaMallocAsync failed");
        benchmark::DoNotOptimize(p);
        cudaFreeAsync(p, s);
    }
    cudaStreamSynchronize(s);
    state.SetItemsProcessed(state.iterations());
}

void sizes(benchmark::internal::Benchmark* b) {
    for (std::int64_t mib : {2, 16, 64}) b->Arg(mib << 20);
}

} // namespace

BENCHMARK(pair_virtual_memory)->Name("pair/virtual_memory")->Apply(sizes);
BENCHMARK(pair_cuda_malloc)->Name("pair/cuda_malloc")->Apply(sizes);
BENCHMARK(pair_cuda_malloc_async)->Name("pair/cuda_malloc_async")->Apply(sizes);

int main(int argc, char** argv) {
    if (custody::cuda::device_count() == 0 || !custody::cuda::vmm::supported(0)) {
        std::puts("bench_vmm_cuda: no CUDA device with virtual memory management; nothing to measure");
        return 0;
    }
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
