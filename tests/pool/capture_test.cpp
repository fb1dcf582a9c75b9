// The pool's capture-private memory on the host platform, which captures and replays for real: the
// shared cases (tests/support/pool_capture_cases.hpp), failures injected during a capture, many
// threads allocating while one captures, and the lock-free index of private chunks.
#include <custody/platform/host.hpp>
#include <custody/pool/capture_scope.hpp>
#include <custody/pool/detail/address_ranges.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/virtual_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/pool_capture_cases.hpp"

#include "../support/catch.hpp"

#include <atomic>
#include <cstddef>
#include <new>
#include <optional>
#include <thread>
#include <vector>

using custody::capture_mode;
using custody::capture_status;
using custody::host::platform;
using custody::pool::capture_scope;
using custody::pool::pool_options;
using custody::pool::stream_ordered_pool;
using custody::host::simulated_device_memory;
using pool_type = stream_ordered_pool<simulated_device_memory>;
using faulty_pool = stream_ordered_pool<custody::resource::fault_injecting<simulated_device_memory>>;
/// The pool growing by mapping (docs/pool.md), the setup a GPU user is told to use.
using mapped_pool = stream_ordered_pool<custody::resource::virtual_memory<custody::host::vmm>>;

namespace {
constexpr std::size_t device_bytes = std::size_t{1} << 30;

/// A pool that maps 2 MiB granules into a range of `device_bytes`.
mapped_pool make_mapped(pool_options o = {}) {
    custody::resource::reservation_options r;
    r.granule = std::size_t{2} << 20;
    return mapped_pool(o, 0, device_bytes, r);
}
} // namespace

TEST_CASE("capture pool over a pool that maps: private chunks lie apart from the range its growth maps in",
          "[pool][capture][mapped]") {
    mapped_pool pool = make_mapped();
    custody::host::stream s;
    custody::host::stream t;
    void* before = pool.allocate(t, 8192, 256); // the pool has grown once
    capture_scope scope(pool, s);
    void* p = pool.allocate(s, 4096, 256); // a private chunk
    platform::memset_async(p, 0x3C, 4096, s);
    custody::pool::captured_graph g = scope.end();
    REQUIRE(pool.detailed_statistics().capture_reserved_bytes > 0);
    // Ordinary allocations of every size after it: none may fail, none may land in private memory.
    std::vector<std::pair<void*, std::size_t>> ordinary;
    for (int i = 0; i < 96; ++i) {
        const std::size_t n = i % 4 == 0 ? (std::size_t{1} << 20) * (1 + static_cast<std::size_t>(i) % 7) + 256
                                         : 256 * (1 + static_cast<std::size_t>(i) * 37 % 4000);
        void* q = nullptr;
        REQUIRE_NOTHROW(q = pool.allocate(t, n, 256));
        CHECK_FALSE(custody_test::overlap(q, n, p, 4096));
        platform::memset_async(q, 0x11, n < 4096 ? n : 4096, t);
        ordinary.emplace_back(q, n);
    }
    for (int i = 0; i < 5; ++i) g.launch(s);
    CHECK(custody_test::holds_cookie<platform>(s, p, 4096, 0x3C));
    for (const auto& [q, n] : ordinary) pool.deallocate(t, q, n, 256);
    pool.deallocate(t, before, 8192, 256);
    pool.deallocate(s, p, 4096, 256);
    g.reset();
    platform::synchronize(t);
    pool.trim();
    CHECK(pool.detailed_statistics().capture_reserved_bytes == 0);
    CHECK(pool.statistics().reserved_bytes == 0);
    custody_test::check_identity(pool.detailed_statistics());
}

TEST_CASE("capture pool over a pool that maps: the shared cases", "[pool][capture][mapped]") {
    {
        mapped_pool pool = make_mapped();
        custody_test::case_capture_replay_cookies(pool);
    }
    {
        mapped_pool pool = make_mapped();
        custody_test::case_shared_pool(pool);
    }
    {
        mapped_pool pool = make_mapped();
        custody_test::case_ordinary_during_capture(pool);
    }
}

