// Replays of the project's own generated traces through every host allocator, side by side in one
// run. The traces are recorded at start-up by running the workloads of workloads.hpp through
// trace::recording_resource over address space (so sizes are a GPU's and no memory is touched),
// then compiled once; each iteration is one timed replay from a fresh allocator (manual time: the
// replay loop only, as custody-replay reports it).
//
// Names are replay/<trace>/<allocator>:
//   trace       inference (decoding steps, KV pages given back on a second stream), training
//               (forward activations kept, backward gives them back)
//   allocator   as custody-replay names them: pool, pmr_unsync, pmr_sync, malloc, host_memory,
//               address_space
// Counters: ns_per_op (the loop's time per allocation or free), fragmentation (peak reserved /
// peak live, from one measuring pass), ops, peak_live_MiB.
// CUSTODY_BENCH_SHORT=1 (set by `meson test --benchmark`) records short traces.
#include "workloads.hpp"

#include "replay/allocators.hpp"
#include "replay/program.hpp"
#include "replay/replay.hpp"
#include "replay/streams.hpp"

#include <custody/platform/host.hpp>
#include <custody/trace/reader.hpp>
#include <custody/trace/recorder.hpp>
#include <custody/trace/recording_resource.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

struct generated {
    std::string name;
    custody::replay::program program;
};

/// Records `workload(resource, compute, copy)` into a trace and compiles it.
template <class Workload>
generated record(const std::string& name, Workload workload) {
    const std::string path =
        (std::filesystem::temp_directory_path() / ("custody-replay-bench-" + name + "-" + std::to_string(::getpid()) + ".ctrace"))
            .string();
    {
        custody::trace::recorder_options o;
        o.path = path;
        o.rank = custody::rank_info{};
        custody::trace::recorder rec(o);
        custody::trace::recording_resource<custody::replay::address_space> mr(rec, 0);
        custody::host::stream compute(0), copy(0);
        workload(mr, compute.view(), copy.view());
    }
    custody::trace::reader in(path);
    generated g{name, custody::replay::compile(in)};
    std::remove(path.c_str());
    return g;
}

void replay(benchmark::State& state, const custody::replay::device_program& p, const std::string& spec) {
    custody::replay::stream_pool streams(p);
    const auto driver = custody::replay::plan(custody::replay::allocator_spec(spec))(p, streams);
    custody::replay::progress bar(false);
    const custody::replay::measurement m = driver->measure(p, {}, bar);
    double seconds = 0;
    for (auto _ : state) {
        const double s = driver->timed(p);
        seconds += s;
        state.SetIterationTime(s);
    }
    const double ops = static_cast<double>(p.ops.size());
    state.counters["ns_per_op"] = state.iterations() == 0 ? 0.0 : seconds * 1e9 / (ops * static_cast<double>(state.iterations()));
    state.counters["fragmentation"] = static_cast<double>(m.peak_reserved) / static_cast<double>(p.peak_live);
    state.counters["ops"] = ops;
    state.counters["peak_live_MiB"] = static_cast<double>(p.peak_live) / (1 << 20);
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(p.ops.size()));
}

} // namespace

int main(int argc, char** argv) {
    const bool short_mode = std::getenv("CUSTODY_BENCH_SHORT") != nullptr;
    using resource = custody::trace::recording_resource<custody::replay::address_space>;
    using stream = custody::host::stream_view;
    static std::vector<generated> traces;
    traces.push_back(record("inference", [&](resource& mr, stream compute, stream copy) {
        custody_bench::inference_workload(mr, compute, copy, short_mode ? 64 : 1024);
    }));
    traces.push_back(record("training", [&](resource& mr, stream compute, stream) {
        custody_bench::training_workload(mr, compute, short_mode ? 4 : 64);
    }));
    for (const auto& t : traces) {
        for (const char* spec : {"pool", "pmr_unsync", "pmr_sync", "malloc", "host_memory", "address_space"}) {
            const auto& p = t.program.devices.front();
            benchmark::RegisterBenchmark(("replay/" + t.name + "/" + spec).c_str(),
                                         [&p, spec](benchmark::State& s) { replay(s, p, spec); })
                ->UseManualTime()
                ->Unit(benchmark::kMillisecond);
        }
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
