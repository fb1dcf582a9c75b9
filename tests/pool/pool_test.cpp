// pool/: the stream-ordered pool beyond the contract suite: rounding, growth and trim, cross-stream
// reuse under each policy, limits, failure diagnostics, fault injection at every upstream call, a
// seeded model test and concurrent use.
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

using custody::host::platform;
using custody::pool::pool_options;
using custody::pool::reuse_policy;
using custody::pool::stream_ordered_pool;
using custody::resource::fault_injecting;
using custody::resource::host_memory;
using custody::host::simulated_device_memory;
namespace detail = custody::pool::detail;

static_assert(custody::try_allocatable_resource<host_memory>);
static_assert(custody::stream_ordered_resource<stream_ordered_pool<host_memory>>);
static_assert(custody::resource_with_statistics<stream_ordered_pool<host_memory>>);
static_assert(custody::device_bound_resource<stream_ordered_pool<simulated_device_memory>>);
static_assert(custody::has_property<stream_ordered_pool<simulated_device_memory>, custody::device_accessible>);
static_assert(custody::has_property<stream_ordered_pool<host_memory>, custody::host_accessible>);
static_assert(!std::is_copy_constructible_v<stream_ordered_pool<host_memory>> &&
              !std::is_move_constructible_v<stream_ordered_pool<host_memory>>);

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * 1024;

/// The accounting identity of pool_statistics, which must hold whenever no call is in flight.
template <class Pool>
void check_accounting(const Pool& pool) {
    const auto p = pool.detailed_statistics();
    INFO("reserved " << p.totals.reserved_bytes << " live blocks " << p.live_block_bytes << " cached "
                     << p.stream_cached_bytes << " shared " << p.shared_free_bytes << " quarantined "
                     << p.quarantined_bytes);
    CHECK(p.totals.reserved_bytes ==
          p.live_block_bytes + p.stream_cached_bytes + p.shared_free_bytes + p.quarantined_bytes);
    CHECK(p.live_block_bytes >= p.totals.live_bytes);
    CHECK(p.totals.live_allocations == p.totals.allocations - p.totals.deallocations);
    CHECK(p.totals.peak_reserved_bytes >= p.totals.reserved_bytes);
    CHECK(p.totals.peak_live_bytes >= p.totals.live_bytes);
}

/// Collects what the pool reports through custody::report_failure.
struct failure_log {
    static std::vector<std::string>& lines() {
        static std::vector<std::string> l;
        return l;
    }
    static std::mutex& mutex() {
        static std::mutex m;
        return m;
    }
    static void callback(std::string_view message) noexcept {
        std::lock_guard lock(mutex());
        try {
            lines().emplace_back(message);
        } catch (...) {
        }
    }
    failure_log() {
        lines().clear();
        previous_ = custody::set_failure_callback(&callback);
    }
    ~failure_log() { custody::set_failure_callback(previous_); }
    failure_log(const failure_log&) = delete;
    failure_log& operator=(const failure_log&) = delete;
    custody::failure_callback previous_;
};

} // namespace

// ---- rounding ------------------------------------------------------------------------------------

TEST_CASE("size classes cover every small size with at most 1/16 waste", "[pool][classes]") {
    std::size_t previous_class = 0;
    for (std::size_t n = 1; n <= detail::small_threshold; ++n) {
        const std::size_t c = detail::class_of(n);
        const std::size_t size = detail::class_size(c);
        REQUIRE(c < detail::class_count);
        REQUIRE(size >= n);
        REQUIRE(size % detail::granule == 0);
        REQUIRE(c >= previous_class); // monotone
        if (c > 0) REQUIRE(detail::class_size(c - 1) < n); // the smallest class that fits
        if (n > 4096) REQUIRE((size - n) * 16 <= n);
        previous_class = c;
    }
    for (std::size_t c = 0; c < detail::class_count; ++c) CHECK(detail::class_of(detail::class_size(c)) == c);
    CHECK(detail::block_size(detail::small_threshold + 1) == detail::small_threshold + detail::granule);
    CHECK(detail::block_size(3 * MiB + 5) == 3 * MiB + 256);
}

// ---- the free set --------------------------------------------------------------------------------

TEST_CASE("free_set finds the best fit, splits, honours alignment and coalesces within a chunk", "[pool][free_set]") {
    detail::free_set set;
    const std::uintptr_t a = 0x100000, b = 0x200000; // two chunks of 64 KiB, not adjacent
    set.insert({a, 64 * KiB, a});
    set.insert({b, 16 * KiB, b});
    CHECK(set.bytes() == 80 * KiB);
    CHECK(set.largest() == 64 * KiB);
    // Best fit: 8 KiB comes from the 16 KiB block.
    auto x = set.take(8 * KiB, 256);
    CHECK(x.address == b);
    CHECK(x.chunk == b);
    CHECK(set.bytes() == 72 * KiB);
    // Alignment: a 4 KiB block at a 64 KiB boundary leaves a front and a back piece.
    auto y = set.take(4 * KiB, 64 * KiB);
    REQUIRE(y.size == 4 * KiB);
    CHECK(y.address % (64 * KiB) == 0);
    // Giving everything back coalesces each chunk into one block again, never across chunks.
    set.insert(x);
    set.insert(y);
    CHECK(set.count() == 2);
    CHECK(set.bytes() == 80 * KiB);
    CHECK(set.largest() == 64 * KiB);
    // Adjacent chunks do not merge.
    detail::free_set adjacent;
    adjacent.insert({a, 4 * KiB, a});
    adjacent.insert({a + 4 * KiB, 4 * KiB, a + 4 * KiB});
    CHECK(adjacent.count() == 2);
    // Nothing fits: a zero block and no change.
    CHECK(set.take(65 * KiB, 256).size == 0);
    CHECK(set.bytes() == 80 * KiB);
    std::map<std::uintptr_t, std::size_t> chunks{{a, 64 * KiB}, {b, 32 * KiB}};
    std::size_t released = 0;
    set.take_whole_chunks(
        [&](std::uintptr_t address, std::size_t size) {
            auto c = chunks.find(address);
            return c != chunks.end() && c->second == size;
        },
        [&](const detail::free_block& f) { released += f.size; });
    CHECK(released == 64 * KiB); // b's block is not its whole chunk
    CHECK(set.bytes() == 16 * KiB);
}

// ---- growth, reuse, trim, destruction ------------------------------------------------------------