TEST_CASE("capture pool: replays keep private blocks intact and apart from ordinary ones", "[pool][capture]") {
    pool_type pool(pool_options{}, 0, device_bytes);
    custody_test::case_capture_replay_cookies(pool);
}
TEST_CASE("capture pool: two graphs share one private pool", "[pool][capture]") {
    pool_type pool(pool_options{}, 0, device_bytes);
    custody_test::case_shared_pool(pool);
}
TEST_CASE("capture pool: release is deferred while blocks are out and refused when nothing is held",
          "[pool][capture]") {
    pool_type pool(pool_options{}, 0, device_bytes);
    custody_test::case_release_rules(pool);
}
TEST_CASE("capture pool: a route abandoned by its release is ended, and trim collects its memory", "[pool][capture]") {
    pool_type pool(pool_options{}, 0, device_bytes);
    custody_test::case_abandoned_route(pool);
}
TEST_CASE("capture pool: ordinary allocations during a capture are unaffected and keep it valid", "[pool][capture]") {
    pool_type pool(pool_options{}, 0, device_bytes);
    custody_test::case_ordinary_during_capture(pool);
}
TEST_CASE("capture pool: forked streams share the capture's pool; unknown captures are refused", "[pool][capture]") {
    pool_type pool(pool_options{}, 0, device_bytes);
    custody_test::case_forked_and_unknown_streams(pool);
}
TEST_CASE("capture pool: check_capture = every_call refuses captures the pool was not told of", "[pool][capture]") {
    pool_options o;
    o.check_capture = custody::pool::capture_check::every_call;
    pool_type pool(o, 0, device_bytes);
    custody_test::case_every_call_check(pool);
}

TEST_CASE("capture pool: without a capture the pool asks nothing and an untold capture is not seen", "[pool][capture]") {
    // The default (capture_check::scopes): the host platform counts nothing, so the evidence is the
    // behaviour: an allocation on a stream captured behind the pool's back is served (the caller's
    // error, documented), where every_call refuses it.
    pool_type pool(pool_options{}, 0, device_bytes);
    custody::host::stream s;
    platform::begin_capture(s, capture_mode::relaxed);
    void* p = pool.allocate(s, 4096, 256);
    CHECK(p != nullptr);
    CHECK(pool.detailed_statistics().capture_live_block_bytes == 0);
    static_cast<void>(platform::end_capture(s));
    pool.deallocate(s, p, 4096, 256);
}

TEST_CASE("capture pool: a capture the pool was not told of never breaks another stream's allocation",
          "[pool][capture]") {
    // A stream captured behind the pool's back gives blocks back inside its capture: no event of the
    // pool may be recorded in that capture (another stream's query of it would fail), and another
    // stream that needs those blocks must get memory, not an exception.
    pool_options o;
    o.checked = false;
    o.record_interval = 4;
    o.growth_step = 64 * 1024;
    o.maximum_size = 64 * 1024; // one chunk: t must look at s's cache
    for (const auto policy : {custody::pool::reuse_policy::same_stream, custody::pool::reuse_policy::opportunistic,
                              custody::pool::reuse_policy::follow_dependencies}) {
        INFO("policy " << static_cast<int>(policy));
        o.reuse = policy;
        pool_type pool(o, 0, device_bytes);
        custody::host::stream s;
        custody::host::stream t;
        std::vector<void*> blocks;
        for (int i = 0; i < 16; ++i) blocks.push_back(pool.allocate(s, 4096, 256));
        platform::begin_capture(s, capture_mode::relaxed);
        for (void* p : blocks) pool.deallocate(s, p, 4096, 256);
        { const auto graph = platform::end_capture(s); } // dropped: never replayed
        std::vector<void*> taken;
        for (int i = 0; i < 8; ++i) REQUIRE_NOTHROW(taken.push_back(pool.allocate(t, 4096, 256)));
        for (void* p : taken) pool.deallocate(t, p, 4096, 256);
        REQUIRE_NOTHROW(pool.trim());
        CHECK(pool.statistics().live_allocations == 0);
        custody_test::check_identity(pool.detailed_statistics());
    }
}

