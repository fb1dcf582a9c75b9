// The measured unit of the sleep benchmarks, on either platform: one owner ("model") of four blocks
// put to sleep and woken, with only the sleep or only the wake timed.
#pragma once

#include <custody/debug/owner_scope.hpp>
#include <custody/sleep/sleep_policy.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
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

} // namespace custody::bench
