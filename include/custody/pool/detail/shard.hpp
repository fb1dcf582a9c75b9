/// @file
/// `shard`: what a stream_ordered_pool keeps for one stream: its lock, its event, the blocks given
/// back on it and its counters.
#pragma once

#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/class_lists.hpp>
#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/peak_counter.hpp>
#include <custody/pool/detail/recent_blocks.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/spin_mutex.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

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
///   1 <= to_record <= record_interval; to_record == record_interval => every block is covered
///   uncovered_bytes = bytes given back since the last record
///   counts.live_bytes and credit: see peak_counter
/// Thread safety: the pool takes `mutex` around every use but of `key` (immutable).
template <class Event>
struct alignas(64) shard {
    shard(std::uintptr_t stream_key, Event e, std::size_t record_interval)
        : key(stream_key), event(std::move(e)), to_record(record_interval) {}
    shard(const shard&) = delete;
    shard& operator=(const shard&) = delete;

    const std::uintptr_t key; ///< Platform::stream_key of the stream
    mutable spin_mutex mutex;
    Event event;
    std::size_t cached = 0;
    counters counts;
    peak_credit credit;
    std::size_t to_record;           ///< frees left before the next record
    std::size_t uncovered_bytes = 0; ///< bytes given back since the last record
    class_lists classes;             ///< free size-class blocks, and which of them are covered
    /// spans[small]: size-class blocks merged (coalesced); spans[large]: larger blocks, and the
    /// rests of the chunks of this stream's large blocks
    per_kind<free_set> spans;
    recent_blocks recent; ///< the large blocks given back most recently

    // ---- accounting ----

    /// Counts an allocation of `r` served from this shard's own lists; returns the live bytes its
    /// credit did not cover (to commit to the peak counter).
    [[nodiscard]] std::size_t on_allocated(const request& r) noexcept {
        ++counts.allocations;
        counts.block_bytes += static_cast<std::int64_t>(r.size);
        return charge(r.bytes);
    }
    /// Adds `bytes` to the stream's live bytes; returns what its credit did not cover.
    [[nodiscard]] std::size_t charge(std::size_t bytes) noexcept {
        counts.live_bytes += static_cast<std::int64_t>(bytes);
        return credit.charge(bytes);
    }
    /// Counts `r` given back on this stream; its bytes become credit.
    void on_deallocated(const request& r) noexcept {
        ++counts.deallocations;
        counts.block_bytes -= static_cast<std::int64_t>(r.size);
        counts.live_bytes -= static_cast<std::int64_t>(r.bytes);
        credit.add(r.bytes);
    }

    // ---- covering ----

    /// Some block was given back since the last record.
    [[nodiscard]] bool dirty(std::size_t record_interval) const noexcept { return to_record != record_interval; }
    /// Counts a block of `size` bytes stored; true when the event is due to be recorded.
    [[nodiscard]] bool stored(std::size_t size, std::size_t record_bytes) noexcept {
        cached += size;
        uncovered_bytes += size;
        return --to_record == 0 || uncovered_bytes >= record_bytes;
    }
    /// The event was just recorded on the stream: every block held is covered.
    void on_recorded(std::size_t record_interval) noexcept {
        classes.on_record();
        recent.cover();
        to_record = record_interval;
        uncovered_bytes = 0;
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
