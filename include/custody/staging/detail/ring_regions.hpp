/// @file
/// The staging ring's regions behind one lock: where the next region goes, which come back (in
/// placement order, as their copies complete), the waits for room, the events that mark each
/// copy, and the counters. staging/staging_ring.hpp turns regions into typed reservations, copies
/// and tickets over it.
#pragma once

#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/staging/detail/event_table.hpp>
#include <custody/staging/detail/ring_index.hpp>
#include <custody/staging/detail/ring_wait.hpp>
#include <custody/staging/errors.hpp>
#include <custody/staging/ring_options.hpp>

#include <gsl/assert>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace custody::staging::detail {

/// The regions of one ring of `capacity` bytes starting at `base` (attached once the ring has
/// taken its memory), on `Platform`.
///
/// Thread safety: every member may be called from any thread; one mutex guards the index, the
/// counters and the count of waiters, and no event is waited on while it is held (a region being
/// waited on is pinned instead, so it is neither reclaimed nor reused meanwhile).
/// Ownership: owns the events; the memory is the ring's.
/// Invariants (mutex_ held): waiting_ = threads inside wait_for_room; a region is reclaimed only
/// when it is the oldest and its copy completed or it was given back unused (ring_index);
/// stats_.bytes_in_flight = bytes of the regions in flight or held.
template <class Platform>
class ring_regions {
public:
    using event_type = typename Platform::event;

    ring_regions(std::size_t capacity, std::size_t region_count, bool annotate)
        : index_(capacity, region_count), events_(index_.slot_count()), annotations_(annotate) {}

    ring_regions(const ring_regions&) = delete;
    ring_regions& operator=(const ring_regions&) = delete;

    [[nodiscard]] std::size_t capacity() const noexcept { return index_.capacity(); }

    /// Takes the ring's memory: told to CUDA's tools as one heap.
    void attach(std::byte* base) {
        base_ = base;
        annotations_.heap_taken(base_, capacity(), "custody staging_ring");
    }

    /// Waits for every copy in flight and reclaims every region (at the ring's destruction: no
    /// reservation or ticket may be alive then, checked), then withdraws the heap.
    void drain() noexcept {
        std::unique_lock lock(mutex_);
        bool outstanding = false;
        index_.for_each_live([&](std::size_t, region& r) {
            outstanding = outstanding || r.state == region_state::reserved || r.state == region_state::held;
        });
        Expects(!outstanding); // a reservation or ticket outlives its ring
        while (!index_.empty()) {
            region& r = index_.oldest();
            if (r.state == region_state::in_flight) {
                run_exit_tolerant<Platform>("staging ring: waiting for a copy at destruction",
                                            [&] { event(r.device, index_.oldest_slot()).synchronize(); });
            }
            reclaim_oldest();
        }
        lock.unlock();
        annotations_.heap_returned(base_);
    }

    /// The event of region slot `slot` on `device`, its device's row created on first use.
    /// Throws std::invalid_argument for a device that does not exist.
    event_type& event(int device, std::size_t slot) { return events_.at(device, slot); }
    /// Creates `device`'s events (validating it) before anything changes.
    void prepare(int device) { static_cast<void>(events_.row(device)); }

    /// Places `bytes`, reclaiming and waiting as `mode` says. Returns nothing only for
    /// wait_mode::never; throws timeout_error for wait_mode::until.
    std::optional<placement> acquire(std::size_t bytes, std::size_t align, wait_mode mode, time_point deadline,
                                     std::chrono::nanoseconds limit) {
        std::unique_lock lock(mutex_);
        auto p = index_.place(bytes, align);
        if (!p) {
            reclaim_completed();
            p = index_.place(bytes, align);
        }
        if (!p) {
            if (mode == wait_mode::never) {
                ++stats_.try_failures;
                return std::nullopt;
            }
            p = wait_for_room(lock, bytes, align, mode, deadline, limit);
        }
        ++stats_.reservations;
        stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, index_.bytes_in_use());
        annotations_.handed_out(base_ + p->offset, bytes);
        return p;
    }

    /// A reserved region's copy to a device was enqueued on `device` and its event recorded.
    void committed(std::size_t slot, int device) {
        std::lock_guard lock(mutex_);
        region& r = index_.at(slot);
        r.state = region_state::in_flight;
        r.device = device;
        stats_.bytes_in_flight += r.bytes;
        stats_.bytes_uploaded += r.bytes;
        ++stats_.commits;
        if (waiting_ != 0) cv_.notify_all();
    }

    /// A copy of `bytes` from `device` into a reserved region was enqueued and its event recorded:
    /// the region is held by a ticket.
    void staged(std::size_t slot, int device, std::size_t bytes) {
        std::lock_guard lock(mutex_);
        region& r = index_.at(slot);
        r.state = region_state::held;
        r.device = device;
        stats_.bytes_in_flight += bytes;
        stats_.bytes_downloaded += bytes;
        ++stats_.downloads;
    }

    /// Gives a reserved region back unused; `by_caller`: counted as a cancellation.
    void cancel(std::size_t slot, bool by_caller = true) noexcept {
        std::lock_guard lock(mutex_);
        annotations_.coming_back(data_of(index_.at(slot)));
        index_.at(slot).state = region_state::cancelled;
        if (by_caller) ++stats_.cancellations;
        if (waiting_ != 0) cv_.notify_all();
    }

    /// The event of a held region: recorded once and never again while held, so it is safe to use
    /// without the lock.
    event_type& held_event(std::size_t slot) {
        int device = 0;
        {
            std::lock_guard lock(mutex_);
            device = index_.at(slot).device;
        }
        return event(device, slot);
    }
    /// A ticket let go of its region: reclaimed once its copy is done.
    void release(std::size_t slot) noexcept {
        std::lock_guard lock(mutex_);
        index_.at(slot).state = region_state::in_flight;
        if (waiting_ != 0) cv_.notify_all();
    }

    /// Reclaims every region whose copy has completed, without waiting; returns how many.
    std::size_t poll() {
        std::lock_guard lock(mutex_);
        const std::size_t n = reclaim_completed();
        if (n != 0 && waiting_ != 0) cv_.notify_all();
        return n;
    }

    /// Waits for every copy enqueued so far (uploads and downloads) and reclaims what it can.
    void synchronize() {
        std::unique_lock lock(mutex_);
        std::vector<std::pair<std::size_t, int>> pinned;
        index_.for_each_live([&](std::size_t slot, region& r) {
            if (r.state == region_state::in_flight || r.state == region_state::held) {
                ++r.pins;
                pinned.emplace_back(slot, r.device);
            }
        });
        lock.unlock();
        const auto unpin = [&] {
            lock.lock();
            for (const auto& [slot, device] : pinned) --index_.at(slot).pins;
            reclaim_completed();
            if (waiting_ != 0) cv_.notify_all();
        };
        try {
            for (const auto& [slot, device] : pinned) event(device, slot).synchronize();
        } catch (...) {
            unpin();
            throw;
        }
        unpin();
    }

    /// A snapshot of the counters (see staging_statistics).
    [[nodiscard]] staging_statistics statistics() const {
        std::lock_guard lock(mutex_);
        staging_statistics s = stats_;
        s.capacity = index_.capacity();
        s.bytes_in_use = index_.bytes_in_use();
        s.live_regions = index_.live_regions();
        return s;
    }

