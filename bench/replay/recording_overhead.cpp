// What recording costs: one allocate + free through trace::recording_resource<Upstream> against
// the same pair on the bare Upstream, side by side in one run, from 1 to 8 threads. The recorder
// writes a real trace file (under $TMPDIR, removed at exit).
//
// Names are <scenario>/<resource>/<args>:
//   pair/{host_memory,recorded_host_memory}/256        256 B, synchronous pair, one thread
//   pair/{pool,recorded_pool}/256                     the same over custody's pool (its hot path is
//                                                     a few nanoseconds, so the recorder's cost shows)
//   pair_process_cpu/{pool,recorded_pool}/256         the same, timed as the CPU time of the whole
//                                                     process: the writer thread's work included
//   pair_mt/{pool,recorded_pool}/256/threads:N        every thread its own stream, one shared pool
//                                                     and one shared recorder
#include "../support/host_streams.hpp"

#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/trace/recorder.hpp>
#include <custody/trace/recording_resource.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using pool_type = custody::pool::stream_ordered_pool<custody::resource::host_memory>;
constexpr std::size_t bytes = 256;

/// The recorder every recorded benchmark writes to (main makes it, and removes its file at the end).
custody::trace::recorder* the_recorder = nullptr;
custody::trace::recorder& shared_recorder() { return *the_recorder; }

using custody_bench::stream_of;

template <class R>
void pairs(benchmark::State& state, R& r, custody::host::stream_view s) {
    r.deallocate(s, r.allocate(s, bytes, 256), bytes, 256); // warm
    for (auto _ : state) {
        void* p = r.allocate(s, bytes, 256);
        benchmark::DoNotOptimize(p);
        r.deallocate(s, p, bytes, 256);
    }
    state.SetItemsProcessed(state.iterations());
}

void bare_host_memory(benchmark::State& state) {
    custody::resource::host_memory r;
    pairs(state, r, {});
}
void recorded_host_memory(benchmark::State& state) {
    custody::trace::recording_resource<custody::resource::host_memory> r(shared_recorder());
    pairs(state, r, {});
}
void bare_pool(benchmark::State& state) {
    pool_type r{custody::pool::pool_options{}};
    pairs(state, r, stream_of(0));
}
void recorded_pool(benchmark::State& state) {
    custody::trace::recording_resource<pool_type> r(shared_recorder(), custody::pool::pool_options{});
    pairs(state, r, stream_of(0));
}

template <class R>
R& shared(const auto&... args) {
    static R r(args...);
    return r;
}
void bare_pool_mt(benchmark::State& state) {
    pairs(state, shared<pool_type>(custody::pool::pool_options{}), stream_of(state.thread_index()));
}
void recorded_pool_mt(benchmark::State& state) {
    using R = custody::trace::recording_resource<pool_type>;
    static R r(shared_recorder(), custody::pool::pool_options{});
    pairs(state, r, stream_of(state.thread_index()));
}

} // namespace

int main(int argc, char** argv) {
    const std::string path =
        (std::filesystem::temp_directory_path() / ("custody-recording-bench-" + std::to_string(::getpid()) + ".ctrace"))
            .string();
    custody::trace::recorder_options o;
    o.path = path;
    o.rank = custody::rank_info{};
    auto rec = std::make_unique<custody::trace::recorder>(o);
    the_recorder = rec.get();
    benchmark::RegisterBenchmark("pair/host_memory/256", bare_host_memory);
    benchmark::RegisterBenchmark("pair/recorded_host_memory/256", recorded_host_memory);
    benchmark::RegisterBenchmark("pair/pool/256", bare_pool);
    benchmark::RegisterBenchmark("pair/recorded_pool/256", recorded_pool);
    // The CPU time of every thread of the process: the writer thread's encoding and writing included.
    benchmark::RegisterBenchmark("pair_process_cpu/pool/256", bare_pool)->MeasureProcessCPUTime();
    benchmark::RegisterBenchmark("pair_process_cpu/recorded_pool/256", recorded_pool)->MeasureProcessCPUTime();
    benchmark::RegisterBenchmark("pair_mt/pool/256", bare_pool_mt)->ThreadRange(1, 8)->UseRealTime();
    benchmark::RegisterBenchmark("pair_mt/recorded_pool/256", recorded_pool_mt)->ThreadRange(1, 8)->UseRealTime();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    rec.reset();
    std::remove(path.c_str());
    return 0;
}
