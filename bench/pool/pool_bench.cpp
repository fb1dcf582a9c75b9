// The stream-ordered pool against its peers on the host platform, side by side in one run (the
// peers and their loading: peers.hpp; the workloads: scenarios.hpp).
//
// Names are <scenario>/<peer>/<args>:
//   pair/*/bytes:B/streams:S     one allocate + free, 64 B .. 64 MiB, one thread; streams:4: four
//                                streams in that thread, taken in turn (custody's pool only)
//   churn/*/streams:S            random sizes replacing a window of 256 live blocks
//   trace/*, trace_unbucketed/*  the inference-like trace, one decoding step per iteration;
//                                counter `fragmentation` = peak reserved / peak live
//   llm/*/streams:N              one request of an inference server per iteration (items: its
//                                allocations and frees), its steps on N compute streams of one thread
//   llm_mt/*/threads:T           T threads, each serving its own requests on its own compute and
//                                copy streams, one shared allocator; items per second is the
//                                throughput (wall time), threads:2 over threads:1 the scaling
//   pair_mt/*, churn_mt/*        pairs and churn from 1..8 threads (each thread its own stream)
//   cross_stream/*               a producer stream allocates, a consumer stream frees, 10^6 rounds of
//                                8 blocks (4 KiB .. 3 MiB); counters `reserved_MiB` and
//                                `reserved_over_peak_live`, under each reuse policy beside pmr
// The instruction counts of the same workloads come from pool_ops.cpp under callgrind
// (instructions.py).
#include "peers.hpp"
#include "scenarios.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>

namespace {

using namespace custody_bench;

/// One allocator shared by every thread of a multi-threaded benchmark, built once.
template <class Peer>
Peer& shared_instance() {
    static Peer instance;
    return instance;
}

template <class Peer>
void report_fast_path(benchmark::State& state, const Peer& r) {
    if constexpr (Peer::has_streams) {
        const auto p = r.pool.detailed_statistics();
        state.counters["fast_path_share"] =
            static_cast<double>(p.fast_allocations) / static_cast<double>(std::max<std::uint64_t>(p.totals.allocations, 1));
    }
}

// ---- single thread ----

template <class Peer>
void pair(benchmark::State& state) {
    Peer r;
    const thread_streams t(0, static_cast<int>(state.range(1)));
    const auto n = static_cast<std::size_t>(state.range(0));
    const std::span<const stream> s(t.compute);
    pairs(r, s, n, s.size()); // warm: the first growth is not what is measured
    for (auto _ : state) pairs(r, s, n, s.size());
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(s.size()));
}

template <class Peer>
void churn(benchmark::State& state) {
    Peer r;
    const thread_streams t(0, static_cast<int>(state.range(0)));
    {
        churn_state<Peer> c(r, t.compute, 42);
        for (auto _ : state) c.step();
    }
    report_fast_path(state, r);
    state.SetItemsProcessed(state.iterations());
}

template <class Peer, bool Bucketed>
void trace(benchmark::State& state) {
    Peer r;
    const thread_streams t(0, static_cast<int>(state.range(0)));
    std::size_t peak = 0;
    {
        trace_state<Peer> tr(r, t.compute, Bucketed);
        for (auto _ : state) tr.step();
        peak = tr.peak_live();
    }
    state.counters["fragmentation"] = r.fragmentation(peak);
    report_fast_path(state, r);
    state.counters["peak_live_MiB"] = static_cast<double>(peak) / MiB;
    state.SetItemsProcessed(state.iterations());
}

template <class Peer>
void llm(benchmark::State& state) {
    Peer r;
    const thread_streams t(0, static_cast<int>(state.range(0)));
    llm_request(r, t); // warm: the pool's growth is not what is measured
    for (auto _ : state) llm_request(r, t);
    report_fast_path(state, r);
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(llm_ops()));
}

// ---- several threads, one shared allocator ----

template <class Peer>
void llm_mt(benchmark::State& state) {
    Peer& r = shared_instance<Peer>();
    const thread_streams t(state.thread_index(), 1);
    for (auto _ : state) llm_request(r, t);
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(llm_ops()));
}

template <class Peer>
void pair_mt(benchmark::State& state) {
    Peer& r = shared_instance<Peer>();
    const stream s = stream_of(state.thread_index());
    const auto n = static_cast<std::size_t>(state.range(0));
    for (auto _ : state) pair_once(r, s, n);
    state.SetItemsProcessed(state.iterations());
}

template <class Peer>
void churn_mt(benchmark::State& state) {
    const thread_streams t(state.thread_index(), 1);
    churn_state<Peer> c(shared_instance<Peer>(), t.compute, 42u + static_cast<unsigned>(state.thread_index()));
    for (auto _ : state) c.step();
    state.SetItemsProcessed(state.iterations());
}

// ---- producer and consumer streams ----

/// Each round the producer's stream allocates 8 blocks (4 KiB, 64 KiB, 1 MiB and 3 MiB, twice) and
/// the consumer's stream gives them back. Counters: reserved_MiB at the end and its ratio to the
/// live peak (custody's pool under `policy`; for the pmr peer, which has no streams, the peak its
/// upstream held).
constexpr std::size_t cross_sizes[] = {4096, 65536, MiB, 3 * MiB, 4096, 65536, MiB, 3 * MiB};
constexpr std::size_t cross_live = 2 * (4096 + 65536 + MiB + 3 * MiB);

