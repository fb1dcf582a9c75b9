/// @file
/// `event_ring`: the buffer between one recording thread and the recorder's writer thread, a
/// fixed-size single-producer single-consumer ring of raw events.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace custody::trace::detail {

/// An event as a recording thread leaves it for the writer: the fields the thread knows, in the
/// units it can read cheaply (clock ticks, an owner pointer), converted when written.
struct raw_event {
    std::uint64_t sequence;
    std::uint64_t ticks;
    std::uint64_t stream;
    std::uint64_t bytes;
    std::uint64_t address;
    const void* owner; ///< an interned owner name (custody::debug::owner_id), or nullptr
    std::int32_t device;
    std::uint32_t thread; ///< the ring's thread index
    std::uint8_t kind;
    std::uint8_t alignment_log2;
};

/// A single-producer single-consumer ring of raw events: the recording thread claims a slot, fills
/// it and publishes it with one release store; the writer thread drains published slots and
/// releases them with one release store. No lock, no read-modify-write on either side.
///
/// Invariants: tail_ <= head_ <= tail_ + capacity; slots [tail_, head_) (mod capacity) hold
/// published events in the producer's order, which is increasing sequence order; head_ is written
/// only by the producer, tail_ only by the consumer; cached_tail_ <= tail_.
/// Thread safety: one producer thread and one consumer thread at a time. Ownership: owns its slots.
/// Memory: capacity * sizeof(raw_event), fixed at construction.
class event_ring {
public:
    /// `capacity` is rounded up to a power of two, at least 64.
    event_ring(std::size_t capacity, std::uint32_t thread_index, std::uint64_t os_id, std::string name)
        : capacity_(std::bit_ceil(capacity < 64 ? std::size_t{64} : capacity)), mask_(capacity_ - 1),
          slots_(std::make_unique<raw_event[]>(capacity_)), thread_index_(thread_index), os_id_(os_id),
          name_(std::move(name)) {}

    event_ring(const event_ring&) = delete;
    event_ring& operator=(const event_ring&) = delete;

    // ---- producer side ----------------------------------------------------------------------

    /// The next free slot, or nullptr when the ring is full. Fill it, then publish().
    [[nodiscard]] raw_event* claim() noexcept {
        const std::uint64_t h = head_.load(std::memory_order_relaxed);
        if (h - cached_tail_ >= capacity_) [[unlikely]] {
            cached_tail_ = tail_.load(std::memory_order_acquire);
            if (h - cached_tail_ >= capacity_) return nullptr;
        }
        return &slots_[h & mask_];
    }

    /// Makes the claimed slot visible to the consumer. True every capacity/2 events: the moment to
    /// wake the consumer, so that a busy thread's ring is drained before it fills.
    bool publish() noexcept {
        const std::uint64_t h = head_.load(std::memory_order_relaxed) + 1;
        head_.store(h, std::memory_order_release);
        return (h & (mask_ >> 1)) == 0;
    }

    /// The recording thread has exited: once drained, the ring can go.
    void abandon() noexcept { abandoned_.store(true, std::memory_order_release); }

    // ---- consumer side ----------------------------------------------------------------------

    /// Hands published events to `take` in order while their sequence is below `limit`; returns how
    /// many it handed over and releases their slots.
    template <class Take>
    std::size_t drain(std::uint64_t limit, Take&& take) {
        const std::uint64_t h = head_.load(std::memory_order_acquire);
        std::uint64_t t = tail_.load(std::memory_order_relaxed);
        const std::uint64_t first = t;
        for (; t != h; ++t) {
            const raw_event& e = slots_[t & mask_];
            if (e.sequence >= limit) break;
            take(e);
        }
        tail_.store(t, std::memory_order_release);
        return static_cast<std::size_t>(t - first);
    }

    /// Nothing published is left to drain.
    [[nodiscard]] bool drained() const noexcept {
        return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_relaxed);
    }
    [[nodiscard]] bool abandoned() const noexcept { return abandoned_.load(std::memory_order_acquire); }

    [[nodiscard]] std::uint32_t thread_index() const noexcept { return thread_index_; }
    [[nodiscard]] std::uint64_t os_id() const noexcept { return os_id_; }
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

private:
    const std::size_t capacity_;
    const std::size_t mask_;
    std::unique_ptr<raw_event[]> slots_;
    const std::uint32_t thread_index_;
    const std::uint64_t os_id_;
    const std::string name_;
    alignas(64) std::atomic<std::uint64_t> head_{0}; // producer writes
    std::uint64_t cached_tail_ = 0;                   // producer's last view of tail_
    alignas(64) std::atomic<std::uint64_t> tail_{0}; // consumer writes
    std::atomic<bool> abandoned_{false};
};

} // namespace custody::trace::detail