TEST_CASE("the pool grows in chunks, reuses on the fast path and trims what is wholly free", "[pool]") {
    pool_options o;
    o.initial_size = 4 * MiB;
    o.growth_step = 2 * MiB;
    stream_ordered_pool<simulated_device_memory> pool(o, 0, 64 * MiB);
    CHECK(pool.statistics().reserved_bytes == 4 * MiB);
    CHECK(pool.upstream().used() == 4 * MiB);
    custody::host::stream s;
    // Size-class blocks come from chunks of their own: the first takes a growth step.
    void* p = pool.allocate(s, 1000, 256);
    CHECK(pool.statistics().reserved_bytes == 6 * MiB);
    pool.deallocate(s, p, 1000, 256);
    void* q = pool.allocate(s, 900, 256); // same class (1024), same stream: the same block
    CHECK(q == p);
    // Large blocks come from the initial chunk while it has room...
    void* big = pool.allocate(s, 3 * MiB, 256);
    CHECK(pool.statistics().reserved_bytes == 6 * MiB);
    CHECK(pool.detailed_statistics().chunks == 2);
    // ...then from a chunk of their own, rounded up to 2 MiB, when larger than the growth step.
    void* big2 = pool.allocate(s, 3 * MiB, 256);
    CHECK(pool.statistics().reserved_bytes == 10 * MiB);
    CHECK(pool.detailed_statistics().chunks == 3);
    CHECK(pool.detailed_statistics().upstream_allocations == 3);
    check_accounting(pool);
    pool.deallocate(s, big, 3 * MiB, 256);
    pool.deallocate(s, big2, 3 * MiB, 256);
    CHECK(pool.trim() == 8 * MiB); // the two large chunks are wholly free; the small one holds q
    CHECK(pool.statistics().reserved_bytes == 2 * MiB);
    CHECK(pool.upstream().used() == 2 * MiB);
    pool.deallocate(s, q, 900, 256);
    CHECK(pool.trim() == 2 * MiB);
    CHECK(pool.statistics().reserved_bytes == 0);
    CHECK(pool.upstream().used() == 0);
    check_accounting(pool);
}

TEST_CASE("chunks grow with the pool: growth_step, then reserved / growth_divisor", "[pool]") {
    pool_options o;
    o.growth_step = 1 * MiB;
    o.growth_divisor = 4;
    stream_ordered_pool<host_memory> pool(o);
    std::vector<void*> blocks;
    for (int i = 0; i < 16; ++i) blocks.push_back(pool.allocate_sync(1 * MiB + 4096, 256)); // large kind
    const auto p = pool.detailed_statistics();
    // Sizes: 2 MiB (own size, rounded) while reserved / 4 < 2 MiB, then reserved / 4 rounded down
    // to whole 2 MiB pages (4 MiB at 16 MiB reserved, holding three blocks), ...
    CHECK(p.chunks < 16);
    CHECK(p.totals.reserved_bytes >= 16 * (MiB + 4096));
    for (void* b : blocks) pool.deallocate_sync(b, 1 * MiB + 4096, 256);
    check_accounting(pool);
}

TEST_CASE("chunks sized by the growth divisor are whole 2 MiB pages", "[pool]") {
    pool_options o;
    o.growth_step = 2 * MiB;
    o.growth_divisor = 4;
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream s;
    std::vector<void*> blocks;
    // Size-class blocks of 64 KiB: every growth takes a chunk sized by the divisor alone. Unrounded,
    // 10 MiB reserved would take 2.5 MiB next; rounded down, 2 MiB.
    while (pool.statistics().reserved_bytes < 40 * MiB) {
        blocks.push_back(pool.allocate(s, 64 * KiB, 256));
        CHECK(pool.statistics().reserved_bytes % (2 * MiB) == 0);
    }
    CHECK(pool.detailed_statistics().chunks < 20); // chunks still grow with the pool
    for (void* b : blocks) pool.deallocate(s, b, 64 * KiB, 256);
    check_accounting(pool);
}

TEST_CASE("the rest of a large block's chunk stays beside it on its stream, so the chunk comes back whole",
          "[pool]") {
    pool_options o;
    o.growth_step = 2 * MiB;
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream s;
    // A 1.5 MiB block takes a 2 MiB chunk; the 0.5 MiB behind it can serve no large request alone.
    void* a = pool.allocate(s, 3 * MiB / 2, 256);
    auto p = pool.detailed_statistics();
    CHECK(p.totals.reserved_bytes == 2 * MiB);
    CHECK(p.shared_free_bytes == 0);
    CHECK(p.stream_cached_bytes == MiB / 2); // kept by the stream, not the shared set
    check_accounting(pool);
    pool.deallocate(s, a, 3 * MiB / 2, 256);
    // The block and the rest join again: the whole chunk serves a larger request without growing.
    void* b = pool.allocate(s, 2 * MiB, 256);
    CHECK(b == a);
    CHECK(pool.statistics().reserved_bytes == 2 * MiB);
    check_accounting(pool);
    pool.deallocate(s, b, 2 * MiB, 256);
    CHECK(pool.trim() == 2 * MiB);
    check_accounting(pool);
}

TEST_CASE("large blocks are split and their free neighbours coalesced", "[pool]") {
    pool_options o;
    o.growth_step = 8 * MiB;
    o.maximum_size = 8 * MiB; // the 7 MiB below can only be a, b and c joined
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream s;
    void* a = pool.allocate(s, 2 * MiB, 256);
    void* b = pool.allocate(s, 3 * MiB, 256);
    void* c = pool.allocate(s, 2 * MiB, 256);
    CHECK(static_cast<char*>(b) == static_cast<char*>(a) + 2 * MiB);
    CHECK(static_cast<char*>(c) == static_cast<char*>(b) + 3 * MiB);
    pool.deallocate(s, a, 2 * MiB, 256);
    pool.deallocate(s, c, 2 * MiB, 256);
    pool.deallocate(s, b, 3 * MiB, 256); // joins a and c
    void* d = pool.allocate(s, 7 * MiB, 256);
    CHECK(d == a);
    CHECK(pool.detailed_statistics().chunks == 1);
    pool.deallocate(s, d, 7 * MiB, 256);
    // A large block given back and asked for again at its size comes back at once.
    void* e = pool.allocate(s, 7 * MiB, 256);
    CHECK(e == d);
    pool.deallocate(s, e, 7 * MiB, 256);
    check_accounting(pool);
}

