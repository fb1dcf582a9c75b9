// What tracking costs: an allocate+deallocate pair through tracking_resource (ledger only; with
// canaries and poison; with call stacks) side by side with the untracked upstream, in one run.
// Names: tracking_overhead/<resource>/<bytes>. The overhead is the difference of the pairs' times.
#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/host_memory.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>

namespace {

using custody::debug::policy;
using custody::debug::tracking_options;
using custody::debug::tracking_resource;
using custody::resource::host_memory;

tracking_options options(bool canaries_and_poison, bool stacks) {
    tracking_options o;
    o.rank = custody::rank_info{};
    o.canaries = canaries_and_poison;
    o.poison = canaries_and_poison;
    o.capture_stacks = stacks;
    o.on_leak = policy::log;
    return o;
}

template <class R>
void pair_loop(benchmark::State& state, R& r) {
    const auto bytes = static_cast<std::size_t>(state.range(0));
    for (auto _ : state) {
        void* p = r.allocate({}, bytes, 256);
        benchmark::DoNotOptimize(p);
        r.deallocate({}, p, bytes, 256);
    }
    state.SetItemsProcessed(state.iterations());
}

void untracked(benchmark::State& state) {
    host_memory r;
    pair_loop(state, r);
}

void tracked_ledger(benchmark::State& state) {
    tracking_resource<host_memory> r(options(false, false));
    pair_loop(state, r);
}

void tracked_canaries_poison(benchmark::State& state) {
    tracking_resource<host_memory> r(options(true, false));
    pair_loop(state, r);
}

void tracked_call_stacks(benchmark::State& state) {
    tracking_resource<host_memory> r(options(false, true));
    pair_loop(state, r);
}

/// Owners and a live working set of 1024 blocks: the ledger's hash map is not empty.
void tracked_ledger_busy(benchmark::State& state) {
    tracking_resource<host_memory> r(options(false, false));
    custody::debug::owner_scope scope("decoder/layer.3/attn");
    void* held[1024];
    for (void*& p : held) p = r.allocate({}, 64, 256);
    pair_loop(state, r);
    for (void* p : held) r.deallocate({}, p, 64, 256);
}

void untracked_busy(benchmark::State& state) {
    host_memory r;
    void* held[1024];
    for (void*& p : held) p = r.allocate({}, 64, 256);
    pair_loop(state, r);
    for (void* p : held) r.deallocate({}, p, 64, 256);
}

} // namespace

BENCHMARK(untracked)->Name("tracking_overhead/host_memory")->Arg(256)->Arg(4096);
BENCHMARK(tracked_ledger)->Name("tracking_overhead/tracking<host_memory>")->Arg(256)->Arg(4096);
BENCHMARK(untracked_busy)->Name("tracking_overhead/host_memory+1024_live")->Arg(256);
BENCHMARK(tracked_ledger_busy)->Name("tracking_overhead/tracking<host_memory>+1024_live")->Arg(256);
BENCHMARK(tracked_canaries_poison)->Name("tracking_overhead/tracking<host_memory>+canaries+poison")->Arg(256)->Arg(4096);
BENCHMARK(tracked_call_stacks)->Name("tracking_overhead/tracking<host_memory>+call_stacks")->Arg(256);

BENCHMARK_MAIN();
