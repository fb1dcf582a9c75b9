/// @file
/// `shard`: one stream's front in a stream_ordered_pool: its lock, its size-class stacks, its recent
/// large blocks and free spans, its event and its counts.
#pragma once

#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/chunk_map.hpp>
#include <custody/pool/detail/class_stacks.hpp>
#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/live_blocks.hpp>
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

/// What the common path reads of a shard before anything else: the stream it serves and its lock.
/// The stream table's empty slots point at one of these that serves no stream.
struct shard_head {
    /// The key of no stream (a retired shard's): every bit set, which no platform hands out.
    static constexpr std::uintptr_t no_stream = ~std::uintptr_t{0};

    /// In `owner`, a pool whose common path records every block (checked mode): the common path's
    /// compare fails and its rare branch takes the call (no key has this bit).
    static constexpr std::uintptr_t checked_bit = std::uintptr_t{1} << 63;

    constexpr explicit shard_head(std::uintptr_t k, std::uintptr_t flags = 0) noexcept
        : mutex(), owner(k == no_stream ? k : k | flags), key(k) {}
    mutable spin_mutex mutex;        ///< first: its address is the shard's
    std::uintptr_t owner;            ///< key | checked_bit in a checked pool (but no_stream), guarded by mutex
    std::atomic<std::uintptr_t> key; ///< Platform::stream_key of the stream served; no_stream: retired

    /// Whether the shard serves stream `k`: a hint without its lock, the truth with it.
    [[nodiscard, gnu::always_inline]] bool serves(std::uintptr_t k) const noexcept {
        return key.load(std::memory_order_relaxed) == k;
    }
    /// serves(k), its lock held, in a pool that is not checked (see checked_bit).
    [[nodiscard, gnu::always_inline]] bool serves_locked(std::uintptr_t k) const noexcept { return owner == k; }
    /// Makes the shard serve stream `k` (no_stream: none), its lock held; `flags`: checked_bit or 0.
    void set_key(std::uintptr_t k, std::uintptr_t flags = 0) noexcept {
        owner = k == no_stream ? k : k | flags;
        key.store(k, std::memory_order_release);
    }
};

/// One stream's part of the pool, over the platform's `Event`. Cache-line aligned: the common path
/// reads and writes the first line (key, lock, pops, credit), its class's hot stack and that
/// stack's storage, all of them this stream's alone.
///
/// Invariants (under mutex):
///   cached() = classes.bytes() + spans[small].bytes() + spans[large].bytes() + recent.bytes()
///   every block held was given back on this stream (or was idle when taken: a large block's tail,
///   blocks adopted behind a stream wait)
///   covered blocks: classes' cold ones, recent.covered() of recent, all of spans; `event` was
///   recorded on this stream after they were given back, so once it completes they are idle. Only
///   covered blocks leave for another stream (except after the pool synchronized the device)
///   uncovered_bytes = bytes of large blocks given back since the last record
///   the stream's allocations = pops + counts.allocations; deallocations = counts.deallocations +
///   classes.fast_pushes(pops); block bytes = counts.block_bytes + classes.fast_block_bytes()
///   the stream's live bytes = credit.live() (counts.live_bytes is left 0: see peak_counter)
///   key != no_stream while the shard serves a stream; slow_users > 0 => it is not retired
/// Thread safety: the pool takes `mutex` around every use; `key` changes only under it (a caller
/// that found the shard by key checks it again there), and the table reads it without.
template <class Event>
struct alignas(64) shard : shard_head {
    using head_type = shard_head;

    /// A shard for the stream of `stream_key`, recording on `e`; its size-class stacks keep up to
    /// `hot_blocks` uncovered blocks per class within `hot_bytes` (see class_stacks).
    shard(std::uintptr_t stream_key, std::uintptr_t flags, Event e, std::size_t hot_blocks, std::size_t hot_bytes)
        : shard_head(stream_key, flags), classes(hot_blocks, hot_bytes), event(std::move(e)) {}
    shard(const shard&) = delete;
    shard& operator=(const shard&) = delete;

    std::uint64_t pops = 0; ///< allocations the common path served
    peak_credit credit;
    class_stacks classes; ///< its hot stacks first: the common path's
    Event event;
    counters counts;                     ///< the careful paths' calls (see the invariant)
    std::size_t uncovered_bytes = 0;     ///< large bytes given back since the last record
    /// spans[small]: size-class blocks merged (coalesced); spans[large]: larger blocks, and the
    /// rests of the chunks of this stream's large blocks
    per_kind<free_set> spans;
    recent_blocks recent;         ///< the large blocks given back most recently
    live_table live;              ///< checked mode: the blocks the common path handed out on this stream
    std::uint32_t slow_users = 0; ///< slow paths in progress on this shard (it is not retired meanwhile)

    // ---- accounting ----