TEST_CASE("destruction gives every chunk back and reports blocks still out", "[pool]") {
    failure_log log;
    auto pool = std::make_unique<stream_ordered_pool<simulated_device_memory>>(pool_options{}, 0, 256 * MiB);
    void* p = pool->allocate_sync(4000, 256);
    REQUIRE(p != nullptr);
    const auto& upstream = pool->upstream();
    CHECK(upstream.used() == 2 * MiB); // one chunk of the default growth step
    pool.reset();
    REQUIRE(failure_log::lines().size() == 1);
    CHECK(failure_log::lines()[0].find("1 blocks (4000 bytes) still allocated") != std::string::npos);
}

TEST_CASE("a clean pool reports nothing when destroyed", "[pool]") {
    failure_log log;
    {
        stream_ordered_pool<host_memory> pool;
        custody::host::stream s;
        void* p = pool.allocate(s, 100, 256);
        pool.deallocate(s, p, 100, 256);
    }
    CHECK(failure_log::lines().empty());
}

// ---- bad inputs ----------------------------------------------------------------------------------

TEST_CASE("bad alignments and streams of another device are invalid_argument and change nothing", "[pool]") {
    stream_ordered_pool<simulated_device_memory> pool(pool_options{}, 2, 64 * MiB);
    custody::host::stream own(2);
    void* held = pool.allocate(own, 5000, 256);
    const auto before = pool.detailed_statistics();
    for (std::size_t a : {std::size_t{0}, std::size_t{3}, std::size_t{96}, std::size_t{8192}}) {
        CHECK_THROWS_AS(pool.allocate(own, 64, a), std::invalid_argument);
    }
    custody::host::stream other(5);
    CHECK_THROWS_AS(pool.allocate(other, 64, 256), std::invalid_argument);
    const auto after = pool.detailed_statistics();
    CHECK(after.totals == before.totals);
    CHECK(after.streams == before.streams);
    pool.deallocate(own, held, 5000, 256);
    pool_options zero;
    zero.max_streams = 0;
    CHECK_THROWS_AS(stream_ordered_pool<host_memory>(zero), std::invalid_argument);
}

TEST_CASE("alignments up to a page are served from the size classes and the large path", "[pool]") {
    stream_ordered_pool<host_memory> pool;
    custody::host::stream s;
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (std::size_t a = 256; a <= 4096; a *= 2) {
        for (std::size_t n : {std::size_t{300}, std::size_t{70000}, 2 * MiB + 1}) {
            void* p = pool.allocate(s, n, a);
            CHECK(custody::is_aligned(p, a));
            std::memset(p, 0x11, n);
            blocks.emplace_back(p, n);
        }
    }
    for (auto [p, n] : blocks) pool.deallocate(s, p, n, 256);
    // A page-aligned request can skip cached blocks that are not page-aligned.
    void* q = pool.allocate(s, 300, 4096);
    CHECK(custody::is_aligned(q, 4096));
    pool.deallocate(s, q, 300, 4096);
    check_accounting(pool);
}

// ---- cross-stream reuse ---------------------------------------------------------------------------

namespace {

/// A pool whose every block of `n` bytes fills one chunk, so the only way to serve a second block
/// without growing is to reuse the first.
/// A pool of `chunks` chunks of `n` bytes whose streams record their event at every free, so that
/// each free is at once visible to other streams as the policy allows.
pool_options tight(reuse_policy policy, std::size_t n, std::size_t chunks) {
    pool_options o;
    o.reuse = policy;
    o.record_interval = 1;
    o.growth_step = n;
    o.maximum_size = n * chunks;
    return o;
}

} // namespace

TEST_CASE("follow_dependencies hands a busy stream's block to another stream only behind its work",
          "[pool][streams]") {
    constexpr std::size_t n = 64 * KiB;
    stream_ordered_pool<host_memory> pool(tight(reuse_policy::follow_dependencies, n, 1));
    custody::host::stream a;
    custody::host::stream b;
    void* p = pool.allocate(a, n, 256);
    custody::test::stream_gate<platform> gate(a); // a is busy until the gate opens
    platform::memset_async(p, 0xAA, n, a);        // pending work that still uses p
    pool.deallocate(a, p, n, 256);
    void* q = pool.allocate(b, n, 256); // the pool is full: only p can serve, behind a's work
    CHECK(q == p);
    CHECK(pool.detailed_statistics().dependency_waits == 1);
    platform::memset_async(q, 0x55, n, b); // must run after a's 0xAA
    gate.open();
    platform::synchronize(b);
    std::vector<unsigned char> expected(n, 0x55);
    CHECK(std::memcmp(q, expected.data(), n) == 0);
    pool.deallocate(b, q, n, 256);
    platform::synchronize(a);
    check_accounting(pool);
}

TEST_CASE("opportunistic reuse takes another stream's block only once its event completed", "[pool][streams]") {
    constexpr std::size_t n = 64 * KiB;
    stream_ordered_pool<host_memory> pool(tight(reuse_policy::opportunistic, n, 2));
    custody::host::stream a;
    custody::host::stream b;
    void* p = pool.allocate(a, n, 256);
    void* q = nullptr;
    {
        custody::test::stream_gate<platform> gate(a);
        platform::memset_async(p, 0xAA, n, a);
        pool.deallocate(a, p, n, 256);
        q = pool.allocate(b, n, 256); // a's work is pending: b gets a new chunk
        CHECK(q != p);
        CHECK(pool.detailed_statistics().opportunistic_reuses == 0);
        CHECK(pool.detailed_statistics().dependency_waits == 0);
    }
    platform::synchronize(a);
    void* r = pool.allocate(b, n, 256); // the limit is reached; a's event has completed: p
    CHECK(r == p);
    CHECK(pool.detailed_statistics().opportunistic_reuses == 1);
    pool.deallocate(b, q, n, 256);
    pool.deallocate(b, r, n, 256);
    check_accounting(pool);
}

TEST_CASE("same_stream never reuses across streams until the last resort has waited", "[pool][streams]") {
    constexpr std::size_t n = 64 * KiB;
    stream_ordered_pool<host_memory> pool(tight(reuse_policy::same_stream, n, 2));
    custody::host::stream a;
    custody::host::stream b;
    void* p = pool.allocate(a, n, 256);
    {
        custody::test::stream_gate<platform> gate(a);
        platform::memset_async(p, 0xAA, n, a);
        pool.deallocate(a, p, n, 256);
        void* q = pool.allocate(b, n, 256);
        CHECK(q != p);
        pool.deallocate(b, q, n, 256);
    }
    platform::synchronize(a);
    // Even with a's work done, b reuses only its own block...
    void* q = pool.allocate(b, n, 256);
    void* r = pool.allocate(b, 2 * n - n, 256);
    CHECK(q != p);
    // ...and p only when nothing else is left: the reclaim waits for a's event on the host.
    CHECK(r == p);
    CHECK(pool.detailed_statistics().reclaims == 1);
    CHECK(pool.detailed_statistics().opportunistic_reuses == 0);
    pool.deallocate(b, q, n, 256);
    pool.deallocate(b, r, n, 256);
    check_accounting(pool);
}

