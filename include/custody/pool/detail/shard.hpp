/// @file
/// `shard`: what a stream_ordered_pool keeps for one stream: its lock, its event, the blocks given
/// back on it and its counters.
#pragma once

#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/chunk_map.hpp>
#include <custody/pool/detail/class_lists.hpp>
#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/peak_counter.hpp>
#include <custody/pool/detail/recent_blocks.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/spin_mutex.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace custody::pool::detail {

/// One stream's part of the pool, over the platform's `Event`. Cache-line aligned so that two
/// streams' locks never share a line.
///
/// Invariants (under mutex):
///   cached = the bytes of the blocks in classes + spans[small].bytes() + spans[large].bytes()
///            + recent.bytes()
///   every block in classes, spans and recent was given back on this stream (or was idle when
///   taken: the rest of a large block's chunk, kept beside it)
///   covered blocks: those classes.covered() and recent.covered() count, and all of spans;
///   `event` was recorded on this stream after they were given back, so once it completes they
///   are idle. Only covered blocks leave the shard for another stream (except after the pool
///   synchronized the device).
///   1 <= to_record <= record_interval; uncovered_bytes = bytes given back since the last record;
///   uncovered_bytes == 0 and to_record == record_interval => every block is covered
///   record_limit = the bytes given back that make the stream record: the pool's record_bytes and
///   record_share as they stood at the last record (a division kept off the common path)
///   the stream's live bytes = credit.live() (counts.live_bytes is left 0: see peak_counter)
///   key != no_stream while the shard serves a stream; slow_users > 0 => it is not retired
/// Thread safety: the pool takes `mutex` around every use; `key` changes only under it (a caller
/// that found the shard by key checks it again there), and the table reads it without.
template <class Event>
struct alignas(64) shard {
    shard(std::uintptr_t stream_key, Event e, std::size_t record_interval)
        : key(stream_key), event(std::move(e)), to_record(record_interval) {}
    shard(const shard&) = delete;
    shard& operator=(const shard&) = delete;

    /// The key of no stream (a retired shard's): every bit set, which no platform hands out.
    static constexpr std::uintptr_t no_stream = ~std::uintptr_t{0};

    std::atomic<std::uintptr_t> key; ///< Platform::stream_key of the stream served; no_stream: retired
    mutable spin_mutex mutex;
    Event event;
    std::size_t cached = 0;
    counters counts;
    peak_credit credit;
    std::size_t to_record;           ///< frees left before the next record
    std::size_t uncovered_bytes = 0; ///< bytes given back since the last record
    std::size_t record_limit = SIZE_MAX; ///< uncovered bytes that make the stream record
    class_lists classes;             ///< free size-class blocks, and which of them are covered
    /// spans[small]: size-class blocks merged (coalesced); spans[large]: larger blocks, and the
    /// rests of the chunks of this stream's large blocks
    per_kind<free_set> spans;
    recent_blocks recent; ///< the large blocks given back most recently
    std::uint32_t slow_users = 0; ///< slow paths in progress on this shard (it is not retired meanwhile)

    // ---- accounting ----

    /// Counts an allocation of `r` served from this shard's own lists; returns the live bytes its
    /// credit did not cover (to commit to the peak counter).
    [[nodiscard]] std::size_t on_allocated(request r) noexcept {
        ++counts.allocations;
        counts.block_bytes += static_cast<std::int64_t>(r.size);
        return credit.charge(r.bytes);
    }
    /// The fast path's allocation: a block of `size` bytes from a class list for `bytes`; returns
    /// the live bytes its credit did not cover.
    [[nodiscard, gnu::always_inline]] std::size_t on_popped(std::size_t size, std::size_t bytes) noexcept {
        cached -= size;
        ++counts.allocations;
        counts.block_bytes += static_cast<std::int64_t>(size);
        return credit.charge(bytes);
    }
    /// The fast path's free: a block of `size` bytes for `bytes` pushed on a class list; true when
    /// the event is due to be recorded (every record_interval frees, or record_limit bytes given back).
    [[nodiscard, gnu::always_inline]] bool on_pushed(std::size_t size, std::size_t bytes) noexcept {
        ++counts.deallocations;
        counts.block_bytes -= static_cast<std::int64_t>(size);
        credit.add(bytes);
        return stored(size);
    }
    /// Adds `bytes` to the stream's live bytes; returns what its credit did not cover.
    [[nodiscard]] std::size_t charge(std::size_t bytes) noexcept { return credit.charge(bytes); }
    /// Counts `r` given back on this stream; its bytes become credit.
    void on_deallocated(request r) noexcept {
        ++counts.deallocations;
        counts.block_bytes -= static_cast<std::int64_t>(r.size);
        credit.add(r.bytes);
    }
    /// The stream's call counts, its live bytes among them.
    [[nodiscard]] counters totals() const noexcept {
        counters c = counts;
        c.live_bytes = credit.live();
        return c;
    }

    // ---- covering ----

