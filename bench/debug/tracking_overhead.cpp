// What tracking costs: an allocate+deallocate pair through tracking_resource (ledger only; with
// canaries and poison; with call stacks; with a trend sample every N allocations) side by side with
// the untracked upstream, in one run. Names: tracking_overhead/<resource>/<bytes>. The overhead is
// the difference of the pairs' times. And what one trend sample costs with N owners
// (trend_sample/<owners>), all of its time scales testing.
// And what a call stack costs apart (call_stack/...): capturing one (addresses only, on every
// allocation with capture_stacks), and symbolizing one when a report is made: the first time
// (modules opened, symbol and line tables read), a lookup with the modules open, and a repeat.
#include <custody/debug/detail/call_stack.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/host_memory.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <execinfo.h>

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

/// Owners that have all allocated once: what a trend sample walks.
void touch_owners(tracking_resource<host_memory>& r, int owners) {
    for (int i = 0; i < owners; ++i) {
        const std::string name = "layer." + std::to_string(i);
        r.deallocate({}, r.allocate({}, 64, 256, name), 64, 256);
    }
}

/// A trend sample every N allocations (the argument's second value), four owners.
void tracked_trend(benchmark::State& state) {
    tracking_options o = options(false, false);
    o.trend.every_allocations = static_cast<std::uint64_t>(state.range(1));
    tracking_resource<host_memory> r(o);
    touch_owners(r, 4);
    custody::debug::owner_scope scope("layer.0");
    pair_loop(state, r);
}

/// One sample() with N owners (and one device), after enough samples that every time scale tests
/// (the finest at each sample; the coarser ones at their windows' ends).
void trend_sample(benchmark::State& state) {
    tracking_resource<host_memory> r(options(false, false));
    touch_owners(r, static_cast<int>(state.range(0)));
    for (int i = 0; i < 9000; ++i) r.sample();
    for (auto _ : state) r.sample();
    state.SetItemsProcessed(state.iterations());
}

/// A stack as deep as an allocation's in an application: a few frames below the benchmark loop.
[[gnu::noinline]] custody::debug::detail::call_stack stack_at(int depth) {
    if (depth > 0) {
        auto s = stack_at(depth - 1);
        benchmark::DoNotOptimize(s);
        return s;
    }
    return custody::debug::detail::call_stack::capture(1);
}
constexpr int extra_frames = 4;

void capture(benchmark::State& state) {
    for (auto _ : state) {
        auto s = stack_at(extra_frames);
        benchmark::DoNotOptimize(s);
    }
    state.counters["frames"] = static_cast<double>(stack_at(extra_frames).depth);
}

/// A fresh symbolizer each time: opens every module on the stack and reads its tables.
void symbolize_first(benchmark::State& state) {
    const auto where = stack_at(extra_frames).locations();
    for (auto _ : state) {
        custody::debug::detail::symbolizer s;
        auto lines = custody::debug::detail::symbolize_stack(s, where);
        benchmark::DoNotOptimize(lines);
    }
}

/// Modules open, nothing remembered: each frame located and looked up with libdw.
void symbolize_lookup(benchmark::State& state) {
    const auto stack = stack_at(extra_frames);
    custody::debug::detail::symbolizer s;
    benchmark::DoNotOptimize(custody::debug::detail::symbolize_stack(s, stack.locations()));
    for (auto _ : state) {
        s.forget_answers();
        auto lines = custody::debug::detail::symbolize_stack(s, stack.locations());
        benchmark::DoNotOptimize(lines);
    }
}

/// The peer: glibc's backtrace_symbols, names of exported functions only, no file or line.
void backtrace_symbols_peer(benchmark::State& state) {
    const auto stack = stack_at(extra_frames);
    for (auto _ : state) {
        char** lines = ::backtrace_symbols(stack.frames.data(), stack.depth);
        benchmark::DoNotOptimize(lines);
        std::free(static_cast<void*>(lines)); // NOLINT: one malloc'ed block
    }
}

/// What a report pays for a stack seen before: the modules located and remembered answers.
void symbolize_again(benchmark::State& state) {
    const auto stack = stack_at(extra_frames);
    custody::debug::detail::symbolizer s;
    benchmark::DoNotOptimize(custody::debug::detail::symbolize_stack(s, stack.locations()));
    for (auto _ : state) {
        auto lines = custody::debug::detail::symbolize_stack(s, stack.locations());
        benchmark::DoNotOptimize(lines);
    }
}

} // namespace

BENCHMARK(untracked)->Name("tracking_overhead/host_memory")->Arg(256)->Arg(4096);
BENCHMARK(tracked_ledger)->Name("tracking_overhead/tracking<host_memory>")->Arg(256)->Arg(4096);
BENCHMARK(untracked_busy)->Name("tracking_overhead/host_memory+1024_live")->Arg(256);
BENCHMARK(tracked_ledger_busy)->Name("tracking_overhead/tracking<host_memory>+1024_live")->Arg(256);
BENCHMARK(tracked_canaries_poison)->Name("tracking_overhead/tracking<host_memory>+canaries+poison")->Arg(256)->Arg(4096);
BENCHMARK(tracked_call_stacks)->Name("tracking_overhead/tracking<host_memory>+call_stacks")->Arg(256);
BENCHMARK(tracked_trend)->Name("tracking_overhead/tracking<host_memory>+trend_every")->Args({256, 1000})->Args({256, 100})->Args({256, 1});
BENCHMARK(trend_sample)->Name("trend_sample")->Arg(4)->Arg(64)->Unit(benchmark::kMicrosecond);

BENCHMARK(capture)->Name("call_stack/capture");
BENCHMARK(symbolize_first)->Name("call_stack/symbolize_first")->Unit(benchmark::kMillisecond);
BENCHMARK(symbolize_lookup)->Name("call_stack/symbolize_lookup")->Unit(benchmark::kMicrosecond);
BENCHMARK(symbolize_again)->Name("call_stack/symbolize_again")->Unit(benchmark::kMicrosecond);
BENCHMARK(backtrace_symbols_peer)->Name("call_stack/glibc_backtrace_symbols")->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