TEST_CASE("under every policy a block freed on a busy stream is never written by another stream early",
          "[pool][streams]") {
    for (auto policy : {reuse_policy::same_stream, reuse_policy::opportunistic, reuse_policy::follow_dependencies}) {
        INFO("policy " << static_cast<int>(policy));
        constexpr std::size_t n = 4096;
        stream_ordered_pool<host_memory> pool(tight(policy, 64 * KiB, 4));
        custody::host::stream a;
        custody::host::stream b;
        std::vector<void*> from_a;
        for (int i = 0; i < 16; ++i) from_a.push_back(pool.allocate(a, n, 256));
        custody::test::stream_gate<platform> gate(a);
        for (void* p : from_a) {
            platform::memset_async(p, 0xAA, n, a);
            pool.deallocate(a, p, n, 256);
        }
        // b takes many blocks and writes them; any block of a's it got early would end as 0xAA.
        std::vector<void*> from_b;
        for (int i = 0; i < 48; ++i) {
            void* q = pool.allocate(b, n, 256);
            platform::memset_async(q, 0x55, n, b);
            from_b.push_back(q);
        }
        gate.open();
        platform::synchronize(a);
        platform::synchronize(b);
        std::vector<unsigned char> expected(n, 0x55);
        int clobbered = 0;
        for (void* q : from_b) clobbered += std::memcmp(q, expected.data(), n) != 0 ? 1 : 0;
        CHECK(clobbered == 0);
        for (void* q : from_b) pool.deallocate(b, q, n, 256);
        check_accounting(pool);
    }
}

TEST_CASE("blocks given back since a stream's last record serve no other stream until a record covers them",
          "[pool][streams][record]") {
    constexpr std::size_t n = 4 * KiB, chunk = 256 * KiB, per_chunk = chunk / n;
    pool_options o;
    o.reuse = reuse_policy::follow_dependencies;
    o.growth_step = chunk;
    o.maximum_size = 2 * chunk;
    REQUIRE(o.record_interval == per_chunk); // the default: one record per 64 frees
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream a;
    custody::host::stream b;
    std::set<void*> from_a;
    for (std::size_t i = 0; i < per_chunk; ++i) from_a.insert(pool.allocate(a, n, 256));
    custody::test::stream_gate<platform> gate(a);
    auto next = from_a.begin();
    for (std::size_t i = 0; i + 1 < per_chunk; ++i, ++next) { // 63 frees: none recorded yet
        platform::memset_async(*next, 0xAA, n, a);
        pool.deallocate(a, *next, n, 256);
    }
    std::vector<void*> from_b;
    for (std::size_t i = 0; i < per_chunk; ++i) { // the second chunk, not a's blocks
        from_b.push_back(pool.allocate(b, n, 256));
        CHECK(from_a.count(from_b.back()) == 0);
    }
    CHECK(pool.detailed_statistics().dependency_waits == 0);
    platform::memset_async(*next, 0xAA, n, a);
    pool.deallocate(a, *next, n, 256); // the 64th free records a's event: all 64 are covered
    void* q = pool.allocate(b, n, 256); // the pool is full: a covered block of a's, behind a's work
    CHECK(from_a.count(q) == 1);
    CHECK(pool.detailed_statistics().dependency_waits == 1);
    platform::memset_async(q, 0x55, n, b);
    gate.open();
    platform::synchronize(b);
    std::vector<unsigned char> expected(n, 0x55);
    CHECK(std::memcmp(q, expected.data(), n) == 0);
    for (void* p : from_b) pool.deallocate(b, p, n, 256);
    pool.deallocate(b, q, n, 256);
    platform::synchronize(a);
    check_accounting(pool);
}

TEST_CASE("a record_interval of 0 is taken as 1: every free is covered at once", "[pool][streams][record]") {
    constexpr std::size_t n = 64 * KiB;
    pool_options o;
    o.growth_step = n;
    o.maximum_size = n;
    o.record_interval = 0;
    stream_ordered_pool<host_memory> pool(o);
    CHECK(pool.options().record_interval == 1);
    custody::host::stream a;
    custody::host::stream b;
    void* p = pool.allocate(a, n, 256);
    pool.deallocate(a, p, n, 256);
    void* q = pool.allocate(b, n, 256); // covered: a's event (complete) hands it over, no reclaim
    CHECK(q == p);
    CHECK(pool.detailed_statistics().opportunistic_reuses == 1);
    CHECK(pool.detailed_statistics().reclaims == 0);
    pool.deallocate(b, q, n, 256);
    platform::synchronize(a);
    check_accounting(pool);
}

TEST_CASE("a stream records as soon as the bytes given back since its last record reach record_bytes",
          "[pool][streams][record]") {
    constexpr std::size_t n = 3 * MiB;
    pool_options o;
    o.growth_step = 4 * MiB;
    o.maximum_size = 12 * MiB;
    o.record_bytes = 4 * MiB;
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream a;
    custody::host::stream b;
    void* p1 = pool.allocate(a, n, 256);
    void* p2 = pool.allocate(a, n, 256);
    custody::test::stream_gate<platform> gate(a);
    platform::memset_async(p1, 0xAA, n, a);
    platform::memset_async(p2, 0xAA, n, a);
    pool.deallocate(a, p1, n, 256); // 3 MiB since the last record: not covered
    void* q1 = pool.allocate(b, n, 256); // a new chunk, not p1
    CHECK(q1 != p1);
    CHECK(pool.detailed_statistics().dependency_waits == 0);
    pool.deallocate(a, p2, n, 256); // 6 MiB: a's event is recorded, covering p1 and p2
    void* q2 = pool.allocate(b, n, 256); // the limit is reached: p1 or p2, behind a's work
    CHECK((q2 == p1 || q2 == p2));
    CHECK(pool.detailed_statistics().dependency_waits == 1);
    platform::memset_async(q2, 0x55, n, b);
    gate.open();
    platform::synchronize(b);
    const auto* bytes = static_cast<const unsigned char*>(q2);
    CHECK(bytes[0] == 0x55);
    CHECK(bytes[n - 1] == 0x55);
    pool.deallocate(b, q1, n, 256);
    pool.deallocate(b, q2, n, 256);
    platform::synchronize(a);
    check_accounting(pool);
}

