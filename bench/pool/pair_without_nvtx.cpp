// The pool with its NVTX annotations compiled out, in the same program as pool_bench.cpp's pool (which
// has them compiled in, and no tool attached): what the annotations cost a pair when nobody listens.
//
//   pair/pool_without_nvtx/<bytes>          as pair/pool: one allocate + free, single thread
//   pair_mt/pool_without_nvtx/256/threads:N  as pair_mt/pool
//
// The two pools must not be one type in two shapes (that would break the one-definition rule and
// let the linker run one shape for both), so this file compiles custody under another namespace
// name: `custody` is a macro here, and every custody type below is custody_without_nvtx::...
#define CUSTODY_DISABLE_NVTX
#define custody custody_without_nvtx
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#undef custody

#include <benchmark/benchmark.h>

#include <cstddef>
#include <vector>

namespace {

namespace plain = custody_without_nvtx;
using pool_type = plain::pool::stream_ordered_pool<plain::resource::host_memory>;
static_assert(!plain::detail::nvtx_compiled);
constexpr std::size_t alignment = 256;
constexpr std::size_t MiB = std::size_t{1} << 20;

plain::host::stream_view stream_of(int thread) {
    static std::vector<plain::host::stream> streams = [] {
        std::vector<plain::host::stream> v;
        for (int i = 0; i < 8; ++i) v.emplace_back(0);
        return v;
    }();
    return streams[static_cast<std::size_t>(thread) % streams.size()].view();
}

plain::pool::pool_options unchecked() {
    plain::pool::pool_options o;
    o.checked = false;
    return o;
}

void pair(benchmark::State& state) {
    pool_type pool(unchecked());
    const auto stream = stream_of(0);
    const auto n = static_cast<std::size_t>(state.range(0));
    pool.deallocate(stream, pool.allocate(stream, n, alignment), n, alignment); // warm, as pool_bench's pair
    for (auto _ : state) {
        void* p = pool.allocate(stream, n, alignment);
        benchmark::DoNotOptimize(p);
        pool.deallocate(stream, p, n, alignment);
    }
    state.SetItemsProcessed(state.iterations());
}

void pair_mt(benchmark::State& state) {
    static pool_type pool(unchecked());
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto stream = stream_of(state.thread_index());
    for (auto _ : state) {
        void* p = pool.allocate(stream, n, alignment);
        benchmark::DoNotOptimize(p);
        pool.deallocate(stream, p, n, alignment);
    }
    state.SetItemsProcessed(state.iterations());
}

const bool registered = [] {
    benchmark::RegisterBenchmark("pair/pool_without_nvtx", pair)->RangeMultiplier(8)->Range(64, 64 * MiB);
    benchmark::RegisterBenchmark("pair_mt/pool_without_nvtx", pair_mt)->Arg(256)->ThreadRange(1, 8)->UseRealTime();
    return true;
}();

} // namespace
