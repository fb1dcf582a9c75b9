// The pool's cross-stream reuse under each policy: covering records, dependency waits, the last
// resort, streams without a shard and streams of another device.
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>
#include <custody/resource/virtual_memory.hpp>

#include "../support/catch.hpp"
#include "support.hpp"
#include "../support/stream_gate.hpp"

#include <algorithm>
#include <cstring>
#include <chrono>
#include <iterator>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
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

TEST_CASE("opportunistic reuse takes another stream's block once its work is done, waiting on the host rather than grow",
          "[pool][streams]") {
    constexpr std::size_t n = 64 * KiB;
    stream_ordered_pool<host_memory> pool(tight(reuse_policy::opportunistic, n, 4));
    custody::host::stream a;
    custody::host::stream b;
    void* p = pool.allocate(a, n, 256);
    {
        custody::test::stream_gate<platform> gate(a);
        platform::memset_async(p, 0xAA, n, a); // pending work that still uses p
        pool.deallocate(a, p, n, 256);
        // a holds what b needs and its work is pending: the pool waits for it on the host (a helper
        // thread ends it) rather than grow, and hands p over only then.
        std::thread opener([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            gate.open();
        });
        void* q = pool.allocate(b, n, 256);
        opener.join();
        CHECK(q == p);
        CHECK(static_cast<const unsigned char*>(q)[n - 1] == 0xAA); // a's work ran before q was handed out
        CHECK(pool.statistics().reserved_bytes == n);
        CHECK(pool.detailed_statistics().dependency_waits == 0);
        CHECK(pool.detailed_statistics().host_waits <= 1); // none when the helper was first
        pool.deallocate(b, q, n, 256);
    }
    // With a's work done, its block moves on a non-blocking query: no wait at all.
    platform::synchronize(b);
    void* r = pool.allocate(a, n, 256);
    pool.deallocate(a, r, n, 256);
    const auto waits = pool.detailed_statistics().host_waits;
    platform::synchronize(a);
    void* s2 = pool.allocate(b, n, 256);
    CHECK(pool.detailed_statistics().host_waits == waits);
    CHECK(pool.statistics().reserved_bytes == n);
    pool.deallocate(b, s2, n, 256);
    check_accounting(pool);
}