TEST_CASE("the last resort takes blocks no record covers after synchronizing the device, stream gone or busy",
          "[pool][streams][record][oom]") {
    constexpr std::size_t n = 64 * KiB;
    for (bool stream_gone : {true, false}) {
        INFO("stream gone " << stream_gone);
        pool_options o;
        o.growth_step = n;
        o.maximum_size = n;
        stream_ordered_pool<host_memory> pool(o);
        custody::host::stream b;
        std::optional<custody::host::stream> a(std::in_place);
        void* p = pool.allocate(*a, n, 256);
        std::optional<custody::test::stream_gate<platform>> gate(std::in_place, *a);
        platform::memset_async(p, 0xAA, n, *a);
        pool.deallocate(*a, p, n, 256); // not covered: no record yet
        std::thread opener;
        if (stream_gone) {
            opener = std::thread([&] {
                gate->open();
                gate.reset();
                a.reset(); // the stream ends once its work has run
            });
            opener.join();
        } else {
            opener = std::thread([&] { gate->open(); }); // a's work runs while b waits for the device
        }
        void* q = pool.allocate(b, n, 256); // only p can serve: after the device is synchronized
        if (opener.joinable()) opener.join();
        CHECK(q == p);
        CHECK(pool.detailed_statistics().reclaims == 1);
        platform::memset_async(q, 0x55, n, b);
        platform::synchronize(b);
        std::vector<unsigned char> expected(n, 0x55);
        CHECK(std::memcmp(q, expected.data(), n) == 0);
        pool.deallocate(b, q, n, 256);
        gate.reset();
        a.reset();
        check_accounting(pool);
    }
}

TEST_CASE("streams beyond max_streams are served without a shard", "[pool][streams]") {
    pool_options o;
    o.max_streams = 1;
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream a;
    custody::host::stream b;
    void* p = pool.allocate(a, 1000, 256);
    void* q = pool.allocate(b, 1000, 256); // no shard for b
    CHECK(pool.detailed_statistics().streams == 1);
    {
        custody::test::stream_gate<platform> gate(b);
        platform::memset_async(q, 0x55, 1000, b);
        std::thread opener([&] { gate.open(); });
        pool.deallocate(b, q, 1000, 256); // waits for b's work, then the block is shared
        opener.join();
    }
    pool.deallocate(a, p, 1000, 256);
    const auto s = pool.statistics();
    CHECK(s.live_allocations == 0);
    CHECK(s.live_bytes == 0);
    check_accounting(pool);
}

// ---- limits and failure ---------------------------------------------------------------------------

TEST_CASE("out_of_memory comes after a reclaim, says why, and leaves live blocks as they were", "[pool][oom]") {
    pool_options o;
    o.growth_step = 1 * MiB;
    o.maximum_size = 4 * MiB;
    stream_ordered_pool<simulated_device_memory> pool(o, 0, 64 * MiB);
    custody::host::stream a;
    custody::host::stream b;
    void* x = pool.allocate(a, 3 * MiB, 256);
    void* y = pool.allocate(b, 512 * KiB, 256);
    void* z = pool.allocate(b, 100 * KiB, 256);
    pool.deallocate(b, z, 100 * KiB, 256);
    const auto before = pool.statistics();
    try {
        static_cast<void>(pool.allocate(a, 2 * MiB, 256));
        FAIL("2 MiB fit in a pool limited to 4 MiB with 3.5 MiB live");
    } catch (const custody::out_of_memory& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(e.requested() == 2 * MiB);
        CHECK(what.find("largest free block") != std::string::npos);
        CHECK(what.find("free per stream") != std::string::npos);
        CHECK(what.find("fragmentation") != std::string::npos);
        CHECK(what.find("reserved") != std::string::npos);
        CHECK(e.statistics().live_bytes == before.live_bytes);
    }
    const auto after = pool.statistics();
    CHECK(after.live_bytes == before.live_bytes);
    CHECK(after.live_allocations == before.live_allocations);
    CHECK(after.allocations == before.allocations);
    CHECK(pool.detailed_statistics().reclaims == 1);
    CHECK(pool.detailed_statistics().failures == 1);
    check_accounting(pool);
    // A request above the limit fails at once, without a reclaim.
    CHECK_THROWS_AS(pool.allocate(a, 5 * MiB, 256), custody::out_of_memory);
    CHECK(pool.detailed_statistics().reclaims == 1);
    pool.deallocate(a, x, 3 * MiB, 256);
    pool.deallocate(b, y, 512 * KiB, 256);
    void* w = pool.allocate(a, 2 * MiB, 256); // and it works again once memory is free
    pool.deallocate(a, w, 2 * MiB, 256);
    check_accounting(pool);
}

TEST_CASE("the reclaim coalesces blocks cached by different streams", "[pool][oom]") {
    pool_options o;
    o.growth_step = 4 * MiB;
    o.maximum_size = 4 * MiB;
    o.reuse = reuse_policy::same_stream;
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream a;
    custody::host::stream b;
    void* p = pool.allocate(a, 2 * MiB, 256);
    void* q = pool.allocate(b, 2 * MiB, 256);
    pool.deallocate(a, p, 2 * MiB, 256);
    pool.deallocate(b, q, 2 * MiB, 256);
    void* r = pool.allocate(a, 4 * MiB, 256); // only the two halves joined can serve it
    CHECK(r == std::min(p, q));
    pool.deallocate(a, r, 4 * MiB, 256);
    check_accounting(pool);
}

TEST_CASE("the device budget keeps headroom, from a capacity or a memory query", "[pool][limits]") {
    {
        pool_options o;
        o.growth_step = 1 * MiB;
        o.device_capacity = 8 * MiB;
        o.device_headroom = 3 * MiB;
        stream_ordered_pool<host_memory> pool(o);
        std::vector<void*> blocks;
        for (int i = 0; i < 5; ++i) blocks.push_back(pool.allocate_sync(1 * MiB, 256));
        CHECK_THROWS_AS(pool.allocate_sync(1 * MiB, 256), custody::out_of_memory);
        CHECK_THROWS_AS(pool.allocate_sync(6 * MiB, 256), custody::out_of_memory);
        CHECK(pool.statistics().reserved_bytes == 5 * MiB);
        for (void* p : blocks) pool.deallocate_sync(p, 1 * MiB, 256);
    }
    {
        static std::atomic<std::size_t> device_free{10 * MiB};
        pool_options o;
        o.growth_step = 4 * MiB;
        o.device_headroom = 2 * MiB;
        o.memory_info = [](int) -> std::optional<custody::pool::device_memory> {
            return custody::pool::device_memory{device_free.load(), 16 * MiB};
        };
        stream_ordered_pool<host_memory> pool(o);
        void* p = pool.allocate_sync(3 * MiB, 256); // 4 MiB chunk: 10 - 4 >= 2
        device_free = 5 * MiB;                      // someone else took memory
        CHECK_THROWS_AS(pool.allocate_sync(4 * MiB, 256), custody::out_of_memory);
        device_free = 7 * MiB;
        void* q = pool.allocate_sync(4 * MiB, 256); // 4 MiB: 7 - 4 >= 2
        CHECK(pool.statistics().reserved_bytes == 8 * MiB);
        pool.deallocate_sync(p, 3 * MiB, 256);
        pool.deallocate_sync(q, 4 * MiB, 256);
    }
}

