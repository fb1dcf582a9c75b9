// virtual_memory on the host platform against its peers, side by side in one run: one allocate +
// deallocate pair of one granule (the resource's granule is the size asked for), 4 KiB .. 2 MiB,
// and of 16 granules of 4 KiB (`granules16`), where each granule is mapped and unmapped alone. Peers: host_memory (the global operator new,
// which keeps freed memory cached) and a bare mmap + munmap (memory that goes back to the system,
// as virtual_memory's does). `touched` variants write one byte a page, so the cost of the pages'
// faults is counted too. Names are <scenario>/<peer>/<bytes>.
#include <custody/platform/host_vmm.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/virtual_memory.hpp>

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstddef>

namespace {

constexpr std::size_t page = 4096;

void touch(void* p, std::size_t n) {
    auto* bytes = static_cast<volatile unsigned char*>(p);
    for (std::size_t i = 0; i < n; i += page) bytes[i] = 1;
}

template <bool Touch>
void pair_virtual_memory(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    custody::resource::virtual_memory<custody::host::vmm> r(
        0, std::size_t{1} << 30, custody::resource::reservation_options{.granule = n, .exportable = false, .peers = {}});
    for (auto _ : state) {
        void* p = r.allocate_sync(n, 256);
        if constexpr (Touch) touch(p, n);
        benchmark::DoNotOptimize(p);
        r.deallocate_sync(p, n, 256);
    }
    state.SetItemsProcessed(state.iterations());
}

template <bool Touch>
void pair_host_memory(benchmark::State& state) {
    custody::resource::host_memory r;
    const auto n = static_cast<std::size_t>(state.range(0));
    for (auto _ : state) {
        void* p = r.allocate_sync(n, 256);
        if constexpr (Touch) touch(p, n);
        benchmark::DoNotOptimize(p);
        r.deallocate_sync(p, n, 256);
    }
    state.SetItemsProcessed(state.iterations());
}

template <bool Touch>
void pair_mmap(benchmark::State& state) {
    const auto n = static_cast<std::size_t>(state.range(0));
    for (auto _ : state) {
        void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) state.SkipWithError("mmap failed");
        if constexpr (Touch) touch(p, n);
        benchmark::DoNotOptimize(p);
        ::munmap(p, n);
    }
    state.SetItemsProcessed(state.iterations());
}

void sizes(benchmark::internal::Benchmark* b) {
    for (std::size_t n : {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{2} << 20}) {
        b->Arg(static_cast<std::int64_t>(n));
    }
}

void granules16_virtual_memory(benchmark::State& state) {
    custody::resource::virtual_memory<custody::host::vmm> r(0, std::size_t{1} << 30);
    const std::size_t n = 16 * page;
    for (auto _ : state) {
        void* p = r.allocate_sync(n, 256);
        benchmark::DoNotOptimize(p);
        r.deallocate_sync(p, n, 256);
    }
    state.SetItemsProcessed(state.iterations());
}

} // namespace

BENCHMARK(pair_virtual_memory<false>)->Name("pair/virtual_memory")->Apply(sizes);
BENCHMARK(pair_host_memory<false>)->Name("pair/host_memory")->Apply(sizes);
BENCHMARK(pair_mmap<false>)->Name("pair/mmap")->Apply(sizes);
BENCHMARK(pair_virtual_memory<true>)->Name("touched/virtual_memory")->Apply(sizes);
BENCHMARK(pair_host_memory<true>)->Name("touched/host_memory")->Apply(sizes);
BENCHMARK(pair_mmap<true>)->Name("touched/mmap")->Apply(sizes);

BENCHMARK(granules16_virtual_memory)->Name("granules16/virtual_memory/65536");
BENCHMARK(pair_mmap<false>)->Name("granules16/mmap")->Arg(16 * page);

BENCHMARK_MAIN();
