// What the pool's NVTX annotations cost a pair when no tool is attached: this file is compiled twice
// into bench_pool, once with the annotations compiled in (NVTX's header found, no tool listening)
// and once with them compiled out (CUSTODY_NVTX_COST_OUT: CUSTODY_DISABLE_NVTX), so that both run
// from the same code, side by side in one run:
//
//   pair/pool_nvtx/<bytes>             one allocate + free, single thread (as pair/pool)
//   pair/pool_without_nvtx/<bytes>     the same, annotations compiled out
//   pair_mt/pool_nvtx/256/threads:N    as pair_mt/pool
//   pair_mt/pool_without_nvtx/256/threads:N
//
// Two shapes of one type would break the one-definition rule (and the linker would run one shape
// for both), so each compilation puts custody under a namespace name of its own: `custody` is a
// macro here, custody_nvtx_in or custody_nvtx_out.
#ifdef CUSTODY_NVTX_COST_OUT
#define CUSTODY_DISABLE_NVTX
#define custody custody_nvtx_out
#define CUSTODY_COST_NAME "pool_without_nvtx"
#else
#define custody custody_nvtx_in
#define CUSTODY_COST_NAME "pool_nvtx"
#endif
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>

namespace variant = custody;
#undef custody

#include <benchmark/benchmark.h>

#include <cstddef>
#include <string>
#include <vector>

namespace {

using pool_type = variant::pool::stream_ordered_pool<variant::resource::host_memory>;
#ifdef CUSTODY_NVTX_COST_OUT
static_assert(!variant::detail::nvtx_compiled);
#endif
constexpr std::size_t alignment = 256;
constexpr std::size_t MiB = std::size_t{1} << 20;

variant::host::stream_view stream_of(int thread) {
    static std::vector<variant::host::stream> streams = [] {
        std::vector<variant::host::stream> v;
        for (int i = 0; i < 8; ++i) v.emplace_back(0);
        return v;
    }();
    return streams[static_cast<std::size_t>(thread) % streams.size()].view();
}

variant::pool::pool_options unchecked() {
    variant::pool::pool_options o;
    o.checked = false;
    return o;
}

void pair(benchmark::State& state) {
    pool_type pool(unchecked());
    const auto stream = stream_of(0);
    const auto n = static_cast<std::size_t>(state.range(0));
    pool.deallocate(stream, pool.allocate(stream, n, alignment), n, alignment); // warm: growth is not measured
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
    const std::string name = CUSTODY_COST_NAME;
    benchmark::RegisterBenchmark(("pair/" + name).c_str(), pair)->RangeMultiplier(8)->Range(64, 64 * MiB);
    benchmark::RegisterBenchmark(("pair_mt/" + name).c_str(), pair_mt)->Arg(256)->ThreadRange(1, 8)->UseRealTime();
    return true;
}();

} // namespace
