// The pool's bookkeeping in detail/, apart from memory, streams and locks: size classes, the free
// set, the class stacks and their covered rule, the recent blocks, the chunk map, the growth rule,
// the peak counter, the stream table and the event pool.
#include <custody/platform/host.hpp>
#include <custody/pool/detail/chunk_map.hpp>
#include <custody/pool/detail/class_stacks.hpp>
#include <custody/pool/detail/event_pool.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/growth.hpp>
#include <custody/pool/detail/peak_counter.hpp>
#include <custody/pool/detail/recent_blocks.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/shard.hpp>
#include <custody/pool/detail/size_classes.hpp>
#include <custody/pool/detail/stream_table.hpp>

#include "../support/catch.hpp"
#include "support.hpp"

#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <vector>

using namespace custody_pool_test;
namespace detail = custody::pool::detail;

// ---- rounding ------------------------------------------------------------------------------------

TEST_CASE("size classes cover every small size with at most 1/16 waste", "[pool][classes]") {
    std::size_t previous_class = 0;
    for (std::size_t n = 1; n <= detail::small_threshold; ++n) {
        const std::size_t c = detail::class_of(n);
        const std::size_t size = detail::class_size(c);
        REQUIRE(c < detail::class_count);
        REQUIRE(c == detail::compute_class_of(n)); // the fast path's table, against the formula
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

TEST_CASE("free_set: the fit a take would use, and the neighbours of a block kept elsewhere", "[pool][free_set]") {
    detail::free_set set;
    const std::uintptr_t c = 0x100000; // one chunk of 64 KiB: free [0, 8) and [24, 64) KiB
    set.insert({c, 8 * KiB, c});
    set.insert({c + 24 * KiB, 40 * KiB, c});
    CHECK(set.fit(4 * KiB, 256) == 8 * KiB);
    CHECK(set.fit(9 * KiB, 256) == 40 * KiB);
    CHECK(set.fit(41 * KiB, 256) == 0);
    // A block [8, 24) KiB kept elsewhere: its neighbours here, by its start and its end.
    CHECK(set.take_ending_at(c + 8 * KiB, 0x900000).size == 0); // another chunk's: not a neighbour
    CHECK(set.take_ending_at(c + 12 * KiB, c).size == 0);       // nothing ends there
    const detail::free_block before = set.take_ending_at(c + 8 * KiB, c);
    CHECK((before.address == c && before.size == 8 * KiB && before.chunk == c));
    const detail::free_block after = set.take_at(c + 24 * KiB, c, SIZE_MAX);
    CHECK((after.address == c + 24 * KiB && after.size == 40 * KiB));
    CHECK(set.empty());
    CHECK(set.bytes() == 0);
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

// ---- a request classified once -------------------------------------------------------------------

TEST_CASE("a request is classified once: size class and block size when small, granule rounding when large",
          "[pool][request]") {
    const detail::request small = detail::classify(1000, 512);
    CHECK(small.small());
    CHECK(small.kind == detail::block_kind::small);
    CHECK(small.size == detail::class_size(small.size_class));
    CHECK(small.size == 1024);
    CHECK(small.alignment == 512);
    const detail::request edge = detail::classify(detail::small_threshold, 256);
    CHECK(edge.small());
    CHECK(edge.size == detail::small_threshold);
    const detail::request large = detail::classify(detail::small_threshold + 1, 256);
    CHECK(!large.small());
    CHECK(large.size == detail::small_threshold + detail::granule);
    CHECK(large.size_class == 0);
    CHECK(detail::other(detail::block_kind::small) == detail::block_kind::large);
    CHECK(detail::other(detail::block_kind::large) == detail::block_kind::small);
}

// ---- class stacks: the hot side and the covered side --------------------------------------------

TEST_CASE("class stacks: the common path pushes and pops a hot stack within its cap; a flush covers it",
          "[pool][classes]") {
    detail::class_stacks stacks(63, 64 * MiB);
    std::uintptr_t a = 0;
    CHECK_FALSE(stacks.try_pop(3, a));             // nothing yet
    CHECK_FALSE(stacks.try_push(3, 0x1000));       // no storage before a careful push makes it
    REQUIRE(stacks.push(3, 0x1000));               // the careful way makes it
    REQUIRE(stacks.try_push(3, 0x2000));
    CHECK(stacks.hot_count(3) == 2);
    CHECK(stacks.count(detail::which_blocks::covered) == 0); // hot blocks are never covered
    CHECK(stacks.try_pop(3, a));
    CHECK(a == 0x2000); // newest first
    // The common path counts nothing; what it did is derived from the careful moves.
    CHECK(stacks.fast_pushes(1) == 1); // a careful push (0x1000), then a common push and a common pop
    CHECK(stacks.fast_block_bytes() == 0);
    stacks.flush(); // a record: every hot block is covered
    CHECK(stacks.hot_count(3) == 0);
    CHECK(stacks.cold_count(3) == 1);
    CHECK(stacks.cold_bytes() == detail::class_size(3));
    CHECK(stacks.count(detail::which_blocks::covered) == 1);
    CHECK_FALSE(stacks.try_pop(3, a));           // the common path sees no cold block
    CHECK(stacks.refill_from_cold(3) == 1);      // the careful way brings it back
    CHECK(stacks.pop(3, 256) == 0x1000);
    CHECK(stacks.bytes() == 0);
    CHECK(stacks.fast_pushes(1) == 1);           // unchanged by the careful moves
}

TEST_CASE("class stacks: caps start at 256 KiB of a class, grow on a miss, stay within the budget",
          "[pool][classes]") {
    detail::class_stacks stacks(63, 2 * MiB);
    const std::size_t big = detail::class_count - 1; // 1 MiB blocks: one of them at first
    CHECK(stacks.cap(big) == 1);
    CHECK(stacks.cap(0) == 63); // 256-byte blocks: the most a class keeps
    REQUIRE(stacks.push(big, 0x100000));
    CHECK_FALSE(stacks.try_push(big, 0x200000)); // full: the careful way covers it
    CHECK(stacks.refill_from_cold(big) == 0);    // a miss: the cap doubles, within 2 MiB in all
    CHECK(stacks.cap(big) == 2);
    CHECK(stacks.try_push(big, 0x200000));
    CHECK(stacks.refill_from_cold(big) == 0);
    CHECK(stacks.cap(big) == 2); // 4 MiB would pass the budget
    // A stack that cannot cover its blocks holds more than its cap; the common path sees it full.
    CHECK(stacks.push_beyond_cap(big, 0x300000));
    CHECK(stacks.hot_count(big) == 3);
    CHECK(stacks.hot_room(big) == 0);
    CHECK_FALSE(stacks.try_push(big, 0x400000));
    // No hot stacks at all (record_interval 1): every block given back is covered at once.
    detail::class_stacks none(0, 64 * MiB);
    CHECK_FALSE(none.push(0, 0x1000));
    CHECK(none.cap(0) == 0);
}

TEST_CASE("class stacks: other streams take cold blocks only, oldest first", "[pool][classes]") {
    detail::class_stacks stacks(63, 64 * MiB);
    REQUIRE(stacks.push(7, 0xA000));
    REQUIRE(stacks.push(9, 0xB000));
    stacks.flush(7); // only class 7's record-covered blocks move
    REQUIRE(stacks.push(7, 0xC000));
    std::vector<std::uintptr_t> taken;
    stacks.take(detail::which_blocks::covered, [&](std::uintptr_t a, std::size_t size) {
        taken.push_back(a);
        CHECK(size == detail::class_size(7));
    });
    CHECK(taken == std::vector<std::uintptr_t>{0xA000});
    CHECK(stacks.count(detail::which_blocks::all) == 2); // 0xB000 and 0xC000 stay hot
    const std::uintptr_t cold[] = {0x10000, 0x20000, 0x30000};
    stacks.push_cold(5, cold, 3);
    std::vector<std::uintptr_t> oldest;
    CHECK(stacks.take_cold(5, 2, [&](std::uintptr_t a) { oldest.push_back(a); }) == 2);
    CHECK(oldest == std::vector<std::uintptr_t>{0x10000, 0x20000});
    CHECK(stacks.largest() == detail::class_size(9));
    stacks.take(detail::which_blocks::all, [](std::uintptr_t, std::size_t) {});
    CHECK(stacks.count(detail::which_blocks::all) == 0);
    CHECK(stacks.bytes() == 0);
}

// ---- recent large blocks -------------------------------------------------------------------------

TEST_CASE("recent blocks: exact-size reuse lowest address first, the covered prefix kept through removals",
          "[pool][recent]") {
    detail::recent_blocks recent;
    const std::size_t a = 2 * MiB, b = 3 * MiB;
    recent.push({0x800000, a, 0});
    recent.push({0x400000, b, 0});
    recent.cover(); // both covered
    recent.push({0x100000, a, 0});
    recent.push({0xC00000, b, 0});
    CHECK(recent.full());
    CHECK(recent.covered() == 2);
    CHECK(recent.bytes() == 2 * a + 2 * b);
    CHECK(recent.largest() == b);
    CHECK(recent.take_exact(a, 256) == 0x100000); // the lowest of that size (the newest, not covered)
    CHECK(recent.covered() == 2);
    CHECK(recent.take_exact(a, 256) == 0x800000); // the covered one
    CHECK(recent.covered() == 1);
    CHECK(recent.take_exact(a, 256) == 0);
    CHECK(recent.take_exact(b, 8 * MiB) == 0); // none so aligned
    CHECK(recent.oldest().address == 0x400000);
    recent.pop_oldest();
    CHECK(recent.covered() == 0);
    CHECK(recent.size() == 1);
    std::vector<std::uintptr_t> taken;
    recent.take_oldest(1, [&](const detail::free_block& f) { taken.push_back(f.address); });
    CHECK(taken == std::vector<std::uintptr_t>{0xC00000});
    CHECK(recent.empty());
}

// ---- the chunk map -------------------------------------------------------------------------------

TEST_CASE("chunk map: lookups inside chunks only, the reserve and its peak, runs inserted per chunk",
          "[pool][chunks]") {
    detail::chunk_map chunks;
    const std::uintptr_t a = 0x1000000, b = a + 64 * KiB; // adjacent chunks
    chunks.add(a, 64 * KiB, detail::block_kind::small);
    chunks.add(b, 128 * KiB, detail::block_kind::large);
    CHECK(chunks.reserved() == 192 * KiB);
    CHECK(chunks.count() == 2);
    CHECK(chunks.find(a + 100).base == a);
    CHECK(chunks.find(b).kind == detail::block_kind::large);
    CHECK(chunks.find(b + 128 * KiB).size == 0); // past the last chunk
    CHECK(chunks.find(a - 1).size == 0);
    CHECK(chunks.is_whole(b, 128 * KiB));
    CHECK(!chunks.is_whole(b, 64 * KiB));
    const detail::free_block located = chunks.locate({b + 4096, 4096, 0});
    CHECK(located.chunk == b);
    CHECK(located.kind == detail::block_kind::large);
    // Four blocks: two adjacent in a, one at a's end, one at b's start. The last two touch but lie in
    // two chunks: they stay apart.
    std::vector<detail::free_block> blocks{
        {a + 60 * KiB, 4 * KiB, 0}, {a, 4 * KiB, 0}, {a + 4 * KiB, 4 * KiB, 0}, {b, 4 * KiB, 0}};
    detail::per_kind<detail::free_set> sets;
    std::size_t lost = 0;
    CHECK(chunks.insert_runs(blocks, sets, [&](std::size_t n) { lost += n; }) == 0);
    CHECK(lost == 0);
    CHECK(sets[detail::block_kind::small].count() == 2); // [a, a + 8 KiB) and the block at a's end
    CHECK(sets[detail::block_kind::small].largest() == 8 * KiB);
    CHECK(sets[detail::block_kind::large].count() == 1);
    chunks.remove(a);
    CHECK(chunks.reserved() == 128 * KiB);
    CHECK(chunks.peak_reserved() == 192 * KiB);
    CHECK(chunks.added() == 2);
    CHECK(chunks.removed() == 1);
    CHECK(chunks.find(a).size == 0);
}

// ---- the growth rule -----------------------------------------------------------------------------

TEST_CASE("growth rule: chunk sizes grow with the reserve in whole pages, limits hold", "[pool][growth]") {
    custody::pool::pool_options o;
    o.growth_step = 2 * MiB;
    o.growth_divisor = 4;
    const detail::growth_rule rule(o);
    CHECK(rule.preferred_chunk(64 * KiB, 0) == 2 * MiB);        // the step
    CHECK(rule.preferred_chunk(64 * KiB, 20 * MiB) == 4 * MiB); // 5 MiB rounded down to pages
    CHECK(rule.preferred_chunk(5 * MiB + 1, 0) == 6 * MiB);     // the request, rounded up to pages
    // A large request gets a whole number of blocks of its size: 16 MiB preferred holds two 6 MiB
    // blocks (a 16 MiB chunk would leave 4 MiB that no later 6 MiB request can use), five of 3 MiB.
    CHECK(rule.preferred_chunk(6 * MiB, 64 * MiB) == 12 * MiB);
    CHECK(rule.preferred_chunk(3 * MiB, 64 * MiB) == 16 * MiB);
    CHECK(rule.preferred_chunk(3 * MiB + 256, 64 * MiB) == 16 * MiB); // 5 blocks, rounded up to pages
    CHECK(rule.preferred_chunk(9 * MiB, 64 * MiB) == 10 * MiB);       // one block, rounded up to pages
    CHECK(rule.allows(1 * MiB, 1000 * MiB, std::nullopt));      // no limit, no budget
    o.maximum_size = 8 * MiB;
    o.device_capacity = 10 * MiB;
    o.device_headroom = 4 * MiB;
    const detail::growth_rule limited(o);
    CHECK(limited.allows(2 * MiB, 4 * MiB, std::nullopt));
    CHECK(!limited.allows(3 * MiB, 4 * MiB, std::nullopt)); // the budget: 10 - 4 = 6 MiB
    CHECK(!limited.allows(9 * MiB, 0, std::nullopt));        // the maximum
    CHECK(limited.request_limit() == 6 * MiB);
    // A device that reports its free memory: others' use counts, the pool's own reserve does not.
    CHECK(limited.allows(2 * MiB, 0, custody::device_memory{6 * MiB, 16 * MiB}));
    CHECK(!limited.allows(3 * MiB, 0, custody::device_memory{6 * MiB, 16 * MiB}));
}

// ---- the peak counter ----------------------------------------------------------------------------

TEST_CASE("peak counter: a stream's credit covers its own reuse; a new peak takes the others' back",
          "[pool][peak]") {
    detail::peak_counter counter;
    std::vector<detail::peak_credit> credits(2);
    const auto commit = [&](std::size_t owed) {
        counter.commit(owed, [&](detail::peak_counter::reclaimer& r) {
            for (auto& c : credits) {
                if (r.wanted()) r.take(c);
            }
        });
    };
    commit(credits[0].charge(100)); // stream 0: 100 live
    CHECK(counter.peak() == 100);
    credits[0].add(100); // given back: credit 100
    CHECK(credits[0].charge(60) == 0); // covered by the credit: no commit
    commit(credits[1].charge(30));     // stream 1: committed 130 > 100: takes stream 0's 40 back
    CHECK(counter.peak() == 100);      // 90 live: no new peak
    CHECK(credits[0].bytes() == 0);
    commit(credits[1].charge(20)); // 110 live: a new peak, exact (not 150 with stream 0's credit)
    CHECK(counter.peak() == 110);
    credits[1].add(50);
    counter.release(60); // stream 0's 60 given back without a credit to keep them
    commit(credits[1].charge(50)); // covered by stream 1's credit
    CHECK(counter.peak() == 110);
}

// ---- the stream table ----------------------------------------------------------------------------

namespace {
struct fake_shard : detail::shard_head {
    using head_type = detail::shard_head;
    explicit fake_shard(std::uintptr_t k) : shard_head(k) {}
};
} // namespace

TEST_CASE("stream table: one shard per key, found without creating, none past the capacity", "[pool][streams]") {
    detail::stream_table<fake_shard> table(2);
    int made = 0;
    const auto make = [&](std::uintptr_t key) {
        return [&made, key](fake_shard* reuse) {
            ++made;
            if (reuse != nullptr) {
                reuse->set_key(key);
                return reuse;
            }
            return new fake_shard(key);
        };
    };
    CHECK(table.find(0x10) == nullptr);
    fake_shard* a = table.find_or_create(0x10, make(0x10));
    REQUIRE(a != nullptr);
    CHECK(table.find(0x10) == a);
    CHECK(table.home(0x10) == a); // the common path's index
    CHECK_FALSE(table.home(0x20)->serves(0x20));
    CHECK(table.find_or_create(0x10, make(0x10)) == a);
    fake_shard* b = table.find_or_create(0x20, make(0x20));
    CHECK(b != nullptr);
    CHECK(table.find_or_create(0x30, make(0x30)) == nullptr); // full
    CHECK(made == 2);
    CHECK(table.size() == 2);
    std::vector<std::uintptr_t> keys;
    table.for_each([&](fake_shard& s) { keys.push_back(s.key); });
    CHECK(keys == std::vector<std::uintptr_t>{0x10, 0x20});
    // A retired shard serves the next new key; the retired key is found no more, the others still.
    a->set_key(~std::uintptr_t{0});
    table.retire(a, 0x10);
    CHECK(table.find(0x10) == nullptr);
    CHECK_FALSE(table.home(0x10)->serves(0x10));
    CHECK(table.find(0x20) == b);
    CHECK(table.serving() == 1);
    CHECK(table.find_or_create(0x30, make(0x30)) == a);
    CHECK(table.find(0x30) == a);
    CHECK(table.size() == 2);
    CHECK(table.serving() == 2);
    // Keys that collide keep finding each other through retired slots, many times over.
    for (std::uintptr_t k = 0x40; k < 0x40 + 64 * 0x10; k += 0x10) {
        b->set_key(~std::uintptr_t{0});
        table.retire(b, k == 0x40 ? 0x20 : k - 0x10);
        REQUIRE(table.find_or_create(k, make(k)) == b);
        REQUIRE(table.find(k) == b);
        REQUIRE(table.find(0x30) == a);
    }
    // What making a shard throws leaves the table as it was.
    detail::stream_table<fake_shard> other(2);
    CHECK_THROWS_AS(other.find_or_create(0x40, [](fake_shard*) -> fake_shard* { throw std::bad_alloc(); }),
                    std::bad_alloc);
    CHECK(other.size() == 0);
    CHECK(other.find(0x40) == nullptr);
}

TEST_CASE("stream table: the common path's index holds one shard per slot, none while it is off",
          "[pool][streams]") {
    detail::stream_table<fake_shard> table(4);
    const auto make = [](std::uintptr_t key) { return [key](fake_shard*) { return new fake_shard(key); }; };
    fake_shard* a = table.find_or_create(0x110, make(0x110));
    fake_shard* b = table.find_or_create(0x210, make(0x210)); // the same slot (key mod 256)
    CHECK(table.home(0x110) == a);
    CHECK_FALSE(table.home(0x210)->serves(0x210)); // found the careful way
    CHECK(table.find(0x210) == b);
    table.set_fast(false); // a capture is routed: the common path finds nothing
    CHECK_FALSE(table.home(0x110)->serves(0x110));
    CHECK(table.find(0x110) == a);
    table.set_fast(true);
    CHECK(table.home(0x110) == a);
    a->set_key(~std::uintptr_t{0});
    table.retire(a, 0x110); // the slot passes to the other shard of that slot
    CHECK(table.home(0x210) == b);
}
