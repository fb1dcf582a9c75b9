/// @file
/// The bookkeeping of a staging ring, apart from memory, streams and locks: where the next region
/// goes, which regions are live and in what order they come back.
#pragma once

#include <custody/core/align.hpp>

#include <gsl/assert>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace custody::staging::detail {

/// What a live region is waiting for before its bytes may be handed out again.
enum class region_state : std::uint8_t {
    reserved,  ///< handed to a producer (a reservation) or being staged; nothing enqueued yet
    in_flight, ///< a copy that reads or writes it is enqueued; the slot's event marks its end
    held,      ///< a download whose ticket is still held by the caller
    cancelled, ///< given back unused; may be reclaimed at once
};

/// One live region, in monotonic byte positions (a position p lies at offset p mod capacity).
///
/// Invariants: begin <= data_begin <= end; end - data_begin == bytes; [data_begin, end) lies within
/// one lap (never straddles the wrap); data_begin - begin is alignment padding or the skipped tail
/// of the previous lap.
struct region {
    std::uint64_t begin = 0;      ///< where this region's claim starts (== the previous region's end)
    std::uint64_t data_begin = 0; ///< where its bytes start
    std::uint64_t end = 0;        ///< one past its last byte
    std::size_t bytes = 0;        ///< payload bytes
    int device = -1;              ///< device of the event recorded for it (-1: none)
    std::uint32_t pins = 0;       ///< threads waiting on its event outside the lock; the slot is not
                                  ///< reused while pins > 0
    region_state state = region_state::cancelled;
};

/// Where a new region was placed: its slot (the index of its event) and its byte offset.
struct placement {
    std::size_t slot;
    std::size_t offset;
};

/// The ring's placement and in-order reclamation. Not thread-safe: the ring guards it with its lock.
///
/// Invariants (head_, tail_ monotonic byte positions; first_, last_ monotonic region numbers):
///   tail_ <= head_ <= tail_ + capacity_               bytes in use = head_ - tail_
///   first_ <= last_ <= first_ + slots_.size()         live regions are numbers [first_, last_),
///                                                     region k in slot k mod slots_.size()
///   tail_ == region(first_).begin when first_ < last_; head_ == region(last_ - 1).end
///   live regions are contiguous and in placement order; only the oldest is ever reclaimed
///   capacity_ is a multiple of every alignment asked for, so offsets keep their alignment
///
/// Complexity: place and reclaim_oldest are O(1).
class ring_index {
public:
    ring_index(std::size_t capacity, std::size_t slots) : capacity_(capacity), slots_(slots) {
        Expects(capacity > 0 && slots > 0);
    }

    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    [[nodiscard]] std::size_t slot_count() const noexcept { return slots_.size(); }
    [[nodiscard]] std::size_t bytes_in_use() const noexcept { return static_cast<std::size_t>(head_ - tail_); }
    [[nodiscard]] std::size_t live_regions() const noexcept { return static_cast<std::size_t>(last_ - first_); }
    [[nodiscard]] bool empty() const noexcept { return first_ == last_; }

    /// Places a region of `bytes` (1 <= bytes <= capacity) at `alignment` (a power of two dividing
    /// the capacity) in state `reserved`, or returns nothing when the ring has no room for it now:
    /// not enough bytes between the head and the oldest live region, or no free slot.
    /// A region that would straddle the wrap starts at offset 0 of the next lap instead. An empty
    /// ring restarts at the next lap when the request does not fit before the wrap, so any request
    /// of at most `capacity` bytes fits in an empty ring.
    [[nodiscard]] std::optional<placement> place(std::size_t bytes, std::size_t alignment) noexcept {
        Expects(bytes > 0 && bytes <= capacity_ && capacity_ % alignment == 0);
        if (live_regions() == slots_.size()) return std::nullopt;
        const std::size_t slot = static_cast<std::size_t>(last_ % slots_.size());
        if (slots_[slot].pins != 0) return std::nullopt;
        std::uint64_t start = data_start(head_, bytes, alignment);
        if (start + bytes - tail_ > capacity_) {
            if (!empty()) return std::nullopt;
            head_ = tail_ = lap_of(head_) + capacity_; // nothing live: skip the rest of this lap for free
            start = head_;
        }
        region& r = slots_[slot];
        r.begin = head_;
        r.data_begin = start;
        r.end = start + bytes;
        r.bytes = bytes;
        r.device = -1;
        r.state = region_state::reserved;
        head_ = r.end;
        ++last_;
        return placement{slot, static_cast<std::size_t>(start - lap_of(start))};
    }

    /// The oldest live region. Precondition: !empty().
    [[nodiscard]] region& oldest() noexcept {
        Expects(!empty());
        return slots_[static_cast<std::size_t>(first_ % slots_.size())];
    }
    [[nodiscard]] std::size_t oldest_slot() const noexcept { return static_cast<std::size_t>(first_ % slots_.size()); }

    /// Gives the oldest region's bytes back. Precondition: !empty().
    void reclaim_oldest() noexcept {
        region& r = oldest();
        tail_ = r.end;
        r.state = region_state::cancelled;
        ++first_;
    }

    [[nodiscard]] region& at(std::size_t slot) noexcept { return slots_[slot]; }
    [[nodiscard]] const region& at(std::size_t slot) const noexcept { return slots_[slot]; }

    /// Calls f(slot, region&) for each live region, oldest first.
    template <class F>
    void for_each_live(F&& f) {
        for (std::uint64_t k = first_; k != last_; ++k) {
            const auto slot = static_cast<std::size_t>(k % slots_.size());
            f(slot, slots_[slot]);
        }
    }

private:
    [[nodiscard]] std::uint64_t lap_of(std::uint64_t position) const noexcept {
        return position - position % capacity_;
    }
    /// Where a region of `bytes` placed at `head` starts: aligned within its lap, or at the next lap
    /// when it would cross the wrap.
    [[nodiscard]] std::uint64_t data_start(std::uint64_t head, std::size_t bytes,
                                           std::size_t alignment) const noexcept {
        const std::uint64_t lap = lap_of(head);
        const std::uint64_t start = lap + align_up(static_cast<std::size_t>(head - lap), alignment);
        return start + bytes > lap + capacity_ ? lap + capacity_ : start;
    }

    std::size_t capacity_;
    std::vector<region> slots_;
    std::uint64_t head_ = 0;
    std::uint64_t tail_ = 0;
    std::uint64_t first_ = 0;
    std::uint64_t last_ = 0;
};

} // namespace custody::staging::detail