TEST_CASE("a failure of the upstream at any call leaves the pool consistent and loses nothing", "[pool][faults]") {
    using upstream = fault_injecting<simulated_device_memory>;
    // A fixed script of operations, replayed with the k-th upstream call failing, for every k.
    auto run = [](stream_ordered_pool<upstream>& pool, std::uint64_t fail_at, bool repeat, int& failures) {
        if (fail_at != 0) pool.upstream().fail_at(fail_at, repeat);
        custody::host::stream a;
        custody::host::stream b;
        std::mt19937 rng(7);
        std::vector<std::tuple<void*, std::size_t, custody::host::stream_view>> live;
        for (int i = 0; i < 120; ++i) {
            const bool free_one = !live.empty() && rng() % 3 == 0;
            if (free_one) {
                const std::size_t k = rng() % live.size();
                auto [p, n, s] = live[k];
                pool.deallocate(rng() % 2 ? a.view() : b.view(), p, n, 256);
                static_cast<void>(s);
                live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
            } else {
                const std::size_t n = rng() % 4 == 0 ? (1 + rng() % 3) * MiB : 1 + rng() % (64 * KiB);
                custody::host::stream_view s = rng() % 2 ? a.view() : b.view();
                const auto before = pool.statistics();
                try {
                    live.emplace_back(pool.allocate(s, n, 256), n, s);
                } catch (const custody::out_of_memory&) {
                    ++failures;
                    const auto after = pool.statistics();
                    CHECK(after.live_bytes == before.live_bytes);
                    CHECK(after.allocations == before.allocations);
                    check_accounting(pool);
                }
            }
            if (i % 40 == 39) pool.trim();
        }
        for (auto [p, n, s] : live) pool.deallocate(s, p, n, 256);
        pool.upstream().disarm();
    };
    pool_options o;
    o.growth_step = 1 * MiB;
    // How many upstream calls the script makes when nothing fails.
    std::uint64_t calls = 0;
    {
        stream_ordered_pool<upstream> pool(o, 0, 1024 * MiB);
        int failures = 0;
        run(pool, 0, false, failures);
        CHECK(failures == 0);
        calls = pool.upstream().calls();
    }
    REQUIRE(calls > 5);
    for (std::uint64_t k = 1; k <= calls; ++k) {
      for (bool repeat : {false, true}) {
        INFO("upstream call " << k << " fails" << (repeat ? ", and every one after it" : ""));
        stream_ordered_pool<upstream> pool(o, 0, 1024 * MiB);
        int failures = 0;
        run(pool, k, repeat, failures);
        // A single failed growth is rescued by the fallback to an exact-size chunk; when every
        // call fails from k on, the allocation that needed call k surfaces a typed error.
        if (repeat) CHECK(failures > 0);
        check_accounting(pool);
        const auto s = pool.detailed_statistics();
        CHECK(s.totals.live_allocations == 0);
        CHECK(s.quarantined_bytes == 0);
        // The pool holds from the upstream exactly what it reserves.
        CHECK(pool.upstream().upstream().statistics().live_bytes == s.totals.reserved_bytes);
        pool.trim();
        CHECK(pool.upstream().upstream().used() == pool.statistics().reserved_bytes);
        CHECK(pool.statistics().reserved_bytes == 0);
      }
    }
}

// ---- the model test ------------------------------------------------------------------------------

TEST_CASE("a seeded random workload matches a reference model exactly", "[pool][model]") {
    for (unsigned seed : {1u, 2u, 3u}) {
        INFO("seed " << seed);
        pool_options o;
        o.growth_step = 256 * KiB;
        o.maximum_size = 24 * MiB;
        o.reuse = static_cast<reuse_policy>(seed % 3);
        stream_ordered_pool<host_memory> pool(o);
        custody::host::stream s1;
        custody::host::stream s2;
        custody::host::stream s3;
        const custody::host::stream_view streams[] = {s1.view(), s2.view(), s3.view(), custody::host::stream_view{}};
        struct block {
            std::size_t bytes;
            std::size_t alignment;
            unsigned char cookie;
        };
        std::map<std::uintptr_t, block> live; // the model: every live block, by address
        std::size_t live_bytes = 0, peak = 0;
        std::uint64_t allocations = 0, deallocations = 0, failures = 0;
        std::mt19937_64 rng(seed);
        for (int op = 0; op < 6000; ++op) {
            const unsigned dice = static_cast<unsigned>(rng() % 100);
            const auto stream = streams[rng() % 4];
            if (dice < 55 || live.empty()) {
                std::size_t n = 0;
                const unsigned kind = static_cast<unsigned>(rng() % 10);
                if (kind < 6) n = 1 + rng() % 2048;
                else if (kind < 9) n = 1 + rng() % (512 * KiB);
                else n = MiB + rng() % (3 * MiB);
                const std::size_t alignment = std::size_t{1} << (rng() % 13);
                try {
                    void* p = pool.allocate(stream, n, alignment);
                    REQUIRE(custody::is_aligned(p, alignment));
                    const auto a = reinterpret_cast<std::uintptr_t>(p);
                    const std::size_t span = detail::block_size(n);
                    // No overlap with any live block (rounded sizes: the memory really held).
                    auto next = live.lower_bound(a);
                    if (next != live.end()) REQUIRE(a + span <= next->first);
                    if (next != live.begin()) {
                        auto prev = std::prev(next);
                        REQUIRE(prev->first + detail::block_size(prev->second.bytes) <= a);
                    }
                    const auto cookie = static_cast<unsigned char>(rng());
                    std::memset(p, cookie, n);
                    live.emplace(a, block{n, alignment, cookie});
                    live_bytes += n;
                    peak = std::max(peak, live_bytes);
                    ++allocations;
                } catch (const custody::out_of_memory&) {
                    ++failures;
                }
            } else if (dice < 97) {
                auto it = live.begin();
                std::advance(it, static_cast<std::ptrdiff_t>(rng() % live.size()));
                const auto* bytes = reinterpret_cast<const unsigned char*>(it->first);
                bool intact = true;
                for (std::size_t i = 0; i < it->second.bytes; i += 61) intact = intact && bytes[i] == it->second.cookie;
                REQUIRE(intact);
                pool.deallocate(stream, reinterpret_cast<void*>(it->first), it->second.bytes, it->second.alignment);
                live_bytes -= it->second.bytes;
                ++deallocations;
                live.erase(it);
            } else if (dice < 99) {
                pool.trim();
            } else {
                for (const auto& st : streams) platform::synchronize(st);
            }
            if (op % 500 == 0) check_accounting(pool);
            const auto s = pool.statistics();
            REQUIRE(s.live_bytes == live_bytes);
            REQUIRE(s.live_allocations == live.size());
            REQUIRE(s.allocations == allocations);
            REQUIRE(s.deallocations == deallocations);
            REQUIRE(s.peak_live_bytes == peak);
            REQUIRE(s.reserved_bytes <= o.maximum_size);
        }
        const auto p = pool.detailed_statistics();
        CHECK(p.failures == failures);
        CHECK(p.live_block_bytes >= live_bytes);
        check_accounting(pool);
        for (auto [a, b] : live) pool.deallocate(streams[0], reinterpret_cast<void*>(a), b.bytes, b.alignment);
        pool.trim();
        CHECK(pool.statistics().reserved_bytes == 0);
    }
}

