// The measured unit of the sleep benchmarks, on either platform: one owner ("model") of four blocks
// put to sleep and woken, with only the sleep or only the wake timed; and what both programs
// register and run around it.
#pragma once

#include <custody/debug/owner_scope.hpp>
#include <custody/sleep/sleep_policy.hpp>

#include "throughput_reporter.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

namespace custody::bench {

inline constexpr std::size_t sleep_blocks = 4;

/// Seconds `f` takes.
template <class F>
double seconds(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// One owner ("model") of four blocks of `memory` holding `bytes` in all, each filled once.
template <class Memory>
struct owner_blocks {
    using platform = typename Memory::platform_type;
    std::unique_ptr<Memory> memory;
    std::vector<void*> ptrs;
    std::size_t each;

    owner_blocks(std::unique_ptr<Memory> m, std::size_t bytes) : memory(std::move(m)), each(bytes / sleep_blocks) {
        const auto owner = debug::intern_owner("model");
        for (std::size_t i = 0; i < sleep_blocks; ++i) {
            ptrs.push_back(memory->allocate(typename platform::stream_view{}, each, 256, owner));
            platform::memset_async(ptrs.back(), 0x5A, each, typename platform::stream_view{});
        }
        platform::synchronize(typename platform::stream_view{});
    }
    ~owner_blocks() {
        for (void* p : ptrs) memory->deallocate_sync(p, each, 256);
    }
    owner_blocks(const owner_blocks&) = delete;
    owner_blocks& operator=(const owner_blocks&) = delete;
};

/// Times the sleep (Wake = false) or the wake (Wake = true) of the owner of state.range(0) bytes
/// under `policy`, in memory `make()` gives. One cycle runs first: a backing that caches host
/// memory is then warm, as in a loop of them.
template <class Memory, bool Wake>
void sleep_cycle(benchmark::State& state, sleep::sleep_policy policy, std::unique_ptr<Memory> (*make)()) {
    const auto bytes = static_cast<std::size_t>(state.range(0));
    owner_blocks<Memory> o(make(), bytes);
    o.memory->sleep({"model"}, policy);
    o.memory->wake({"model"});
    for (auto _ : state) {
        const double slept = seconds([&] { o.memory->sleep({"model"}, policy); });
        const double woken = seconds([&] { o.memory->wake({"model"}); });
        state.SetIterationTime(Wake ? woken : slept);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

/// The owner's sizes: `normal` bytes, or `short_run` with CUSTODY_BENCH_SHORT set (the registered
/// `meson test --benchmark` run).
inline std::vector<std::int64_t> owner_sizes(std::vector<std::int64_t> normal, std::int64_t short_run) {
    if (std::getenv("CUSTODY_BENCH_SHORT") != nullptr) return {short_run};
    return normal;
}

/// Registers `fn(state, args...)` as `name` for each of `sizes`, timed by the benchmark, in ms.
template <class F, class... Args>
void register_sized(const char* name, const std::vector<std::int64_t>& sizes, F fn, Args... args) {
    auto* b = benchmark::RegisterBenchmark(name, fn, args...);
    for (const std::int64_t n : sizes) b->Arg(n);
    b->UseManualTime()->Unit(benchmark::kMillisecond);
}

/// The sleep and the wake under both policies of `Plain` (host memory for the offload taken at each
/// sleep), and the offload of `Cached` (kept from one sleep to the next): sleep/discard,
/// wake/discard, sleep/offload, wake/offload, sleep/offload_cached, wake/offload_cached.
template <class Plain, class Cached>
void register_cycles(const std::vector<std::int64_t>& sizes, std::unique_ptr<Plain> (*plain)(),
                     std::unique_ptr<Cached> (*cached)()) {
    using sleep::sleep_policy;
    register_sized("sleep/discard", sizes, &sleep_cycle<Plain, false>, sleep_policy::discard, plain);
    register_sized("wake/discard", sizes, &sleep_cycle<Plain, true>, sleep_policy::discard, plain);
    register_sized("sleep/offload", sizes, &sleep_cycle<Plain, false>, sleep_policy::offload, plain);
    register_sized("wake/offload", sizes, &sleep_cycle<Plain, true>, sleep_policy::offload, plain);
    register_sized("sleep/offload_cached", sizes, &sleep_cycle<Cached, false>, sleep_policy::offload, cached);
    register_sized("wake/offload_cached", sizes, &sleep_cycle<Cached, true>, sleep_policy::offload, cached);
}

/// Runs what is registered, reported by throughput_reporter.
inline int run_registered(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    throughput_reporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return 0;
}

} // namespace custody::bench
