// The pool's cross-stream reuse under each policy: covering records, dependency waits, the last
// resort, streams without a shard and streams of another device.
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/catch.hpp"
#include "support.hpp"
#include "../support/stream_gate.hpp"

#include <cstring>
#include <iterator>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace custody_pool_test;

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
    o.record_share = 0; // the record schedule of record_interval alone
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
    o.record_share = 0; // the record schedule of record_interval and record_bytes alone
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
        o.record_share = 0; // the record schedule of record_interval and record_bytes alone
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

TEST_CASE("a stream of another device is refused even where it reuses a dead stream's handle", "[pool][streams]") {
    stream_ordered_pool<simulated_device_memory> pool(pool_options{}, 0, 64 * MiB);
    const custody::host::detail::stream_state* dead = nullptr;
    {
        custody::host::stream a(0);
        void* p = pool.allocate(a, 1000, 256); // a's shard is made
        pool.deallocate(a, p, 1000, 256);
        dead = a.view().state();
    }
    // A new stream's state often lands where the dead one's was (never under ASan's quarantine):
    // the check holds for every new stream, whichever address it got.
    bool reused = false;
    for (int i = 0; i < 64 && !reused; ++i) {
        custody::host::stream b(1);
        reused = b.view().state() == dead;
        CHECK_THROWS_AS(pool.allocate(b, 1000, 256), std::invalid_argument);
        void* q = pool.allocate_sync(1000, 256);
        pool.deallocate(b, q, 1000, 256); // served without a shard: b is waited for
        CHECK(pool.statistics().live_allocations == 0);
    }
    CHECK(pool.detailed_statistics().streams <= 2); // a's shard and the default stream's
    check_accounting(pool);
}

TEST_CASE("the synchronous pair runs on the pool's device whatever device the caller has current",
          "[pool][streams]") {
    failure_log log;
    pool_options o;
    o.record_interval = 1; // every free records the stream's event: on the default stream, the device's
    stream_ordered_pool<simulated_device_memory> pool(o, 2, 64 * MiB);
    custody::host::device_guard elsewhere(5);
    void* p = pool.allocate_sync(1000, 256);
    pool.deallocate_sync(p, 1000, 256);
    void* q = pool.allocate(custody::host::stream_view{}, 1000, 256);
    CHECK(q == p);
    pool.deallocate(custody::host::stream_view{}, q, 1000, 256);
    CHECK(platform::current_device() == 5); // the caller's device again
    CHECK(log.lines().empty());
    check_accounting(pool);
}

TEST_CASE("a producer stream allocating and a consumer stream freeing keep the reserve near the live peak",
          "[pool][streams][cross]") {
    constexpr std::size_t sizes[] = {4 * KiB, 64 * KiB, 1 * MiB, 3 * MiB, 4 * KiB, 64 * KiB, 1 * MiB, 3 * MiB};
    for (const auto policy : {reuse_policy::opportunistic, reuse_policy::follow_dependencies}) {
        pool_options o;
        o.reuse = policy;
        o.checked = false;
        stream_ordered_pool<host_memory> pool(o);
        custody::host::stream producer;
        custody::host::stream consumer;
        void* blocks[std::size(sizes)];
        std::size_t reserved_early = 0;
        for (int round = 0; round < 100000; ++round) {
            for (std::size_t i = 0; i < std::size(sizes); ++i) blocks[i] = pool.allocate(producer, sizes[i], 256);
            for (std::size_t i = 0; i < std::size(sizes); ++i) pool.deallocate(consumer, blocks[i], sizes[i], 256);
            if (round == 1000) reserved_early = pool.statistics().reserved_bytes;
        }
        const auto s = pool.statistics();
        INFO("policy " << static_cast<int>(policy) << ": reserved " << s.reserved_bytes << ", peak live " << s.peak_live_bytes);
        CHECK(s.reserved_bytes * 2 <= s.peak_live_bytes * 3); // within 1.5x
        CHECK(s.reserved_bytes == reserved_early);           // flat over the rounds
        check_accounting(pool);
    }
}

TEST_CASE("streams that take turns in one thread keep the blocks they reuse", "[pool][streams][turns]") {
    // A thread with several streams (compute, copy, communication) that allocates and gives back on
    // each in turn: each stream's block stays with it, rather than going to the next stream and being
    // taken back (a slow path and a stream wait at every call).
    for (const std::size_t n : {std::size_t{256}, 64 * KiB, 1 * MiB, 3 * MiB}) {
        INFO("bytes " << n);
        for (const auto policy : {reuse_policy::opportunistic, reuse_policy::follow_dependencies}) {
            INFO("policy " << static_cast<int>(policy));
            pool_options o;
            o.reuse = policy;
            stream_ordered_pool<host_memory> pool(o);
            custody::host::stream streams[4];
            const auto rounds = [&](int count) {
                for (int round = 0; round < count; ++round) {
                    for (auto& s : streams) pool.deallocate(s, pool.allocate(s, n, 256), n, 256);
                }
            };
            rounds(4);
            const custody::pool::pool_statistics before = pool.detailed_statistics();
            rounds(1000);
            const custody::pool::pool_statistics after = pool.detailed_statistics();
            CHECK(after.opportunistic_reuses == before.opportunistic_reuses);
            CHECK(after.dependency_waits == before.dependency_waits);
            CHECK(after.reclaims == 0);
            CHECK(after.totals.reserved_bytes == before.totals.reserved_bytes);
            if (n <= detail::small_threshold) CHECK(after.fast_allocations - before.fast_allocations == 4000);
            check_accounting(pool);
        }
    }
}