TEST_CASE("the live peak is exact when bytes given back on one stream are allocated on another", "[pool][peak]") {
    // A stream's frees leave their bytes counted pool-wide as that stream's credit; an allocation
    // on another stream that would make a new peak takes those credits back first, so the peak is
    // the true one, not live plus credits.
    pool_options o;
    o.max_streams = 2; // the third stream has no shard: its calls are counted pool-wide at once
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream a;
    custody::host::stream b;
    custody::host::stream c;
    const auto peak = [&] { return pool.statistics().peak_live_bytes; };
    void* pa = pool.allocate(a, 100 * KiB, 256);
    pool.deallocate(a, pa, 100 * KiB, 256); // a: 100 KiB of credit
    void* pb = pool.allocate(b, 60 * KiB, 256);
    CHECK(peak() == 100 * KiB); // 60 KiB live, not 160
    pa = pool.allocate(a, 50 * KiB, 256);
    CHECK(peak() == 110 * KiB); // 60 + 50 live together
    void* pc = pool.allocate(c, 30 * KiB, 256);
    CHECK(peak() == 140 * KiB);
    pool.deallocate(b, pc, 30 * KiB, 256); // allocated without a shard, given back on b
    pool.deallocate(c, pb, 60 * KiB, 256); // allocated on b, given back without a shard
    CHECK(pool.statistics().live_bytes == 50 * KiB);
    void* pb2 = pool.allocate(b, 80 * KiB, 256); // b's 30 KiB credit covers part: 130 KiB live
    CHECK(peak() == 140 * KiB);
    void* pc2 = pool.allocate(c, 20 * KiB, 256); // 150 KiB live
    CHECK(peak() == 150 * KiB);
    pool.deallocate(a, pa, 50 * KiB, 256);
    pool.deallocate(b, pb2, 80 * KiB, 256);
    pool.deallocate(c, pc2, 20 * KiB, 256);
    const auto s = pool.statistics();
    CHECK(s.live_bytes == 0);
    CHECK(s.peak_live_bytes == 150 * KiB);
    CHECK(s.live_allocations == 0);
    platform::synchronize(c);
}

// ---- threads -------------------------------------------------------------------------------------

TEST_CASE("eight threads on shared and own streams, freeing each other's blocks", "[pool][threads]") {
    pool_options o;
    o.growth_step = 1 * MiB;
    stream_ordered_pool<host_memory> pool(o);
    constexpr int threads = 8;
    std::vector<custody::host::stream> streams;
    for (int i = 0; i < 4; ++i) streams.emplace_back();
    std::mutex exchange_mutex;
    std::vector<std::tuple<void*, std::size_t, unsigned char>> exchange; // blocks handed between threads
    std::vector<int> bad(threads, 0);
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
            std::mt19937 rng(100u + static_cast<unsigned>(t));
            const auto own = streams[static_cast<std::size_t>(t) % streams.size()].view();
            std::vector<std::tuple<void*, std::size_t, unsigned char>> mine;
            auto check_and_free = [&](void* p, std::size_t n, unsigned char cookie) {
                const auto* b = static_cast<const unsigned char*>(p);
                if (b[0] != cookie || b[n - 1] != cookie) ++bad[static_cast<std::size_t>(t)];
                pool.deallocate(own, p, n, 256);
            };
            for (int i = 0; i < 2000; ++i) {
                const unsigned dice = rng() % 10;
                if (dice < 5 || mine.empty()) {
                    const std::size_t n = rng() % 20 == 0 ? MiB + rng() % MiB : 1 + rng() % 16384;
                    void* p = pool.allocate(own, n, 256);
                    const auto cookie = static_cast<unsigned char>(t * 16 + i % 16);
                    std::memset(p, cookie, n);
                    mine.emplace_back(p, n, cookie);
                } else if (dice < 8) {
                    auto [p, n, c] = mine.back();
                    mine.pop_back();
                    check_and_free(p, n, c);
                } else if (dice < 9) {
                    std::lock_guard lock(exchange_mutex);
                    exchange.push_back(mine.back());
                    mine.pop_back();
                } else {
                    std::tuple<void*, std::size_t, unsigned char> taken{};
                    {
                        std::lock_guard lock(exchange_mutex);
                        if (exchange.empty()) continue;
                        taken = exchange.back();
                        exchange.pop_back();
                    }
                    auto [p, n, c] = taken;
                    check_and_free(p, n, c);
                }
                if (i % 500 == 0) static_cast<void>(pool.detailed_statistics());
            }
            for (auto [p, n, c] : mine) check_and_free(p, n, c);
        });
    }
    for (auto& w : workers) w.join();
    for (auto [p, n, c] : exchange) pool.deallocate({}, p, n, 256);
    for (int t = 0; t < threads; ++t) CHECK(bad[static_cast<std::size_t>(t)] == 0);
    const auto s = pool.statistics();
    CHECK(s.live_allocations == 0);
    CHECK(s.live_bytes == 0);
    check_accounting(pool);
    pool.trim();
    CHECK(pool.statistics().reserved_bytes == 0);
}