template <custody::pool::reuse_policy policy>
void cross_stream_pool(benchmark::State& state) {
    custody::pool::pool_options o;
    o.reuse = policy;
    o.checked = false;
    o.maximum_size = std::size_t{1} << 30; // same_stream reaches it: only the last resort moves blocks across
    pool_type pool(o);
    const auto producer = stream_of(0);
    const auto consumer = stream_of(1);
    void* blocks[std::size(cross_sizes)];
    for (auto _ : state) {
        for (std::size_t i = 0; i < std::size(cross_sizes); ++i) blocks[i] = pool.allocate(producer, cross_sizes[i], alignment);
        benchmark::DoNotOptimize(blocks);
        for (std::size_t i = 0; i < std::size(cross_sizes); ++i) pool.deallocate(consumer, blocks[i], cross_sizes[i], alignment);
    }
    const auto s = pool.statistics();
    state.counters["reserved_MiB"] = static_cast<double>(s.reserved_bytes) / MiB;
    state.counters["reserved_over_peak_live"] = static_cast<double>(s.reserved_bytes) / static_cast<double>(s.peak_live_bytes);
    state.counters["reclaims"] = static_cast<double>(pool.detailed_statistics().reclaims);
    state.SetItemsProcessed(state.iterations());
}

void cross_stream_pmr(benchmark::State& state) {
    pmr_sync_peer r;
    void* blocks[std::size(cross_sizes)];
    for (auto _ : state) {
        for (std::size_t i = 0; i < std::size(cross_sizes); ++i) blocks[i] = r.allocate({}, cross_sizes[i], alignment);
        benchmark::DoNotOptimize(blocks);
        for (std::size_t i = 0; i < std::size(cross_sizes); ++i) r.deallocate({}, blocks[i], cross_sizes[i], alignment);
    }
    state.counters["reserved_MiB"] = static_cast<double>(r.upstream.peak()) / MiB;
    state.counters["reserved_over_peak_live"] = r.fragmentation(cross_live);
    state.SetItemsProcessed(state.iterations());
}

void register_cross_stream() {
    using custody::pool::reuse_policy;
    constexpr int rounds = 1000000;
    benchmark::RegisterBenchmark("cross_stream/pool_same_stream", cross_stream_pool<reuse_policy::same_stream>)
        ->Iterations(rounds);
    benchmark::RegisterBenchmark("cross_stream/pool_opportunistic", cross_stream_pool<reuse_policy::opportunistic>)
        ->Iterations(rounds);
    benchmark::RegisterBenchmark("cross_stream/pool_follow_dependencies",
                                 cross_stream_pool<reuse_policy::follow_dependencies>)
        ->Iterations(rounds);
    benchmark::RegisterBenchmark("cross_stream/pmr_sync", cross_stream_pmr)->Iterations(rounds);
}

// ---- registration ----

/// 64 B .. 64 MiB: size classes (up to 1 MiB, the last class), large blocks above.
constexpr std::int64_t pair_sizes[] = {64, 256, 4096, 65536, 1 << 20, 2 << 20, 16 << 20, 64 << 20};

template <class Peer>
void register_peer() {
    if (!Peer::available()) return;
    const std::string n = Peer::name;
    const bool floor = std::string(Peer::name) == "lifo"; // the floor: pairs only
    auto* p = benchmark::RegisterBenchmark(("pair/" + n).c_str(), pair<Peer>)->ArgNames({"bytes", "streams"});
    for (const std::int64_t bytes : pair_sizes) {
        p->Args({bytes, 1});
        if constexpr (Peer::has_streams) p->Args({bytes, 4});
    }
    if (floor) return;
    auto* c = benchmark::RegisterBenchmark(("churn/" + n).c_str(), churn<Peer>)->ArgName("streams")->Arg(1);
    // A fixed number of steps (10240: 80 requests), so that every peer replays the same trace and
    // its fragmentation (which depends on the largest request seen) is comparable.
    auto* t = benchmark::RegisterBenchmark(("trace/" + n).c_str(), trace<Peer, true>)
                  ->ArgName("streams")->Arg(1)->Unit(benchmark::kMicrosecond)->Iterations(10240);
    auto* u = benchmark::RegisterBenchmark(("trace_unbucketed/" + n).c_str(), trace<Peer, false>)
                  ->ArgName("streams")->Arg(1)->Unit(benchmark::kMicrosecond)->Iterations(10240);
    auto* l = benchmark::RegisterBenchmark(("llm/" + n).c_str(), llm<Peer>)->ArgName("streams")->Arg(1)->Unit(benchmark::kMicrosecond);
    if constexpr (Peer::has_streams) {
        for (auto* b : {c, t, u, l}) b->Arg(4);
    }
    if constexpr (Peer::thread_safe) {
        benchmark::RegisterBenchmark(("llm_mt/" + n).c_str(), llm_mt<Peer>)
            ->ThreadRange(1, 2)->UseRealTime()->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("pair_mt/" + n).c_str(), pair_mt<Peer>)
            ->Arg(256)->Arg(64 << 10)->ThreadRange(1, 8)->UseRealTime();
        benchmark::RegisterBenchmark(("churn_mt/" + n).c_str(), churn_mt<Peer>)->ThreadRange(1, 8)->UseRealTime();
    }
}

} // namespace

int main(int argc, char** argv) {
    make_room_for_jemalloc(argv);
    say_missing_peers();
    register_peer<pool_peer<pool_variant::plain>>();
    register_peer<pool_peer<pool_variant::checked>>();        // its cost beside pool
    register_peer<pool_peer<pool_variant::capture_calls>>();  // the capture query's cost beside pool
    register_peer<malloc_peer>();
    register_peer<pmr_unsync_peer>();
    register_peer<pmr_sync_peer>();
    register_peer<jemalloc_peer>();
    register_peer<mimalloc_peer>();
    register_peer<lifo_peer>();
    register_cross_stream();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