TEST_CASE("same_stream hands another stream's block over only through a host wait, rather than grow",
          "[pool][streams]") {
    constexpr std::size_t n = 64 * KiB;
    stream_ordered_pool<host_memory> pool(tight(reuse_policy::same_stream, n, 4));
    custody::host::stream a;
    custody::host::stream b;
    void* p = pool.allocate(a, n, 256);
    void* own = pool.allocate(b, n, 256);
    pool.deallocate(b, own, n, 256);
    platform::synchronize(b);
    {
        custody::test::stream_gate<platform> gate(a);
        platform::memset_async(p, 0xAA, n, a);
        pool.deallocate(a, p, n, 256);
        // b's own cache serves b first: nothing crosses streams while it has memory.
        void* q = pool.allocate(b, n, 256);
        CHECK(q == own);
        // b needs more and a holds it: a host wait for a's work, not a new chunk.
        std::thread opener([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            gate.open();
        });
        void* r = pool.allocate(b, n, 256);
        opener.join();
        CHECK(r == p);
        CHECK(static_cast<const unsigned char*>(r)[0] == 0xAA);
        CHECK(pool.statistics().reserved_bytes == 2 * n);
        CHECK(pool.detailed_statistics().reclaims == 0);
        CHECK(pool.detailed_statistics().dependency_waits == 0);
        pool.deallocate(b, q, n, 256);
        pool.deallocate(b, r, n, 256);
    }
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
        // (Where the pool waits on the host for a's work, a helper thread ends it.)
        std::thread opener([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            gate.open();
        });
        std::vector<void*> from_b;
        for (int i = 0; i < 48; ++i) {
            void* q = pool.allocate(b, n, 256);
            platform::memset_async(q, 0x55, n, b);
            from_b.push_back(q);
        }
        opener.join();
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
        o.maximum_size = 2 * n;
        stream_ordered_pool<host_memory> pool(o);
        custody::host::stream b;
        std::optional<custody::host::stream> a(std::in_place);
        void* keep = pool.allocate(*a, 256, 256); // a still holds a block: its free of p is not its last
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
        pool.deallocate(b, keep, 256, 256);
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

TEST_CASE("a destroyed stream's shard serves a new stream once its work is done, without a host wait",
          "[pool][streams][retire]") {
    pool_options o;
    o.max_streams = 2;
    // Without working sets: a destroyed stream's cache would otherwise stay its working set (up to
    // working_set_total, see "working sets are bounded") until its shard is retired, and the memory
    // reused below is what a retired shard gives back.
    o.stream_working_set = 0;
    stream_ordered_pool<host_memory> pool(o);
    custody::host::stream keep; // one shard stays busy with a live block throughout
    void* held = pool.allocate(keep, 3 * MiB, 256);
    std::size_t reserved_first = 0;
    for (int i = 0; i < 20; ++i) {
        custody::host::stream t;
        void* p = pool.allocate(t, 1000 + static_cast<std::size_t>(i), 256);
        void* q = pool.allocate(t, 2 * MiB, 256);
        platform::memset_async(q, 0x11, 4096, t);
        pool.deallocate(t, p, 1000 + static_cast<std::size_t>(i), 256);
        pool.deallocate(t, q, 2 * MiB, 256);
        platform::synchronize(t); // its last event has completed when it goes
        if (i == 0) reserved_first = pool.statistics().reserved_bytes;
    }
    // A new stream, busy: its free must not wait for it, so it needs a shard of its own.
    custody::host::stream late;
    void* r = pool.allocate(late, 4096, 256);
    const auto key = platform::stream_key(late.view());
    const auto st = pool.detailed_statistics();
    CHECK(st.retired_streams >= 19);
    CHECK(st.streams <= 2);
    // (REQUIRE: without a shard the free below would wait for the gate.)
    REQUIRE(std::any_of(st.per_stream.begin(), st.per_stream.end(), [&](const auto& e) { return e.stream_key == key; }));
    {
        custody::test::stream_gate<platform> gate(late);
        platform::memset_async(r, 0x22, 4096, late);
        pool.deallocate(late, r, 4096, 256); // kept in its shard: returns with the gate still closed
        CHECK(pool.statistics().live_bytes == 3 * MiB);
    }
    // The retired streams' memory was reused, not stranded: nothing grew past the first rounds.
    CHECK(pool.statistics().reserved_bytes == reserved_first);
    pool.deallocate(keep, held, 3 * MiB, 256);
    platform::synchronize(late);
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

namespace {

/// A producer stream allocating eight blocks of 4 KiB to 3 MiB a round and a consumer stream giving
/// them back (after work of its own on each when `busy`, so that its event is pending when the
/// producer asks), for `rounds` rounds, under every reuse policy: with an idle consumer the reserve
/// stays within 1.5x of the live peak and is the same at the end as after the first thousand
/// rounds; with a busy one, within the bound its record rules give (below).
template <class Pool, class... Args>
void producer_consumer(reuse_policy policy, int rounds, bool busy, Args&&... upstream) {
    constexpr std::size_t sizes[] = {4 * KiB, 64 * KiB, 1 * MiB, 3 * MiB, 4 * KiB, 64 * KiB, 1 * MiB, 3 * MiB};
    pool_options o;
    o.reuse = policy;
    o.checked = false;
    o.maximum_size = 1024 * MiB; // far above what a bounded pool needs
    Pool pool(o, std::forward<Args>(upstream)...);
    custody::host::stream producer;
    custody::host::stream consumer;
    void* blocks[std::size(sizes)];
    std::size_t reserved_early = 0;
    for (int round = 0; round < rounds; ++round) {
        for (std::size_t i = 0; i < std::size(sizes); ++i) blocks[i] = pool.allocate(producer, sizes[i], 256);
        for (std::size_t i = 0; i < std::size(sizes); ++i) {
            if (busy) platform::memset_async(blocks[i], 0, 4096, consumer);
            pool.deallocate(consumer, blocks[i], sizes[i], 256);
        }
        if (round == 1000) reserved_early = pool.statistics().reserved_bytes;
    }
    const auto s = pool.detailed_statistics();
    INFO("policy " << static_cast<int>(policy) << ": reserved " << s.totals.reserved_bytes << ", peak live "
                   << s.totals.peak_live_bytes << ", host waits " << s.host_waits << ", stream waits "
                   << s.dependency_waits << ", reclaims " << s.reclaims);
    if (!busy) {
        // Idle consumer: within 1.5x of the live peak, and flat over the rounds, exactly.
        CHECK(s.totals.peak_reserved_bytes * 2 <= s.totals.peak_live_bytes * 3);
        CHECK(s.totals.reserved_bytes == reserved_early);
    } else {
        // Busy consumer: the producer cannot reuse what the consumer's stream has not reached. The
        // pool grows only while the others hold less than reserve / record_share in covered blocks
        // still in use, and the consumer covers its large frees once they reach reserve /
        // record_share, so reserve <= (live + the consumer's uncovered small blocks) / (1 - 2 / 8):
        // how close it comes depends on how far behind the consumer runs (1.72x measured under
        // ASan at -O0 on a loaded machine). Held to 2x, and never the last resort.
        CHECK(s.totals.peak_reserved_bytes <= 2 * s.totals.peak_live_bytes);
    }
    CHECK(s.reclaims == 0);                                              // never the last resort
    if (policy == reuse_policy::follow_dependencies) CHECK(s.host_waits == 0); // stream waits only
    platform::synchronize(consumer);
    check_accounting(pool);
}

} // namespace

TEST_CASE("a producer stream allocating and a consumer stream freeing keep the reserve bounded under every policy",
          "[pool][streams][cross]") {
    custody::resource::reservation_options granules;
    granules.granule = 2 * MiB;
    for (const auto policy : {reuse_policy::same_stream, reuse_policy::opportunistic, reuse_policy::follow_dependencies}) {
        for (const bool busy : {false, true}) {
            INFO("busy consumer: " << busy);
            const int rounds = busy ? 10000 : 50000;
            producer_consumer<stream_ordered_pool<host_memory>>(policy, rounds, busy);
            producer_consumer<stream_ordered_pool<custody::resource::virtual_memory<custody::host::vmm>>>(
                policy, rounds, busy, 0, 4096 * MiB, granules);
        }
    }
}

TEST_CASE("streams that take turns in one thread keep the blocks they reuse", "[pool][streams][turns]") {
    // A thread with several streams (compute, copy, communication) that allocates and gives back on
    // each in turn: each stream's blocks stay with it as its working set (pool_options::
    // stream_working_set), rather than going to the next stream and being taken back (a slow path
    // and a stream wait at every call), at every size up to the working set.
    for (const std::size_t n : {std::size_t{256}, 64 * KiB, 1 * MiB, 16 * MiB}) {
        INFO("bytes " << n);
        for (const auto policy : {reuse_policy::same_stream, reuse_policy::opportunistic, reuse_policy::follow_dependencies}) {
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
            rounds(500);
            const custody::pool::pool_statistics after = pool.detailed_statistics();
            CHECK(after.opportunistic_reuses == before.opportunistic_reuses);
            CHECK(after.dependency_waits == before.dependency_waits);
            CHECK(after.host_waits == before.host_waits);
            CHECK(after.reclaims == 0);
            CHECK(after.totals.reserved_bytes == before.totals.reserved_bytes);
            if (n <= detail::small_threshold) CHECK(after.fast_allocations - before.fast_allocations == 2000);
            check_accounting(pool);
        }
    }
}

TEST_CASE("working sets are bounded per stream and per device", "[pool][streams][turns]") {
    pool_options o;
    o.checked = false;
    o.reuse = reuse_policy::opportunistic;
    o.stream_working_set = 8 * MiB;
    o.working_set_total = 16 * MiB;
    SECTION("per device: beyond working_set_total, streams' idle blocks serve others") {
        stream_ordered_pool<host_memory> pool(o);
        std::vector<custody::host::stream> streams(7);
        for (auto& s : streams) {
            pool.deallocate(s, pool.allocate(s, 6 * MiB, 256), 6 * MiB, 256);
            platform::synchronize(s);
        }
        // Two streams keep theirs (12 MiB of the 16); the others hand one block around.
        const auto st = pool.detailed_statistics();
        INFO("reserved " << st.totals.reserved_bytes);
        CHECK(st.totals.reserved_bytes <= 18 * MiB + 2 * MiB);
        CHECK(st.opportunistic_reuses > 0);
        check_accounting(pool);
    }
    SECTION("per stream: a cache above stream_working_set serves others") {
        stream_ordered_pool<host_memory> pool(o);
        std::vector<custody::host::stream> streams(4);
        for (int round = 0; round < 3; ++round) {
            for (auto& s : streams) {
                pool.deallocate(s, pool.allocate(s, 12 * MiB, 256), 12 * MiB, 256);
                platform::synchronize(s);
            }
        }
        CHECK(pool.statistics().reserved_bytes <= 12 * MiB + 2 * MiB);
        check_accounting(pool);
    }
}
