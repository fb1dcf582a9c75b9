/// @file
/// `allocation_history`: the most recent allocation events of one device, in the order they
/// happened (allocations and frees as a tracking_resource sees them, segments as a segment_journal
/// sees its upstream's chunks): what PyTorch's _record_memory_history keeps, for a memory snapshot
/// that PyTorch's viewer plays back (debug/pytorch_snapshot.hpp).
#pragma once

#include <custody/core/detail/mutex.hpp>
#include <custody/debug/detail/call_stack.hpp>
#include <custody/debug/owner_scope.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace custody::debug {

/// What happened, in PyTorch's trace vocabulary.
enum class history_action : unsigned char {
    alloc,          ///< a block handed out
    free_requested, ///< a block given back by its user
    free_completed, ///< the block is reusable (custody: at once; the pool orders reuse by stream)
    segment_alloc,  ///< memory taken from the device (a pool's chunk)
    segment_free,   ///< memory given back to the device
    oom,            ///< an allocation that found no memory
    segment_map,    ///< memory mapped into a segment that grows by mapping (PyTorch's expandable segments)
    segment_unmap,  ///< memory unmapped from such a segment
};

/// The name PyTorch's snapshot gives an action.
[[nodiscard]] constexpr const char* to_string(history_action a) noexcept {
    switch (a) {
    case history_action::alloc: return "alloc";
    case history_action::free_requested: return "free_requested";
    case history_action::free_completed: return "free_completed";
    case history_action::segment_alloc: return "segment_alloc";
    case history_action::segment_free: return "segment_free";
    case history_action::oom: return "oom";
    case history_action::segment_map: return "segment_map";
    case history_action::segment_unmap: return "segment_unmap";
    }
    return "?";
}

/// One event. `stack` is the allocation's call stack (for a free too); empty unless captured.
struct history_event {
    history_action action = history_action::alloc;
    std::uintptr_t address = 0; ///< the block's or the segment's; 0 for oom
    std::size_t bytes = 0;      ///< the user's bytes; the segment's size; for oom, the request
    std::uintptr_t stream = 0;  ///< the platform's stream key (0: the default stream)
    std::int64_t unix_ns = 0;
    owner_id owner = nullptr;
    detail::call_stack stack;
};

/// A bounded record of events, oldest first; beyond `capacity` the oldest is forgotten, as PyTorch's
/// trace keeps its last max_entries. A capacity of 0 records nothing (one atomic load a call).
/// Thread safety: thread-safe (one mutex, held for O(1) per event; never while calling out).
/// Ownership: shared by the tracker and the journal that write it and the snapshot that reads it
/// (std::shared_ptr). Complexity: record O(1) amortized; events() O(n).
class allocation_history {
public:
    explicit allocation_history(std::size_t capacity) : capacity_(capacity) {}

    /// Appends `e` (forgetting the oldest beyond capacity). Never throws: without memory for it
    /// the event is counted as dropped.
    void record(const history_event& e) noexcept {
        if (capacity_.load(std::memory_order_relaxed) == 0) return;
        std::lock_guard lock(mutex_);
        const std::size_t capacity = capacity_.load(std::memory_order_relaxed);
        if (capacity == 0) return;
        try {
            while (events_.size() >= capacity) {
                events_.pop_front();
                ++forgotten_;
            }
            events_.push_back(e);
        } catch (...) {
            ++dropped_;
        }
    }

    /// Keeps the most recent `capacity` events from now on (0: records nothing, forgets all), as
    /// PyTorch's _record_memory_history(max_entries) does.
    void set_capacity(std::size_t capacity) {
        std::lock_guard lock(mutex_);
        capacity_.store(capacity, std::memory_order_relaxed);
        while (events_.size() > capacity) {
            events_.pop_front();
            ++forgotten_;
        }
    }

    /// The events kept, oldest first.
    [[nodiscard]] std::vector<history_event> events() const {
        std::lock_guard lock(mutex_);
        return {events_.begin(), events_.end()};
    }
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_.load(std::memory_order_relaxed); }
    /// Events forgotten to keep within capacity, and lost for want of memory.
    [[nodiscard]] std::uint64_t forgotten() const {
        std::lock_guard lock(mutex_);
        return forgotten_;
    }
    [[nodiscard]] std::uint64_t dropped() const {
        std::lock_guard lock(mutex_);
        return dropped_;
    }

    /// The Unix time now, in nanoseconds (what an event's unix_ns holds).
    [[nodiscard]] static std::int64_t unix_now_ns() noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    }

private:
    std::atomic<std::size_t> capacity_;
    mutable custody::detail::mutex mutex_;
    std::deque<history_event> events_; ///< events_.size() <= capacity_
    std::uint64_t forgotten_ = 0;
    std::uint64_t dropped_ = 0;
};

} // namespace custody::debug
