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
#include <custody/pool/detail/stream_table.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace custody::pool::detail {

/// One stream's part of the pool, over the platform's `Event`. Cache-line aligned so that two
/// streams' locks never share a line.
///
/// Invariants (under mutex):
///   cached_bytes() = classes.bytes() + spans[small].bytes() + spans[large].bytes() + recent.bytes()
///   counts.block_bytes = the live block bytes counted on this stream + classes.bytes(): a block
///   moving between the stream's class lists and its user (the fast path) changes neither, so the
///   fast path counts no bytes but the live ones; tally() takes the lists' bytes back out
///   every block in classes, spans and recent was given back on this stream (or was idle when
///   taken: the rest of a large block's chunk, kept beside it)
///   covered blocks: those classes.covered() and recent.covered() count, and all of spans;
///   `event` was recorded on this stream after they were given back, so once it completes they
///   are idle. Only covered blocks leave the shard for another stream (except after the pool
///   synchronized the device).
///   1 <= to_record <= record_interval; to_record == record_interval => every block is covered
///   uncovered_bytes = bytes given back (as requested) since the last record; record_limit: the bytes that make
///   the stream record again, fixed at each record (and at creation)
///   credit: the stream's live bytes and its credit (see peak_counter); counts.live_bytes is
///   not kept here (tally() fills it in)
/// Thread safety: the pool takes `mutex` around every use but of `key` (immutable).
template <class Event>
struct alignas(64) shard : keyed { // keyed: `key`, the stream's, immutable
    shard(std::uintptr_t stream_key, Event e, std::size_t record_interval, std::size_t first_record_limit)
        : keyed{stream_key}, event(std::move(e)), to_record(static_cast<std::uint32_t>(record_interval)),
          record_limit(first_record_limit) {}
    shard(const shard&) = delete;
    shard& operator=(const shard&) = delete;

    mutable spin_mutex mutex;
    Event event;
    counters counts;
    peak_credit credit;
    std::uint32_t to_record;         ///< frees left before the next record (32 bits: see validated)
    std::size_t uncovered_bytes = 0; ///< bytes given back since the last record
    std::size_t record_limit;        ///< uncovered_bytes that make the stream record
    class_lists classes;             ///< free size-class blocks, and which of them are covered
    /// spans[small]: size-class blocks merged (coalesced); spans[large]: larger blocks, and the
    /// rests of the chunks of this stream's large blocks
    per_kind<free_set> spans;
    recent_blocks recent; ///< the large blocks given back most recently
    static constexpr std::uint32_t never = UINT32_MAX;
    std::uint32_t recent_used = never; ///< the epoch of the last take from recent

    // ---- accounting ----

    /// Counts a block of a class list handed out for `bytes`; returns the live bytes its credit did
    /// not cover (to commit to the peak counter).
    [[nodiscard, gnu::always_inline]] std::size_t on_allocated(std::size_t bytes) noexcept {
        ++counts.allocations;
        return charge(bytes);
    }
    /// Counts a block of `size` bytes from elsewhere than the class lists (the slow path, the recent
    /// blocks) handed out for `r`; returns what the credit did not cover. The stream counts as
    /// reusing the request's size (see class_lists).
    [[nodiscard]] std::size_t on_allocated_slow(std::size_t size, request r) noexcept {
        if (r.small()) {
            classes.mark_used(r.size_class);
        } else {
            recent_used = classes.epoch();
        }
        return on_allocated_slow(size, r.bytes);
    }
    /// The same without a size to mark.
    [[nodiscard]] std::size_t on_allocated_slow(std::size_t size, std::size_t bytes) noexcept {
        ++counts.allocations;
        ++counts.slow_allocations;
        counts.block_bytes += static_cast<std::int64_t>(size);
        return charge(bytes);
    }
    /// Adds `bytes` to the stream's live bytes; returns what its credit did not cover.
    [[nodiscard, gnu::always_inline]] std::size_t charge(std::size_t bytes) noexcept { return credit.charge(bytes); }
    /// Counts a block given back on this stream for `bytes` into a class list; they become credit.
    [[gnu::always_inline]] void on_deallocated(std::size_t bytes) noexcept {
        ++counts.deallocations;
        credit.add(bytes);
    }
    /// Counts `size` bytes of blocks that left the counts' reach: given back on this stream into
    /// another structure than a class list (or lost), or taken out of the class lists.
    void uncount_blocks(std::size_t size) noexcept { counts.block_bytes -= static_cast<std::int64_t>(size); }
    /// Counts `size` bytes of blocks that joined the class lists from elsewhere.
    void count_blocks(std::size_t size) noexcept { counts.block_bytes += static_cast<std::int64_t>(size); }