    /// Counts an allocation of `r` served by a careful path from this shard's own blocks; returns
    /// the live bytes its credit did not cover (to commit to the peak counter).
    [[nodiscard]] std::size_t on_allocated(request r) noexcept {
        ++counts.allocations;
        counts.block_bytes += static_cast<std::int64_t>(r.size);
        return credit.charge(r.bytes);
    }
    /// Counts `r` given back on this stream by a careful path; its bytes become credit.
    void on_deallocated(request r) noexcept {
        ++counts.deallocations;
        counts.block_bytes -= static_cast<std::int64_t>(r.size);
        credit.add(r.bytes);
    }
    /// Adds `bytes` to the stream's live bytes; returns what its credit did not cover.
    [[nodiscard]] std::size_t charge(std::size_t bytes) noexcept { return credit.charge(bytes); }
    /// The stream's call counts, its live bytes among them. O(classes).
    [[nodiscard]] counters totals() const noexcept {
        counters c = counts;
        c.allocations += pops;
        c.deallocations += classes.fast_pushes(pops);
        c.block_bytes += classes.fast_block_bytes();
        c.live_bytes = credit.live();
        return c;
    }
    /// The free bytes held. O(classes).
    [[nodiscard]] std::size_t cached() const noexcept {
        return classes.bytes() + spans[block_kind::small].bytes() + spans[block_kind::large].bytes() + recent.bytes();
    }
    /// The free bytes held covered (what other streams may take once the event completes). O(1).
    [[nodiscard]] std::size_t covered_bytes() const noexcept {
        return classes.cold_bytes() + spans[block_kind::small].bytes() + spans[block_kind::large].bytes() +
               recent.covered_bytes();
    }

    // ---- covering ----

    /// Some block is not covered (O(classes)).
    [[nodiscard]] bool dirty() const noexcept { return !recent.all_covered() || classes.any_hot(); }
    /// The event was just recorded on the stream: the recent blocks are covered (the size-class
    /// blocks stay hot: flush moves them, see class_stacks).
    void on_recorded() noexcept {
        recent.cover();
        uncovered_bytes = 0;
    }

    // ---- taking ----

    /// Takes a block of `size` bytes at `alignment` from spans[kind] (best fit); 0 when none fits.
    [[nodiscard]] std::uintptr_t take_span(block_kind kind, std::size_t size, std::size_t alignment) {
        if (spans[kind].empty()) return 0;
        return spans[kind].take(size, alignment).address;
    }
    /// Takes a recent large block of exactly `size` bytes at `alignment`; 0 when none fits.
    [[nodiscard]] std::uintptr_t take_recent(std::size_t size, std::size_t alignment) noexcept {
        return recent.take_exact(size, alignment);
    }

    // ---- moving blocks between the shard's structures ----

    /// Keeps a large block given back now among the recent blocks; the oldest moves to the spans
    /// when there is no room. Precondition: !recent.full() || recent.covered() != 0 (the caller
    /// records first otherwise, as the spans hold only covered blocks). Strong.
    void keep_recent(const free_block& b, const chunk_map& chunks) {
        if (recent.full()) {
            const free_block oldest = chunks.locate(recent.oldest());
            spans[oldest.kind].insert(oldest);
            recent.pop_oldest();
        }
        recent.push(b);
    }

    /// Moves the `count` oldest recent blocks (count <= recent.covered()) into the spans,
    /// coalescing. A bad_alloc leaves those not yet moved among the recent ones.
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

    /// Moves every covered size-class block into the spans, coalescing runs of neighbours (see
    /// chunk_map::insert_runs), through `scratch` (reserved by the caller for
    /// classes.count(which_blocks::covered) blocks). Blocks no node could store go to `lost(size)`.
    template <class Lost>
    void merge_classes(std::vector<free_block>& scratch, const chunk_map& chunks, Lost&& lost) noexcept {
        classes.take(which_blocks::covered, [&](std::uintptr_t a, std::size_t size) { scratch.push_back({a, size, 0}); });
        chunks.insert_runs(scratch, spans, lost);
    }

    /// Takes the blocks `which` means out of the shard (every span's: they are covered), chunks to
    /// be looked up by the receiver. Strong: throws bad_alloc before taking anything.
    [[nodiscard]] std::vector<free_block> take_blocks(which_blocks which) {
        std::vector<free_block> blocks;
        const std::size_t from_recent = which == which_blocks::all ? recent.size() : recent.covered();
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
        if (which == which_blocks::all) uncovered_bytes = 0;
        return blocks;
    }

    /// Makes an empty, retired shard serve stream `k` (its lock held); `flags` as set_key's.
    void serve(std::uintptr_t k, std::uintptr_t flags) noexcept {
        counts = {};
        credit = {};
        pops = 0;
        classes.forget_counts();
        uncovered_bytes = 0;
        set_key(k, flags);
    }

    /// The largest free block held.
    [[nodiscard]] std::size_t largest() const noexcept {
        std::size_t n = std::max(recent.largest(), classes.largest());
        for (const auto& set : spans) n = std::max(n, set.largest());
        return n;
    }
};

} // namespace custody::pool::detail
