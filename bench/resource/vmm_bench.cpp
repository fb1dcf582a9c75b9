// virtual_memory on the host platform against its peers, side by side in one run: one allocate +
// deallocate pair of one granule (the resource's granule is the size asked for), 4 KiB .. 2 MiB,
// and of sixteen 4 KiB granules (`granules16`), each mapped and unmapped alone. Peers: host_memory
// (the global operator new, which keeps freed memory cached) and a bare mmap + munmap (memory that
// goes back to the system, as virtual_memory's does). `touched` variants write one byte a page, so the cost of the pages'
// faults is counted too. Names are <scenario>/<peer>/<bytes>.
#include <custody/platform/host_vmm.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/virtual_memory.hpp>

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace {

constexpr std::size_t page = 4096;

void touch(void* p, std::size_t n) {
    auto* bytes = static_cast<volatile unsigned char*>(p);
    for (std::size_t i = 0; i < n; i += page) bytes[i] = 1;
}

/// One allocate + deallocate pair through the resource `make(bytes)` returns.
template <bool Touch, class Make>
void pair_resource(benchmark::State& state, Make make) {
    const auto n = static_cast<std::size_t>(state.range(0));
    auto r = make(n);
    for (auto _ : state) {
        void* p = r->allocate_sync(n, 256);
        if constexpr (Touch) touch(p, n);
        benchmark::DoNotOptimize(p);
        r->deallocate_sync(p, n, 256);
    }
    state.SetItemsProcessed(state.iterations());
}

using host_vm = custody::resource::virtual_memory<custody::host::vmm>;

/// One granule per pair: the granule is the size asked for.
auto one_granule = [](std::size_t n) {
    return std::make_unique<host_vm>(
        0, std::size_t{1} << 30, custody::resource::reservation_options{.granule = n, .exportable = false, .peers = {}});
};
/// Pages as granules: a block of n bytes is n / 4096 granules.
auto page_granules = [](std::size_t) { return std::make_unique<host_vm>(0, std::size_t{1} << 30); };
auto host_memory = [](std::size_t) { return std::make_unique<custody::resource::host_memory>(); };

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

} // namespace

int main(int argc, char** argv) {
    for (auto [name, fn] : {std::pair{"pair/virtual_memory", &pair_resource<false, decltype(one_granule)>},
                            std::pair{"touched/virtual_memory", &pair_resource<true, decltype(one_granule)>}}) {
        benchmark::RegisterBenchmark(name, fn, one_granule)->Apply(sizes);
    }
    for (auto [name, fn] : {std::pair{"pair/host_memory", &pair_resource<false, decltype(host_memory)>},
                            std::pair{"touched/host_memory", &pair_resource<true, decltype(host_memory)>}}) {
        benchmark::RegisterBenchmark(name, fn, host_memory)->Apply(sizes);
    }
    benchmark::RegisterBenchmark("pair/mmap", &pair_mmap<false>)->Apply(sizes);
    benchmark::RegisterBenchmark("touched/mmap", &pair_mmap<true>)->Apply(sizes);
    benchmark::RegisterBenchmark("granules16/virtual_memory", &pair_resource<false, decltype(page_granules)>,
                                 page_granules)
        ->Arg(16 * page);
    benchmark::RegisterBenchmark("granules16/mmap", &pair_mmap<false>)->Arg(16 * page);
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