TEST_CASE("threads on their own streams: the peak lies between the largest and the sum of their peaks",
          "[pool][threads][peak]") {
    // Each thread's live bytes are part of the pool's at every moment, so the pool's peak is at
    // least any thread's; and it never counts memory no thread held: at most the sum of the
    // threads' peaks (what a peak that kept other streams' credits as live would exceed).
    stream_ordered_pool<host_memory> pool;
    constexpr int threads = 4;
    std::vector<custody::host::stream> streams(threads);
    std::vector<std::size_t> peaks(threads, 0);
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
            std::mt19937 rng(7u + static_cast<unsigned>(t));
            const auto own = streams[static_cast<std::size_t>(t)].view();
            std::vector<std::pair<void*, std::size_t>> mine;
            std::size_t live = 0, peak = 0;
            for (int i = 0; i < 20000; ++i) {
                if (rng() % 2 == 0 || mine.empty()) {
                    const std::size_t n = 1 + rng() % (64 * KiB);
                    mine.emplace_back(pool.allocate(own, n, 256), n);
                    live += n;
                    peak = std::max(peak, live);
                } else {
                    const std::size_t k = rng() % mine.size();
                    std::swap(mine[k], mine.back());
                    pool.deallocate(own, mine.back().first, mine.back().second, 256);
                    live -= mine.back().second;
                    mine.pop_back();
                }
            }
            for (auto [p, n] : mine) pool.deallocate(own, p, n, 256);
            peaks[static_cast<std::size_t>(t)] = peak;
        });
    }
    for (auto& w : workers) w.join();
    std::size_t sum = 0;
    for (std::size_t p : peaks) sum += p;
    const auto s = pool.statistics();
    CHECK(s.live_bytes == 0);
    CHECK(s.peak_live_bytes >= *std::max_element(peaks.begin(), peaks.end()));
    CHECK(s.peak_live_bytes <= sum);
    check_accounting(pool);
}

TEST_CASE("threads trimming and reading statistics while others allocate", "[pool][threads]") {
    pool_options o;
    o.growth_step = 256 * KiB;
    // Live memory peaks at 4 threads x 8 blocks x 2 MiB = 64 MiB; the limit leaves room for
    // rounding and for free memory split across chunks, so running out here would be a defect.
    o.maximum_size = 512 * MiB;
    stream_ordered_pool<host_memory> pool(o);
    std::atomic<bool> stop{false};
    std::atomic<int> failures{0};
    std::thread trimmer([&] {
        while (!stop.load()) {
            pool.trim();
            static_cast<void>(pool.detailed_statistics());
            std::this_thread::yield();
        }
    });
    std::vector<std::thread> workers;
    for (int t = 0; t < 4; ++t) {
        workers.emplace_back([&, t] {
            custody::host::stream s;
            std::mt19937 rng(static_cast<unsigned>(t));
            std::vector<std::pair<void*, std::size_t>> mine;
            for (int i = 0; i < 1500; ++i) {
                if (mine.size() < 8 && rng() % 2 == 0) {
                    const std::size_t n = 1 + rng() % (2 * MiB);
                    try {
                        mine.emplace_back(pool.allocate(s, n, 256), n);
                    } catch (const std::exception&) { // reported below, not a terminate in a thread
                        failures.fetch_add(1);
                    }
                } else if (!mine.empty()) {
                    pool.deallocate(s, mine.back().first, mine.back().second, 256);
                    mine.pop_back();
                }
            }
            for (auto [p, n] : mine) pool.deallocate(s, p, n, 256);
        });
    }
    for (auto& w : workers) w.join();
    stop = true;
    trimmer.join();
    CHECK(failures.load() == 0);
    CHECK(pool.statistics().live_allocations == 0);
    check_accounting(pool);
}

// ---- events --------------------------------------------------------------------------------------

TEST_CASE("the event pool creates events up front and in batches, on its device", "[pool][events]") {
    detail::event_pool<platform> events(3, 2, 4);
    CHECK(events.available() == 2);
    auto a = events.acquire();
    auto b = events.acquire();
    CHECK(events.available() == 0);
    auto c = events.acquire(); // the stock ran out: a batch of 4 is made, one handed out
    CHECK(events.available() == 3);
    CHECK(a.device() == 3);
    CHECK(c.device() == 3);
    events.release(std::move(a));
    CHECK(events.available() == 4);
}

TEST_CASE("each stream takes one event from the stock when first seen, none afterwards", "[pool][events]") {
    pool_options o;
    o.initial_events = 2;
    o.event_batch = 2;
    stream_ordered_pool<simulated_device_memory> pool(o, 4, 64 * MiB);
    custody::host::device_guard on_device(4);
    std::vector<custody::host::stream> streams;
    for (int i = 0; i < 5; ++i) streams.emplace_back(4);
    for (int round = 0; round < 3; ++round) {
        for (auto& s : streams) {
            void* p = pool.allocate(s, 512, 256);
            pool.deallocate(s, p, 512, 256);
        }
    }
    CHECK(pool.detailed_statistics().streams == 5);
    check_accounting(pool);
}

TEST_CASE("an initial size the upstream cannot give is out_of_memory from the constructor", "[pool][oom]") {
    pool_options o;
    o.initial_size = 2 * MiB;
    CHECK_THROWS_AS(stream_ordered_pool<simulated_device_memory>(o, 0, 1 * MiB), custody::out_of_memory);
    o.maximum_size = 1 * MiB; // the limit applies to the initial chunk too
    CHECK_THROWS_AS(stream_ordered_pool<host_memory>(o), custody::out_of_memory);
}

TEST_CASE("a block given back on a stream of another device waits for it and stays accounted", "[pool][streams]") {
    stream_ordered_pool<simulated_device_memory> pool(pool_options{}, 1, 64 * MiB);
    custody::host::stream own(1);
    custody::host::stream foreign(6);
    void* p = pool.allocate(own, 3000, 256);
    pool.deallocate(foreign, p, 3000, 256); // no shard for a foreign stream: synchronized, then shared
    const auto s = pool.detailed_statistics();
    CHECK(s.totals.live_allocations == 0);
    CHECK(s.streams == 1);
    check_accounting(pool);
    void* q = pool.allocate(own, 3000, 256);
    pool.deallocate(own, q, 3000, 256);
}
