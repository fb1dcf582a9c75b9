// The cases of sleepable_memory written once over a kit, and run on both platforms: the host
// platform in CI (sleep_test.cpp: real pages mapped and unmapped with mmap) and cuda::vmm on a GPU
// (sleep_cuda_test.cpp). A kit supplies:
//   Kit::platform, Kit::memory            the platform and a sleepable_memory type on it
//   Kit::make(options)                    a resource on device 0 (std::unique_ptr)
//   Kit::mapped(p)                        whether the granule at p has physical memory now (asked of
//                                         the kernel or the driver, not of the resource)
#pragma once

#include <custody/debug/owner_scope.hpp>
#include <custody/platform/capture.hpp>
#include <custody/sleep/sleepable_memory.hpp>

#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace custody_test::sleep_cases {

using custody::sleep::owner_sleep;
using custody::sleep::sleep_error;
using custody::sleep::sleep_policy;
using bytes = std::vector<unsigned char>;

constexpr sleep_policy offload = sleep_policy::offload;
constexpr sleep_policy discard = sleep_policy::discard;

/// A pattern that differs per block (seed) and per position, so a shifted or mixed copy shows.
inline bytes cookie(unsigned seed, std::size_t n) {
    bytes b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(seed * 131U + i * 7U + (i >> 9));
    return b;
}

/// Writes `data` at `dst` (device memory on cuda), done when it returns.
template <class P>
void put(void* dst, const bytes& data) {
    P::memcpy_async(dst, data.data(), data.size(), typename P::stream_view{});
    P::synchronize(typename P::stream_view{});
}
/// The `n` bytes at `src`.
template <class P>
bytes get(const void* src, std::size_t n) {
    bytes b(n);
    P::memcpy_async(b.data(), src, n, typename P::stream_view{});
    P::synchronize(typename P::stream_view{});
    return b;
}

/// The reason of the sleep_error `f` throws (fails the case if it throws none).
template <class F>
sleep_error::reason refusal(F&& f) {
    try {
        f();
    } catch (const sleep_error& e) {
        return e.why();
    }
    FAIL("no sleep_error was thrown");
    return sleep_error::reason::owner_awake;
}

template <class Kit>
bool all_unmapped(const void* p, std::size_t span, std::size_t granule) {
    for (std::size_t at = 0; at < span; at += granule) {
        if (Kit::mapped(static_cast<const std::byte*>(p) + at)) return false;
    }
    return true;
}

template <class Kit>
bool all_mapped(const void* p, std::size_t span, std::size_t granule) {
    for (std::size_t at = 0; at < span; at += granule) {
        if (!Kit::mapped(static_cast<const std::byte*>(p) + at)) return false;
    }
    return true;
}

/// Two owners, blocks of one granule and of three and a half: after the sleep no granule of theirs
/// has memory and the counts say so; after the wake the same pointers hold the offloaded owner's
/// bytes exactly and zeros for the discarded one.
template <class Kit>
void case_round_trip() {
    using P = typename Kit::platform;
    auto memory = Kit::make({});
    const std::size_t g = memory->granularity();
    typename P::stream s(0);
    const std::size_t sizes[] = {g, 3 * g + g / 2};
    std::vector<void*> weights;
    std::vector<void*> cache;
    {
        custody::debug::owner_scope scope("weights");
        for (std::size_t n : sizes) weights.push_back(memory->allocate(s, n, 256));
    }
    {
        custody::debug::owner_scope scope("kv_cache");
        for (std::size_t n : sizes) cache.push_back(memory->allocate(s, n, 256));
    }
    for (std::size_t i = 0; i < 2; ++i) {
        put<P>(weights[i], cookie(1 + i, sizes[i]));
        put<P>(cache[i], cookie(7 + i, sizes[i]));
    }
    const std::size_t spans = 2 * (g + 4 * g);
    CHECK(memory->detailed_statistics().mapped_bytes == spans);

    memory->sleep({{"weights", offload}, {"kv_cache", discard}});
    for (std::size_t i = 0; i < 2; ++i) {
        CHECK(all_unmapped<Kit>(weights[i], sizes[i], g));
        CHECK(all_unmapped<Kit>(cache[i], sizes[i], g));
    }
    auto s1 = memory->detailed_statistics();
    CHECK(s1.mapped_bytes == 0);
    CHECK(s1.asleep_bytes == spans);
    CHECK(s1.offloaded_bytes == sizes[0] + sizes[1]);
    CHECK(s1.sleeping_owners == 2);
    CHECK(s1.released_bytes == spans);
    CHECK(memory->statistics().reserved_bytes == 0);
    CHECK(memory->statistics().live_bytes == 2 * (sizes[0] + sizes[1])); // still allocated
    CHECK(memory->is_asleep("weights"));
    CHECK(memory->owner_statistics("weights").offloaded_bytes == sizes[0] + sizes[1]);
    CHECK(memory->owner_statistics("kv_cache").offloaded_bytes == 0);

    memory->wake({"weights", "kv_cache"});
    for (std::size_t i = 0; i < 2; ++i) {
        CHECK(all_mapped<Kit>(weights[i], sizes[i], g));
        CHECK(get<P>(weights[i], sizes[i]) == cookie(1 + i, sizes[i]));
        CHECK(get<P>(cache[i], sizes[i]) == bytes(sizes[i], 0));
    }
    auto s2 = memory->detailed_statistics();
    CHECK(s2.mapped_bytes == spans);
    CHECK(s2.asleep_bytes == 0);
    CHECK(s2.offloaded_bytes == 0);
    CHECK(s2.sleeping_owners == 0);
    CHECK(s2.sleeps == 2);
    CHECK(s2.wakes == 2);
    CHECK_FALSE(memory->is_asleep("weights"));
    for (void* p : weights) memory->deallocate(s, p, 0, 256);
    for (void* p : cache) memory->deallocate(s, p, 0, 256);
    CHECK(memory->statistics().live_bytes == 0);
    CHECK(memory->statistics().reserved_bytes == 0);
}