    /// Some block was given back since the last record.
    [[nodiscard]] bool dirty(std::size_t record_interval) const noexcept {
        return uncovered_bytes != 0 || to_record != record_interval;
    }
    /// Counts a block of `size` bytes stored; true when the event is due to be recorded.
    [[nodiscard, gnu::always_inline]] bool stored(std::size_t size) noexcept {
        cached += size;
        uncovered_bytes += size;
        return --to_record == 0 || uncovered_bytes >= record_limit;
    }
    /// The event was just recorded on the stream: every block held is covered; the next record
    /// comes after `limit` more bytes given back (or record_interval frees).
    void on_recorded(std::size_t record_interval, std::size_t limit) noexcept {
        classes.on_record();
        recent.cover();
        to_record = record_interval;
        uncovered_bytes = 0;
        record_limit = limit;
    }

    // ---- taking ----

    /// Takes a block of `size` bytes at `alignment` from spans[kind] (best fit); 0 when none fits.
    [[nodiscard]] std::uintptr_t take_span(block_kind kind, std::size_t size, std::size_t alignment) {
        if (spans[kind].empty()) return 0;
        const free_block b = spans[kind].take(size, alignment);
        cached -= b.size;
        return b.address;
    }
    /// Takes a recent large block of exactly `size` bytes at `alignment`; 0 when none fits.
    [[nodiscard]] std::uintptr_t take_recent(std::size_t size, std::size_t alignment) noexcept {
        const std::uintptr_t address = recent.take_exact(size, alignment);
        if (address != 0) cached -= size;
        return address;
    }
    /// How many recent blocks `which` means (the oldest ones).
    [[nodiscard]] std::size_t recent_count(which_blocks which) const noexcept {
        return which == which_blocks::all ? recent.size() : recent.covered();
    }
    // ---- moving blocks between the shard's structures ----

    /// Keeps a large block given back now among the recent blocks; the oldest moves to the spans
    /// when there is no room. Precondition: !recent.full() || recent.covered() != 0 (the caller
    /// records first otherwise, as the spans hold only covered blocks). Strong: a bad_alloc (from
    /// the spans) changes nothing.
    void keep_recent(const free_block& b, const chunk_map& chunks) {
        if (recent.full()) {
            const free_block oldest = chunks.locate(recent.oldest());
            spans[oldest.kind].insert(oldest);
            recent.pop_oldest();
        }
        recent.push(b);
    }

    /// Moves the `count` oldest recent blocks (count <= recent.covered()) into the spans,
    /// coalescing. A bad_alloc leaves the blocks not yet moved among the recent ones, where they
    /// serve as well.
    void merge_recent(std::size_t count, const chunk_map& chunks) noexcept {
        try {
            for (; count != 0; --count) {
                const free_block b = chunks.locate(recent.oldest());
                spans[b.kind].insert(b);
                recent.pop_oldest();
            }
        } catch (...) {
        }
    }

    /// Moves every size-class block into the spans, coalescing runs of neighbours (see
    /// chunk_map::insert_runs), through `scratch` (reserved by the caller for
    /// classes.count(which_blocks::all) blocks). Precondition: every block is covered. Blocks that no node
    /// could store go to `lost(size)`.
    template <class Lost>
    void merge_classes(std::vector<free_block>& scratch, const chunk_map& chunks, Lost&& lost) noexcept {
        classes.take(which_blocks::all, [&](std::uintptr_t a, std::size_t size) { scratch.push_back({a, size, 0}); });
        cached -= chunks.insert_runs(scratch, spans, lost);
    }

    /// Takes the blocks `which` means out of the shard (every span's: they are covered), chunks to
    /// be looked up by the receiver. Strong: throws bad_alloc before taking anything.
    [[nodiscard]] std::vector<free_block> take_blocks(which_blocks which, std::size_t record_interval) {
        std::vector<free_block> blocks;
        const std::size_t from_recent = recent_count(which);
        blocks.reserve(spans[block_kind::small].count() + spans[block_kind::large].count() + from_recent +
                       classes.count(which));
        classes.take(which, [&](std::uintptr_t a, std::size_t size) { blocks.push_back({a, size, 0}); });
        recent.take_oldest(from_recent, [&](const free_block& b) { blocks.push_back(b); });
        for (block_kind kind : block_kinds) {
            spans[kind].drain([&](free_block b) {
                b.kind = kind;
                blocks.push_back(b);
            });
        }
        for (const auto& b : blocks) cached -= b.size;
        if (which == which_blocks::all) {
            to_record = record_interval;
            uncovered_bytes = 0;
        }
        return blocks;
    }

    /// Whether the shard serves stream `k` (its lock held).
    [[nodiscard]] bool serves(std::uintptr_t k) const noexcept { return key.load(std::memory_order_relaxed) == k; }

    /// Makes an empty, retired shard serve stream `k` (its lock held).
    void serve(std::uintptr_t k, std::size_t record_interval) noexcept {
        counts = {};
        credit = {};
        to_record = record_interval;
        uncovered_bytes = 0;
        key.store(k, std::memory_order_release);
    }

    /// The bytes of the size-class lists.
    [[nodiscard]] std::size_t class_bytes() const noexcept {
        return cached - spans[block_kind::small].bytes() - spans[block_kind::large].bytes() - recent.bytes();
    }
    /// The largest free block held.
    [[nodiscard]] std::size_t largest() const noexcept {
        std::size_t n = std::max(recent.largest(), classes.largest());
        for (const auto& set : spans) n = std::max(n, set.largest());
        return n;
    }
};

} // namespace custody::pool::detail
