// The pool's growth, trim and destruction, bad inputs, limits and out-of-memory diagnostics.
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/detail/leaf.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/catch.hpp"
#include "support.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <new>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

using namespace custody_pool_test;

static_assert(custody::try_allocatable_resource<host_memory>);
static_assert(custody::stream_ordered_resource<stream_ordered_pool<host_memory>>);
static_assert(custody::resource_with_statistics<stream_ordered_pool<host_memory>>);
static_assert(custody::device_bound_resource<stream_ordered_pool<simulated_device_memory>>);
static_assert(custody::has_property<stream_ordered_pool<simulated_device_memory>, custody::device_accessible>);
static_assert(custody::has_property<stream_ordered_pool<host_memory>, custody::host_accessible>);
static_assert(!std::is_copy_constructible_v<stream_ordered_pool<host_memory>> &&
              !std::is_move_constructible_v<stream_ordered_pool<host_memory>>);

// ---- growth, reuse, trim, destruction ------------------------------------------------------------

TEST_CASE("the pool grows in chunks, reuses on the fast path and trims what is wholly free", "[pool]") {
    pool_options o;
    o.initial_size = 4 * MiB;
    o.growth_step = 2 * MiB;
    stream_ordered_pool<simulated_device_memory> pool(o, 0, 64 * MiB);
    CHECK(pool.statistics().reserved_bytes == 4 * MiB);
    CHECK(pool.upstream().used() == 4 * MiB);
    custody::host::stream s;
    // While the pool holds no more than its initial size, the initial chunk serves size classes too.
    void* p = pool.allocate(s, 1000, 256);
    CHECK(pool.statistics().reserved_bytes == 4 * MiB);
    pool.deallocate(s, p, 1000, 256);
    void* q = pool.allocate(s, 900, 256); // same class (1024), same stream: the same block
    CHECK(q == p);
    // Large blocks come from the initial chunk while it has room...
    void* big = pool.allocate(s, 3 * MiB, 256);
    CHECK(pool.statistics().reserved_bytes == 4 * MiB);
    CHECK(pool.detailed_statistics().chunks == 1);
    // ...then from a chunk of their own, rounded up to 2 MiB, when larger than the growth step.
    void* big2 = pool.allocate(s, 3 * MiB, 256);
    CHECK(pool.statistics().reserved_bytes == 8 * MiB);
    CHECK(pool.detailed_statistics().chunks == 2);
    // Beyond the initial size, size-class blocks come from chunks of their own: a growth step.
    void* small = pool.allocate(s, 5000, 256);
    CHECK(pool.statistics().reserved_bytes == 10 * MiB);
    CHECK(pool.detailed_statistics().chunks == 3);
    CHECK(pool.detailed_statistics().upstream_allocations == 3);
    check_accounting(pool);
    pool.deallocate(s, big, 3 * MiB, 256);
    pool.deallocate(s, big2, 3 * MiB, 256);
    pool.deallocate(s, small, 5000, 256);
    CHECK(pool.trim() == 6 * MiB); // big2's chunk and the small one are wholly free; the initial one holds q
    CHECK(pool.statistics().reserved_bytes == 4 * MiB);
    CHECK(pool.upstream().used() == 4 * MiB);
    pool.deallocate(s, q, 900, 256);
    CHECK(pool.trim() == 4 * MiB);
    CHECK(pool.statistics().reserved_bytes == 0);
    CHECK(pool.upstream().used() == 0);
    check_accounting(pool);
}

