// What custody-merge costs per timeline entry: reading a rank report, and writing the Perfetto trace
// from it, for timelines of `owners` x `samples` entries (every owner at every sample, the shape of
// a long run with many owners), side by side at several sizes in one run. Linear work shows as the
// same time per entry (items_per_second) at every size.
// Names: merge_trace/<step>/<owners>/<samples>.
#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using custody::debug::rank_report;

/// One rank's report: `owners` owners, each at every one of `samples` samples.
rank_report timeline_report(std::int64_t owners, std::int64_t samples) {
    rank_report r;
    r.platform = "host";
    r.tracker = "bench";
    r.started_unix_ns = 1763900000000000000;
    std::vector<std::string> names;
    for (std::int64_t o = 0; o < owners; ++o) {
        names.push_back("layer." + std::to_string(o) + "/kv_cache");
        r.owners.push_back(custody::debug::owner_usage{names.back(), 4096, 1, 4096});
    }
    std::sort(names.begin(), names.end());
    for (std::int64_t s = 0; s < samples; ++s) {
        custody::debug::timeline_sample t;
        t.unix_ns = r.started_unix_ns + s * 1000;
        for (std::int64_t o = 0; o < owners; ++o) {
            t.owners.emplace_back(names[static_cast<std::size_t>(o)], static_cast<std::size_t>(s * 4096 + o));
        }
        r.timeline.push_back(std::move(t));
    }
    return r;
}

void trace(benchmark::State& state) {
    const std::vector<rank_report> reports{timeline_report(state.range(0), state.range(1))};
    for (auto _ : state) {
        std::string text = custody::debug::to_perfetto_trace(reports);
        benchmark::DoNotOptimize(text.data());
    }
    state.SetItemsProcessed(state.iterations() * state.range(0) * state.range(1));
}

void read(benchmark::State& state) {
    const std::string text = custody::debug::to_json(timeline_report(state.range(0), state.range(1)));
    for (auto _ : state) {
        rank_report r = custody::debug::parse_rank_report(text);
        benchmark::DoNotOptimize(r.timeline.data());
    }
    state.SetItemsProcessed(state.iterations() * state.range(0) * state.range(1));
    state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(text.size()));
}

void shapes(benchmark::internal::Benchmark* b) {
    if (std::getenv("CUSTODY_BENCH_SHORT") != nullptr) {
        b->Args({100, 100});
        return;
    }
    b->Args({10, 1000})->Args({100, 1000})->Args({1000, 1000})->Unit(benchmark::kMillisecond);
}

BENCHMARK(trace)->Name("merge_trace/trace")->Apply(shapes);
BENCHMARK(read)->Name("merge_trace/read")->Apply(shapes);

} // namespace

BENCHMARK_MAIN();