/// Work still queued on a block's stream (and on a stream recorded for it, and on a stream the
/// caller names) when sleep is called is waited for: what it writes is what the wake gives back.
template <class Kit>
void case_waits_for_queued_work() {
    using P = typename Kit::platform;
    auto memory = Kit::make({});
    const std::size_t n = 2 * memory->granularity();
    typename P::stream alloc_stream(0);
    typename P::stream recorded(0);
    typename P::stream named(0);
    const auto owner = custody::debug::intern_owner("weights");
    void* a = memory->allocate(alloc_stream, n, 256, owner);
    void* b = memory->allocate(alloc_stream, n, 256, owner);
    void* c = memory->allocate(alloc_stream, n, 256, owner);
    memory->record(b, recorded);
    custody::test::stream_gate<P> gate_a(alloc_stream);
    custody::test::stream_gate<P> gate_b(recorded);
    custody::test::stream_gate<P> gate_c(named);
    P::memset_async(a, 0xA1, n, alloc_stream);
    P::memset_async(b, 0xB2, n, recorded);
    P::memset_async(c, 0xC3, n, named);
    // The gates open only after sleep was called; sleep must not return before the writes ran.
    std::thread opener([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        gate_a.open();
        gate_b.open();
        gate_c.open();
    });
    const typename P::stream_view after[] = {named};
    memory->sleep({"weights"}, offload, after);
    opener.join();
    memory->wake({"weights"});
    CHECK(get<P>(a, n) == bytes(n, 0xA1));
    CHECK(get<P>(b, n) == bytes(n, 0xB2));
    CHECK(get<P>(c, n) == bytes(n, 0xC3));
    for (void* p : {a, b, c}) memory->deallocate(alloc_stream, p, n, 256);
}