TEST_CASE("a working set within initial_size never makes the pool grow, whatever its sizes", "[pool]") {
    pool_options o;
    o.initial_size = 64 * MiB;
    stream_ordered_pool<simulated_device_memory> pool(o, 0, 256 * MiB);
    custody::host::stream s;
    std::vector<std::pair<void*, std::size_t>> live;
    for (std::size_t n : {std::size_t{1024}, std::size_t{1000}, 64 * KiB, 1 * MiB, 3 * MiB, 16 * MiB, 300 * KiB}) {
        for (int i = 0; i < 3; ++i) live.emplace_back(pool.allocate(s, n, 256), n);
    }
    CHECK(pool.statistics().reserved_bytes == 64 * MiB);
    CHECK(pool.detailed_statistics().upstream_allocations == 1);
    check_accounting(pool);
    for (auto [p, n] : live) pool.deallocate(s, p, n, 256);
    void* over = pool.allocate(s, 100 * MiB, 256); // more than the initial size: the pool grows
    CHECK(pool.statistics().reserved_bytes > 64 * MiB);
    pool.deallocate(s, over, 100 * MiB, 256);
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

// ---- placement: what keeps the reserve near the live bytes ----------------------------------------

TEST_CASE("small chunks are sized by the small blocks' reserve, not by the large blocks'", "[pool][placement]") {
    pool_options o;
    o.growth_step = 2 * MiB;
    o.growth_divisor = 4;
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream s;
    void* weights = pool.allocate(s, 64 * MiB, 256);
    void* small = pool.allocate(s, 4 * KiB, 256);
    // Sized by the whole reserve, the small chunk would be 64 / 4 = 16 MiB for one 4 KiB block.
    CHECK(pool.statistics().reserved_bytes == 66 * MiB);
    pool.deallocate(s, small, 4 * KiB, 256);
    pool.deallocate(s, weights, 64 * MiB, 256);
    check_accounting(pool);
}

TEST_CASE("a large request's chunk holds a whole number of blocks of its size", "[pool][placement]") {
    pool_options o;
    o.growth_step = 2 * MiB;
    o.growth_divisor = 4;
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream s;
    void* weights = pool.allocate(s, 64 * MiB, 256);
    void* a = pool.allocate(s, 6 * MiB, 256);
    void* b = pool.allocate(s, 6 * MiB, 256);
    // 64 / 4 = 16 MiB preferred: two 6 MiB blocks (12 MiB), not 16 MiB with 4 MiB no 6 MiB fits in.
    CHECK(pool.statistics().reserved_bytes == 76 * MiB);
    CHECK(pool.detailed_statistics().chunks == 2);
    for (void* p : {a, b}) pool.deallocate(s, p, 6 * MiB, 256);
    pool.deallocate(s, weights, 64 * MiB, 256);
    check_accounting(pool);
}

namespace {

/// In one 32 MiB chunk, on `s`: an 8 MiB block at 0, four of 2 MiB at 8 MiB, 12 MiB at 16 MiB; the
/// shared set keeps the last 4 MiB. Returns the blocks, the 8 MiB one first.
std::vector<std::pair<void*, std::size_t>> lay_out_one_chunk(stream_ordered_pool<host_memory>& pool,
                                                             custody::host::stream& s) {
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (std::size_t n : {8 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 12 * MiB}) {
        blocks.emplace_back(pool.allocate(s, n, 256), n);
    }
    const auto p = pool.detailed_statistics();
    REQUIRE(p.chunks == 1);
    REQUIRE(p.shared_free_bytes == 4 * MiB);
    return blocks;
}

} // namespace

TEST_CASE("the tighter of the stream's own fit and the shared set's is taken", "[pool][placement]") {
    pool_options o;
    o.initial_size = 32 * MiB;
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream s;
    auto blocks = lay_out_one_chunk(pool, s);
    char* const base = static_cast<char*>(blocks[0].first);
    // The 8 MiB block goes to the stream's spans (pushed out of its recent blocks by the four
    // 2 MiB ones); the shared set holds exactly 4 MiB.
    for (std::size_t i = 0; i < 5; ++i) pool.deallocate(s, blocks[i].first, blocks[i].second, 256);
    void* p = pool.allocate(s, 4 * MiB, 256);
    CHECK(p == base + 28 * MiB); // the exact fit, not the front of the 8 MiB block
    void* whole = pool.allocate(s, 8 * MiB, 256);
    CHECK(whole == base); // still whole
    CHECK(pool.statistics().reserved_bytes == 32 * MiB);
    pool.deallocate(s, whole, 8 * MiB, 256);
    pool.deallocate(s, p, 4 * MiB, 256);
    pool.deallocate(s, blocks[5].first, blocks[5].second, 256);
    check_accounting(pool);
}

TEST_CASE("free space split between a stream's spans and the shared set joins before the pool grows",
          "[pool][placement]") {
    pool_options o;
    o.initial_size = 32 * MiB;
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream s;
    auto blocks = lay_out_one_chunk(pool, s);
    char* const base = static_cast<char*>(blocks[0].first);
    // The 12 MiB block, then the four 2 MiB ones: the stream keeps [8, 28) MiB, the shared set
    // [28, 32) MiB. 22 MiB fits only in the two joined.
    pool.deallocate(s, blocks[5].first, blocks[5].second, 256);
    for (std::size_t i = 1; i < 5; ++i) pool.deallocate(s, blocks[i].first, blocks[i].second, 256);
    void* p = pool.allocate(s, 22 * MiB, 256);
    CHECK(p == base + 8 * MiB);
    CHECK(pool.statistics().reserved_bytes == 32 * MiB);
    CHECK(pool.detailed_statistics().chunks == 1);
    pool.deallocate(s, p, 22 * MiB, 256);
    pool.deallocate(s, blocks[0].first, blocks[0].second, 256);
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
    REQUIRE(log.lines().size() == 1);
    CHECK(log.lines()[0].find("1 blocks (4000 bytes) still allocated") != std::string::npos);
}

TEST_CASE("a clean pool reports nothing when destroyed", "[pool]") {
    failure_log log;
    {
        stream_ordered_pool<host_memory> pool;
        custody::host::stream s;
        void* p = pool.allocate(s, 100, 256);
        pool.deallocate(s, p, 100, 256);
    }
    CHECK(log.lines().empty());
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
    std::vector<std::tuple<void*, std::size_t, std::size_t>> blocks;
    for (std::size_t a = 256; a <= 4096; a *= 2) {
        for (std::size_t n : {std::size_t{300}, std::size_t{70000}, 2 * MiB + 1}) {
            void* p = pool.allocate(s, n, a);
            CHECK(custody::is_aligned(p, a));
            std::memset(p, 0x11, n);
            blocks.emplace_back(p, n, a);
        }
    }
    for (auto [p, n, a] : blocks) pool.deallocate(s, p, n, a); // as allocated: a checked pool refuses another alignment
    CHECK(pool.statistics().live_allocations == 0);
    // A page-aligned request can skip cached blocks that are not page-aligned.
    void* q = pool.allocate(s, 300, 4096);
    CHECK(custody::is_aligned(q, 4096));
    pool.deallocate(s, q, 300, 4096);
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
        o.memory_info = [](int) -> std::optional<custody::device_memory> {
            return custody::device_memory{device_free.load(), 16 * MiB};
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

namespace {

/// What out_of_memory says when `pool` cannot serve `bytes` synchronously ("" when it can).
template <class Pool>
std::string refusal_of(Pool& pool, std::size_t bytes) {
    try {
        void* p = pool.allocate_sync(bytes, 256);
        pool.deallocate_sync(p, bytes, 256);
    } catch (const custody::out_of_memory& e) {
        return e.what();
    }
    return {};
}

} // namespace

TEST_CASE("the device budget is said: capacity once, from the upstream, and the error names its parts",
          "[pool][limits]") {
    // The default headroom: an eighth of the device, at most 1 GiB.
    CHECK(detail::headroom_on(custody::pool::automatic_headroom, 2048 * MiB) == 256 * MiB);
    CHECK(detail::headroom_on(custody::pool::automatic_headroom, 80 * 1024 * MiB) == 1024 * MiB);
    CHECK(detail::headroom_on(3 * MiB, 80 * 1024 * MiB) == 3 * MiB);
    {
        // The capacity is said once, to the device's memory; the pool asks it there.
        stream_ordered_pool<simulated_device_memory> pool(pool_options{}, 0, 64 * MiB);
        void* a = pool.allocate_sync(48 * MiB, 256);
        void* b = pool.allocate_sync(8 * MiB, 256); // 56 MiB: the budget, 64 - 64/8
        const std::string what = refusal_of(pool, 4 * MiB); // the device would still have 8 MiB
        INFO(what);
        CHECK(what.find("device budget 58720256 B (56 MiB) = capacity 67108864 B (64 MiB) - headroom 8388608 B "
                        "(8 MiB) (device_headroom's default: an eighth of the device, at most 1 GiB), the pool holds "
                        "58720256 B (56 MiB): the request does not fit in it") != std::string::npos);
        CHECK(pool.statistics().reserved_bytes == 56 * MiB);
        pool.deallocate_sync(a, 48 * MiB, 256);
        pool.deallocate_sync(b, 8 * MiB, 256);
    }
    {
        pool_options o;
        o.device_headroom = 4 * MiB; // set: named as the option
        o.device_capacity = 32 * MiB; // said here: wins over the upstream's
        stream_ordered_pool<simulated_device_memory> pool(o, 0, 64 * MiB);
        const std::string what = refusal_of(pool, 30 * MiB);
        INFO(what);
        CHECK(what.find("device budget 29360128 B (28 MiB) = capacity 33554432 B (32 MiB) - headroom 4194304 B "
                        "(4 MiB) (pool_options::device_headroom)") != std::string::npos);
    }
    {
        // Asked of the device at each growth: the error says what the device had free.
        pool_options o;
        o.memory_info = [](int) -> std::optional<custody::device_memory> {
            return custody::device_memory{10 * MiB, 16 * MiB};
        };
        stream_ordered_pool<host_memory> pool(o);
        const std::string what = refusal_of(pool, 9 * MiB);
        INFO(what);
        CHECK(what.find("device budget 8388608 B (8 MiB) = free on the device 10485760 B (10 MiB) (of 16777216 B "
                        "(16 MiB)) - headroom 2097152 B (2 MiB)") != std::string::npos);
    }
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

namespace {

/// Host memory that keeps what is given back until trim(), as cudaMallocAsync's driver pool does
/// with its release threshold at the maximum; a kept block at least as large serves a request first.
class retaining_memory final : public custody::resource::detail::leaf<retaining_memory, platform> {
public:
    static constexpr const char* name = "retaining_memory";
    static constexpr std::size_t max_alignment = custody::max_alignment;
    static constexpr bool interchangeable = false;
    retaining_memory() : leaf(-1) {}
    retaining_memory(const retaining_memory&) = delete;
    retaining_memory& operator=(const retaining_memory&) = delete;
    ~retaining_memory() { trim(); }

    [[nodiscard]] std::size_t retained_bytes() const noexcept {
        std::size_t n = 0;
        for (const auto& b : kept_) n += b.second;
        return n;
    }
    std::size_t trim() noexcept {
        const std::size_t n = retained_bytes();
        for (const auto& b : kept_) ::operator delete(b.first, std::align_val_t{max_alignment});
        kept_.clear();
        held_ -= n;
        return n;
    }
    /// Live and retained bytes: what the device cannot give anyone else.
    [[nodiscard]] std::size_t held() const noexcept { return held_; }

    void* raw_allocate_sync(std::size_t bytes, std::size_t) noexcept {
        try {
            for (auto it = kept_.begin(); it != kept_.end(); ++it) {
                if (it->second < bytes) continue;
                const auto b = *it;
                live_.emplace(b.first, b.second);
                kept_.erase(it);
                return b.first;
            }
            void* p = ::operator new(bytes, std::align_val_t{max_alignment});
            live_.emplace(p, bytes);
            held_ += bytes;
            return p;
        } catch (...) {
            return nullptr;
        }
    }
    void raw_deallocate_sync(void* ptr, std::size_t, std::size_t) noexcept {
        const auto it = live_.find(ptr);
        try {
            kept_.emplace_back(it->first, it->second);
        } catch (...) { // no memory to keep it: given back to the device
            ::operator delete(ptr, std::align_val_t{max_alignment});
            held_ -= it->second;
        }
        live_.erase(it);
    }
    void* raw_allocate(stream_type, std::size_t bytes, std::size_t alignment) noexcept {
        return raw_allocate_sync(bytes, alignment);
    }
    void raw_deallocate(stream_type, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        raw_deallocate_sync(ptr, bytes, alignment);
    }

private:
    std::map<void*, std::size_t> live_;
    std::vector<std::pair<void*, std::size_t>> kept_;
    std::size_t held_ = 0;
};

const retaining_memory* device_8mib_user = nullptr;

/// A device of 8 MiB whose only user is `device_8mib_user`.
std::optional<custody::device_memory> device_8mib(int) {
    return custody::device_memory{8 * MiB - device_8mib_user->held(), 8 * MiB};
}

} // namespace

TEST_CASE("trim gives back what the upstream retains", "[pool][trim]") {
    pool_options o;
    o.growth_step = 4 * MiB;
    stream_ordered_pool<retaining_memory> pool(o);
    custody::host::stream s;
    void* p = pool.allocate(s, 3 * MiB, 256);
    pool.deallocate(s, p, 3 * MiB, 256);
    CHECK(pool.detailed_statistics().upstream_retained_bytes == 0);
    CHECK(pool.trim() == 4 * MiB);
    CHECK(pool.upstream().retained_bytes() == 0); // back to the device, not kept by the upstream
    CHECK(pool.upstream().held() == 0);
    check_accounting(pool);
}

TEST_CASE("the device budget counts what the upstream retains as free", "[pool][trim]") {
    pool_options o;
    o.growth_step = 4 * MiB;
    o.device_headroom = 0;
    o.memory_info = &device_8mib;
    stream_ordered_pool<retaining_memory> pool(o);
    device_8mib_user = &pool.upstream();
    void* other = pool.upstream().allocate_sync(8 * MiB, 256); // another user of the same driver pool
    pool.upstream().deallocate_sync(other, 8 * MiB, 256);      // kept: the device reports nothing free
    CHECK(pool.detailed_statistics().upstream_retained_bytes == 8 * MiB);
    void* p = pool.allocate_sync(3 * MiB, 256); // a chunk from what the upstream retains
    CHECK(pool.upstream().held() == 8 * MiB);
    pool.deallocate_sync(p, 3 * MiB, 256);
    CHECK(pool.trim() == 4 * MiB);
    CHECK(pool.upstream().held() == 0);
    check_accounting(pool);
}

// ---- misuse of deallocate -------------------------------------------------------------------------

namespace {
std::vector<custody::pool::misuse>& misuses_seen() {
    static std::vector<custody::pool::misuse> v;
    return v;
}
void record_misuse(const custody::pool::misuse& m) noexcept { misuses_seen().push_back(m); }
/// A checked pool's options whose misuses land in misuses_seen(), emptied here.
pool_options recording_misuses() {
    misuses_seen().clear();
    misuses_seen().reserve(16);
    pool_options o;
    o.checked = true;
    o.on_misuse = &record_misuse;
    return o;
}
} // namespace

TEST_CASE("a checked pool refuses each misuse of deallocate with a typed report and stays as it was",
          "[pool][checked]") {
    stream_ordered_pool<simulated_device_memory> pool(recording_misuses(), 0, 64 * MiB);
    custody::host::stream s;
    void* a = pool.allocate(s, 1000, 256);
    void* b = pool.allocate(s, 3 * MiB, 256);
    pool.deallocate(s, a, 1000, 256);
    const auto before = pool.detailed_statistics();
    int outside = 0;
    pool.deallocate(s, a, 1000, 256);                                            // given back twice
    pool.deallocate(s, static_cast<char*>(b) + 4096, 3 * MiB - 4096, 256);       // inside a live block
    pool.deallocate(s, b, 2 * MiB, 256);                                         // another size
    pool.deallocate(s, b, 3 * MiB, 4096);                                        // another alignment
    pool.deallocate(s, &outside, sizeof outside, alignof(int));                  // not the pool's
    using custody::pool::misuse_kind;
    REQUIRE(misuses_seen().size() == 5);
    CHECK(misuses_seen()[0].kind == misuse_kind::double_free);
    CHECK(misuses_seen()[1].kind == misuse_kind::interior_pointer);
    CHECK(misuses_seen()[1].block == reinterpret_cast<std::uintptr_t>(b));
    CHECK(misuses_seen()[2].kind == misuse_kind::wrong_size);
    CHECK(misuses_seen()[2].block_bytes == 3 * MiB);
    CHECK(misuses_seen()[3].kind == misuse_kind::wrong_size);
    CHECK(misuses_seen()[4].kind == misuse_kind::foreign_pointer);
    CHECK(misuses_seen()[4].stream_key == platform::stream_key(s));
    CHECK_THAT(misuses_seen()[2].describe(), custody_test::contains("wrong size"));
    const auto after = pool.detailed_statistics();
    CHECK(after.misuses == 5);
    CHECK(after.totals.deallocations == before.totals.deallocations);
    CHECK(after.totals.live_bytes == before.totals.live_bytes);
    CHECK(after.live_block_bytes == before.live_block_bytes);
    CHECK(after.stream_cached_bytes == before.stream_cached_bytes);
    CHECK(after.shared_free_bytes == before.shared_free_bytes);
    // No two live allocations share a block.
    void* x = pool.allocate(s, 1000, 256);
    void* y = pool.allocate(s, 1000, 256);
    CHECK(x != y);
    pool.deallocate(s, x, 1000, 256);
    pool.deallocate(s, y, 1000, 256);
    pool.deallocate(s, b, 3 * MiB, 256);
    CHECK(misuses_seen().size() == 5);
    CHECK(pool.statistics().live_allocations == 0);
    check_accounting(pool);
}

TEST_CASE("a checked pool's common path records its blocks with their stream and refuses the same misuses",
          "[pool][checked]") {
    stream_ordered_pool<simulated_device_memory> pool(recording_misuses(), 0, 64 * MiB);
    custody::host::stream s;
    custody::host::stream t;
    // The first pair makes the stream's stack and its table of live blocks; the next blocks come
    // from the stack, recorded in that table.
    pool.deallocate(s, pool.allocate(s, 4096, 256), 4096, 256);
    pool.deallocate(s, pool.allocate(s, 4096, 256), 4096, 256);
    const auto fast_before = pool.detailed_statistics().fast_allocations;
    void* a = pool.allocate(s, 4096, 256);
    void* c = pool.allocate(s, 4096, 256);
    CHECK(pool.detailed_statistics().fast_allocations > fast_before); // at least one from the stack
    using custody::pool::misuse_kind;
    pool.deallocate(s, a, 4000, 256);                              // another size
    pool.deallocate(s, a, 4096, 128);                              // another alignment
    pool.deallocate(s, static_cast<char*>(c) + 512, 1024, 256);    // inside a live block
    REQUIRE(misuses_seen().size() == 3);
    CHECK(misuses_seen()[0].kind == misuse_kind::wrong_size);
    CHECK(misuses_seen()[0].block_bytes == 4096);
    CHECK(misuses_seen()[1].kind == misuse_kind::wrong_size);
    CHECK(misuses_seen()[1].block_alignment == 256);
    CHECK(misuses_seen()[2].kind == misuse_kind::interior_pointer);
    CHECK(misuses_seen()[2].block == reinterpret_cast<std::uintptr_t>(c));
    pool.deallocate(t, a, 4096, 256); // on another stream: found in s's table, given back on t
    pool.deallocate(t, a, 4096, 256); // and then it is a double free
    pool.deallocate(s, c, 4096, 256);
    REQUIRE(misuses_seen().size() == 4);
    CHECK(misuses_seen()[3].kind == misuse_kind::double_free);
    CHECK(pool.detailed_statistics().misuses == 4);
    CHECK(pool.statistics().live_allocations == 0);
    check_accounting(pool);
}

TEST_CASE("without a misuse callback a checked pool reports the misuse as a failure", "[pool][checked]") {
    failure_log log;
    pool_options o;
    o.checked = true;
    stream_ordered_pool<host_memory> pool(o);
    void* p = pool.allocate_sync(4096, 256);
    pool.deallocate_sync(p, 4096, 256);
    pool.deallocate_sync(p, 4096, 256);
    REQUIRE(log.lines().size() == 1);
    CHECK_THAT(log.lines()[0], custody_test::contains("double free"));
    CHECK(pool.statistics().deallocations == 1);
}