namespace {
/// A device's memory as cudaMemGetInfo tells it: a potentially unsafe call while a capture is open,
/// which the host platform refuses (and invalidates the capture) outside a relaxed capture mode.
std::optional<custody::device_memory> unsafe_memory_info(int) {
    platform::check_unsafe_call("cudaMemGetInfo");
    return custody::device_memory{device_bytes, device_bytes};
}
} // namespace

TEST_CASE("capture pool: the first growth of a capture asks the device's memory under a relaxed mode only",
          "[pool][capture]") {
    pool_options o;
    o.memory_info = &unsafe_memory_info;
    o.device_headroom = 0;
    pool_type pool(o, 0, device_bytes);
    custody::host::stream s;
    capture_scope scope(pool, s); // global mode: a potentially unsafe call outside relaxed breaks it
    void* p = pool.allocate(s, 4096, 256); // the private pool's first chunk, after asking the device
    platform::memset_async(p, 0x61, 4096, s);
    CHECK(platform::query_capture(s).status == capture_status::active);
    custody::pool::captured_graph g = scope.end();
    g.launch(s);
    CHECK(custody_test::holds_cookie<platform>(s, p, 4096, 0x61));
    pool.deallocate(s, p, 4096, 256);
    g.reset();
}

TEST_CASE("capture pool: failures injected during a capture leave the pool and the capture as they were",
          "[pool][capture]") {
    faulty_pool pool(pool_options{}, 0, device_bytes);
    custody::host::stream s;
    capture_scope scope(pool, s);
    void* first = pool.allocate(s, 4096, 256); // the private pool's first chunk
    platform::memset_async(first, 0x7E, 4096, s);
    custody::host::stream t; // an ordinary stream with a block given back and not yet covered
    pool.deallocate(t, pool.allocate(t, 4096, 256), 4096, 256);
    const auto before = pool.detailed_statistics();
    pool.upstream().fail_at(1, true);
    CHECK_THROWS_AS(pool.allocate(s, std::size_t{8} << 20, 256), custody::out_of_memory); // needs a chunk
    CHECK_THROWS_AS(pool.allocate(s, std::size_t{64} << 20, 4096), custody::out_of_memory);
    const auto after = pool.detailed_statistics();
    CHECK(after.totals.live_bytes == before.totals.live_bytes);
    CHECK(after.totals.allocations == before.totals.allocations);
    CHECK(after.totals.reserved_bytes == before.totals.reserved_bytes);
    CHECK(after.capture_free_bytes == before.capture_free_bytes);
    custody_test::check_identity(after);
    CHECK(platform::query_capture(s).status == capture_status::active);
    // An ordinary allocation on another stream that cannot grow either: out_of_memory without the
    // last resort's waits (a device synchronization here: they would break the capture).
    CHECK_THROWS_AS(pool.allocate(t, std::size_t{16} << 20, 256), custody::out_of_memory);
    CHECK(pool.detailed_statistics().reclaims == before.reclaims);
    CHECK(platform::query_capture(s).status == capture_status::active);
    void* fits = pool.allocate(s, 4096, 256); // the chunk it has still serves
    CHECK(fits != nullptr);
    pool.upstream().disarm();
    void* grown = pool.allocate(s, std::size_t{8} << 20, 256);
    platform::memset_async(grown, 0x7F, std::size_t{8} << 20, s);
    custody::pool::captured_graph g = scope.end();
    g.launch(s);
    CHECK(custody_test::holds_cookie<platform>(s, first, 4096, 0x7E));
    CHECK(custody_test::holds_cookie<platform>(s, grown, std::size_t{8} << 20, 0x7F));
    pool.deallocate(s, first, 4096, 256);
    pool.deallocate(s, fits, 4096, 256);
    pool.deallocate(s, grown, std::size_t{8} << 20, 256);
    g.reset();
    CHECK(pool.detailed_statistics().capture_reserved_bytes == 0);
}