private:
    /// Where region `r`'s bytes start.
    [[nodiscard]] std::byte* data_of(const region& r) const noexcept {
        return base_ + static_cast<std::size_t>(r.data_begin % index_.capacity());
    }
    /// Gives the oldest region's bytes back (mutex_ held), withdrawn from CUDA's tools unless it
    /// was given back unused (withdrawn then).
    void reclaim_oldest() noexcept {
        if (index_.oldest().state != region_state::cancelled) annotations_.coming_back(data_of(index_.oldest()));
        index_.reclaim_oldest();
    }

    /// Reclaims, oldest first, the regions that are given back or whose copy has completed
    /// (mutex_ held). Returns how many were reclaimed.
    std::size_t reclaim_completed() {
        std::size_t n = 0;
        while (!index_.empty()) {
            region& r = index_.oldest();
            if (r.state == region_state::in_flight) {
                if (!event(r.device, index_.oldest_slot()).ready()) break;
                stats_.bytes_in_flight -= r.bytes;
            } else if (r.state != region_state::cancelled) {
                break;
            }
            reclaim_oldest();
            ++n;
        }
        return n;
    }

    /// The slow path of acquire: waits on the oldest copy's event (pinned, outside the lock) or,
    /// when the oldest region is not in flight, for a commit or release to be signalled.
    placement wait_for_room(std::unique_lock<std::mutex>& lock, std::size_t bytes, std::size_t align, wait_mode mode,
                            time_point deadline, std::chrono::nanoseconds limit) {
        const auto start = std::chrono::steady_clock::now();
        ++stats_.waits;
        ++waiting_;
        const auto done_waiting = [&] {
            --waiting_;
            stats_.wait_time += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
        };
        try {
            for (;;) {
                if (!index_.empty() && index_.oldest().state == region_state::in_flight) {
                    wait_for_oldest(lock, mode, deadline);
                } else if (mode == wait_mode::until) {
                    cv_.wait_until(lock, deadline);
                    reclaim_completed();
                } else {
                    cv_.wait(lock);
                    reclaim_completed();
                }
                if (auto p = index_.place(bytes, align)) {
                    done_waiting();
                    return *p;
                }
                if (mode == wait_mode::until && std::chrono::steady_clock::now() >= deadline) {
                    ++stats_.timeouts;
                    throw timeout_error(bytes, limit);
                }
            }
        } catch (...) {
            done_waiting();
            throw;
        }
    }

    /// Waits (the lock released, the region pinned) for the oldest region's copy, then reclaims.
    void wait_for_oldest(std::unique_lock<std::mutex>& lock, wait_mode mode, time_point deadline) {
        const std::size_t slot = index_.oldest_slot();
        region& r = index_.oldest();
        ++r.pins;
        const int device = r.device;
        lock.unlock();
        try {
            static_cast<void>(wait_event(event(device, slot), mode, deadline));
        } catch (...) {
            lock.lock();
            --index_.at(slot).pins;
            throw;
        }
        lock.lock();
        --index_.at(slot).pins;
        reclaim_completed();
        // Others may wait for this slot to be unpinned, or for the room just reclaimed.
        if (waiting_ > 1) cv_.notify_all();
    }

    mutable std::mutex mutex_;   ///< guards index_, stats_, waiting_
    std::condition_variable cv_; ///< signalled when a region is committed, given back or released
    ring_index index_;
    event_table<Platform> events_; ///< one event per region slot and device
    std::byte* base_ = nullptr;    ///< the ring's memory: capacity() bytes
    std::size_t waiting_ = 0;      ///< threads inside wait_for_room
    staging_statistics stats_;
    custody::detail::memory_annotations annotations_; ///< the ring and its regions, told to CUDA's tools
};

} // namespace custody::staging::detail