    /// The stream's counts, its live bytes included. O(classes).
    [[nodiscard]] counters tally() const noexcept {
        counters c = counts;
        c.block_bytes -= static_cast<std::int64_t>(classes.bytes());
        c.live_bytes = credit.live();
        return c;
    }
    /// The bytes of every free block the stream holds. O(classes).
    [[nodiscard]] std::size_t cached_bytes() const noexcept {
        return classes.bytes() + spans[block_kind::small].bytes() + spans[block_kind::large].bytes() + recent.bytes();
    }

    // ---- covering ----

    /// Some block was given back since the last record.
    [[nodiscard]] bool dirty(std::size_t record_interval) const noexcept { return to_record != record_interval; }
    /// Counts a block given back for `bytes` and stored; true when the event is due to be recorded.
    [[nodiscard, gnu::always_inline]] bool stored(std::size_t bytes) noexcept {
        uncovered_bytes += bytes;
        return --to_record == 0 || uncovered_bytes >= record_limit;
    }
    /// The event was just recorded on the stream: every block held is covered; the next record
    /// comes after `record_interval` frees or `next_limit` bytes.
    void on_recorded(std::size_t record_interval, std::size_t next_limit) noexcept {
        classes.on_record();
        recent.cover();
        to_record = static_cast<std::uint32_t>(record_interval);
        uncovered_bytes = 0;
        record_limit = next_limit;
    }

    // ---- taking ----

    /// Takes a block of `size` bytes at `alignment` from spans[kind] (best fit); 0 when none fits.
    [[nodiscard]] std::uintptr_t take_span(block_kind kind, std::size_t size, std::size_t alignment) {
        if (spans[kind].empty()) return 0;
        return spans[kind].take(size, alignment).address;
    }
    /// Takes a recent large block of exactly `size` bytes at `alignment`; 0 when none fits.
    [[nodiscard]] std::uintptr_t take_recent(std::size_t size, std::size_t alignment) noexcept {
        const std::uintptr_t address = recent.take_exact(size, alignment);
        if (address != 0) recent_used = classes.epoch();
        return address;
    }
    /// The stream took one of its recent blocks in this epoch or the one before: it is reusing
    /// them, so they serve it rather than other streams (see class_lists).
    [[nodiscard]] bool recent_in_use() const noexcept { return recent_used != never && classes.epoch() - recent_used <= 1; }
    /// How many recent blocks `which` means (the oldest ones).
    [[nodiscard]] std::size_t recent_count(which_blocks which) const noexcept {
        if (which == which_blocks::all) return recent.size();
        return which == which_blocks::idle && recent_in_use() ? 0 : recent.covered();
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
    /// classes.count(false) blocks). Precondition: every block is covered. Blocks that no node
    /// could store go to `lost(size)`.
    template <class Lost>
    void merge_classes(std::vector<free_block>& scratch, const chunk_map& chunks, Lost&& lost) noexcept {
        classes.take(which_blocks::all, [&](std::uintptr_t a, std::size_t size) {
            scratch.push_back({a, size, 0});
            uncount_blocks(size);
        });
        chunks.insert_runs(scratch, spans, lost);
    }

    /// Takes the blocks `which` means out of the shard (every span's: they are covered), chunks to
    /// be looked up by the receiver. Strong: throws bad_alloc before taking anything.
    [[nodiscard]] std::vector<free_block> take_blocks(which_blocks which, std::size_t record_interval) {
        std::vector<free_block> blocks;
        const std::size_t from_recent = recent_count(which);
        blocks.reserve(spans[block_kind::small].count() + spans[block_kind::large].count() + from_recent +
                       classes.count(which));
        classes.take(which, [&](std::uintptr_t a, std::size_t size) {
            blocks.push_back({a, size, 0});
            uncount_blocks(size);
        });
        recent.take_oldest(from_recent, [&](const free_block& b) { blocks.push_back(b); });
        for (block_kind kind : block_kinds) {
            spans[kind].drain([&](free_block b) {
                b.kind = kind;
                blocks.push_back(b);
            });
        }
        if (which == which_blocks::all) {
            to_record = static_cast<std::uint32_t>(record_interval);
            uncovered_bytes = 0;
        }
        return blocks;
    }

    /// The largest free block held.
    [[nodiscard]] std::size_t largest() const noexcept {
        std::size_t n = std::max(recent.largest(), classes.largest());
        for (const auto& set : spans) n = std::max(n, set.largest());
        return n;
    }
};

} // namespace custody::pool::detail