TEST_CASE("capture pool: a scope left by an exception ends the capture and releases its pool", "[pool][capture]") {
    pool_type pool(pool_options{}, 0, device_bytes);
    custody::host::stream s;
    void* kept = nullptr;
    try {
        capture_scope scope(pool, s);
        kept = pool.allocate(s, 4096, 256);
        throw std::runtime_error("step failed");
    } catch (const std::runtime_error&) {
    }
    CHECK_FALSE(platform::is_capturing(s));
    CHECK(pool.detailed_statistics().capture_reserved_bytes != 0); // kept is still out
    pool.deallocate(s, kept, 4096, 256);
    CHECK(pool.detailed_statistics().capture_reserved_bytes == 0);
    // An invalidated capture: end() throws, the scope is over and its pool released.
    capture_scope broken(pool, s);
    void* lost = pool.allocate(s, 4096, 256);
    CHECK_THROWS_AS(platform::synchronize(s), custody::capture_violation);
    CHECK_THROWS_AS(broken.end(), custody::capture_violation);
    pool.deallocate(s, lost, 4096, 256);
    CHECK(pool.detailed_statistics().capture_reserved_bytes == 0);
    CHECK(pool.detailed_statistics().capture_pools == 0);
}

TEST_CASE("capture pool: threads allocate while others capture, each capture keeps its own memory", "[pool][capture]") {
    pool_type pool(pool_options{}, 0, device_bytes);
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k) {
        threads.emplace_back([&, k] {
            custody::host::stream s;
            const auto cookie = static_cast<unsigned char>(0x30 + k);
            for (int round = 0; round < 10; ++round) {
                if (k % 2 == 0) { // a capturing thread (per_thread mode: the others may grow meanwhile)
                    capture_scope scope(pool, s, capture_mode::per_thread);
                    void* p = pool.allocate(s, 2048 + 256 * static_cast<std::size_t>(k), 256);
                    platform::memset_async(p, cookie, 2048, s);
                    custody::pool::captured_graph g = scope.end();
                    g.launch(s);
                    if (!custody_test::holds_cookie<platform>(s, p, 2048, cookie)) bad.fetch_add(1);
                    pool.deallocate(s, p, 2048 + 256 * static_cast<std::size_t>(k), 256);
                } else {
                    void* p = pool.allocate(s, std::size_t{1} << (12 + round % 10), 256);
                    platform::memset_async(p, cookie, 2048, s);
                    if (!custody_test::holds_cookie<platform>(s, p, 2048, cookie)) bad.fetch_add(1);
                    pool.deallocate(s, p, std::size_t{1} << (12 + round % 10), 256);
                }
            }
        });
    }
    for (auto& t : threads) t.join();
    CHECK(bad.load() == 0);
    const auto p = pool.detailed_statistics();
    CHECK(p.capture_reserved_bytes == 0);
    CHECK(p.totals.live_allocations == 0);
    custody_test::check_identity(p);
}

TEST_CASE("address_ranges: lookups while ranges come and go", "[pool][capture]") {
    custody::pool::detail::address_ranges ranges;
    CHECK_FALSE(ranges.contains(100));
    for (std::uintptr_t i = 0; i < 40; ++i) ranges.insert(1000 + i * 100, 1000 + i * 100 + 50);
    CHECK(ranges.size() == 40);
    CHECK(ranges.contains(1000));
    CHECK(ranges.contains(1049));
    CHECK_FALSE(ranges.contains(1050));
    CHECK_FALSE(ranges.contains(999));
    CHECK(ranges.contains(1000 + 39 * 100 + 10));
    ranges.erase(1000 + 5 * 100);
    CHECK_FALSE(ranges.contains(1000 + 5 * 100 + 1));
    CHECK(ranges.contains(1000 + 6 * 100 + 1));
    // A reader searching a range that never changes while a writer adds and removes others.
    std::atomic<bool> stop{false};
    std::atomic<int> misses{0};
    std::thread reader([&] {
        while (!stop.load()) {
            if (!ranges.contains(1000 + 7 * 100 + 3)) misses.fetch_add(1);
            if (ranges.contains(1000 + 7 * 100 + 60)) misses.fetch_add(1);
        }
    });
    for (std::uintptr_t i = 0; i < 2000; ++i) {
        ranges.insert(100000 + i * 10, 100000 + i * 10 + 5);
        if (i % 3 == 0) ranges.erase(100000 + (i / 2) * 10);
    }
    stop.store(true);
    reader.join();
    CHECK(misses.load() == 0);
}