/// The rules: each refusal is typed and changes nothing; freeing a sleeping block is allowed.
template <class Kit>
void case_rules() {
    using P = typename Kit::platform;
    auto memory = Kit::make({});
    const std::size_t g = memory->granularity();
    typename P::stream s(0);
    const auto weights = custody::debug::intern_owner("weights");
    void* w = memory->allocate(s, g, 256, weights);
    void* w2 = memory->allocate(s, 2 * g, 256, weights);
    void* untagged = memory->allocate(s, g, 256, nullptr);
    void* named_untagged = nullptr; // a scope named "<untagged>" is the untagged owner, not a second one
    {
        custody::debug::owner_scope scope(custody::debug::untagged_owner);
        named_untagged = memory->allocate(s, g, 256);
    }
    CHECK(memory->owner_statistics(custody::debug::untagged_owner).blocks == 2);
    put<P>(w, cookie(3, g));
    put<P>(named_untagged, cookie(4, g));
    memory->sleep({"weights"}, offload);
    const auto before = memory->statistics();
    const auto detail = memory->detailed_statistics();

    CHECK(refusal([&] { static_cast<void>(memory->allocate(s, g, 256, weights)); }) == sleep_error::reason::owner_asleep);
    {
        custody::debug::owner_scope scope("weights");
        CHECK(refusal([&] { static_cast<void>(memory->allocate(s, g, 256)); }) == sleep_error::reason::owner_asleep);
    }
    CHECK(refusal([&] { memory->sleep({"weights"}, discard); }) == sleep_error::reason::owner_asleep);
    CHECK(refusal([&] { memory->wake({"kv_cache"}); }) == sleep_error::reason::owner_awake);
    CHECK(refusal([&] { memory->wake({"weights", "kv_cache"}); }) == sleep_error::reason::owner_awake);
    CHECK_THROWS_AS(memory->wake({"weights", "weights"}), std::invalid_argument);
    CHECK_THROWS_AS(memory->sleep({"kv_cache", "kv_cache"}, discard), std::invalid_argument);
    CHECK(memory->statistics() == before);
    CHECK(memory->detailed_statistics().offloaded_bytes == detail.offloaded_bytes);
    CHECK(memory->is_asleep("weights"));
    CHECK_FALSE(memory->is_asleep("kv_cache")); // a refused sleep made no one sleep

    // Freeing a sleeping block: its range and offloaded contents go; nothing to restore later.
    memory->deallocate(s, w2, 2 * g, 256);
    CHECK(memory->statistics().live_allocations == before.live_allocations - 1);
    CHECK(memory->detailed_statistics().asleep_bytes == g);
    CHECK(memory->detailed_statistics().offloaded_bytes == g);

    // Memory allocated without an owner sleeps by the name "<untagged>".
    memory->sleep({std::string_view(custody::debug::untagged_owner)}, discard);
    CHECK(all_unmapped<Kit>(untagged, g, g));
    CHECK(all_unmapped<Kit>(named_untagged, g, g));
    // An owner with no blocks can sleep; allocating for it is then refused.
    memory->sleep({"idle"}, discard);
    CHECK(refusal([&] { static_cast<void>(memory->allocate(s, g, 256, custody::debug::intern_owner("idle"))); }) ==
          sleep_error::reason::owner_asleep);
    memory->wake({"weights", "idle", std::string_view(custody::debug::untagged_owner)});
    CHECK(get<P>(w, g) == cookie(3, g));
    CHECK(get<P>(untagged, g) == bytes(g, 0));
    CHECK(get<P>(named_untagged, g) == bytes(g, 0));
    CHECK(memory->detailed_statistics().sleeping_owners == 0);
    memory->deallocate(s, w, g, 256);
    memory->deallocate(s, untagged, g, 256);
    memory->deallocate(s, named_untagged, g, 256);
}

/// Capture: sleeping while a block's stream captures is refused (the capture is not disturbed); a
/// capture on an unrelated stream is neither seen nor broken by a sleep and a wake; a graph
/// captured over blocks replays after the wake with the same results as before the sleep.
template <class Kit>
void case_capture() {
    using P = typename Kit::platform;
    auto memory = Kit::make({});
    const std::size_t n = memory->granularity();
    typename P::stream s(0);
    typename P::stream other(0);
    void* input = memory->allocate(s, n, 256, custody::debug::intern_owner("weights"));
    void* output = memory->allocate(s, n, 256, custody::debug::intern_owner("activations"));
    put<P>(input, cookie(5, n));

    P::begin_capture(s, custody::capture_mode::global);
    P::memcpy_async(output, input, n, s);
    CHECK(refusal([&] { memory->sleep({"weights"}, offload); }) == sleep_error::reason::capture_open);
    CHECK_FALSE(memory->is_asleep("weights"));
    auto graph = P::end_capture(s); // not invalidated by the refused sleep
    REQUIRE(graph.node_count() >= 1);
    P::launch(graph, s);
    P::synchronize(s);
    CHECK(get<P>(output, n) == cookie(5, n));

    // A global capture on another stream of this thread: the sleep neither sees nor breaks it.
    P::begin_capture(other, custody::capture_mode::global);
    memory->sleep({{"weights", offload}, {"activations", discard}});
    memory->wake({"weights", "activations"});
    CHECK(P::query_capture(other).status == custody::capture_status::active);
    static_cast<void>(P::end_capture(other));

    CHECK(get<P>(output, n) == bytes(n, 0));
    P::launch(graph, s);
    P::synchronize(s);
    CHECK(get<P>(output, n) == cookie(5, n)); // the same result as before the sleep
    memory->deallocate(s, input, n, 256);
    memory->deallocate(s, output, n, 256);
}

} // namespace custody_test::sleep_cases
