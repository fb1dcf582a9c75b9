/// @file
/// The events of a staging ring: one per region slot and device, each device's row built once
/// (up front, or at its first copy) and read without a lock after.
#pragma once

#include <custody/core/detail/mutex.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace custody::staging::detail {

/// `slot_count` events for each device of `Platform`, rows built on demand.
/// Thread safety: row() and at() may be called from any thread; building a row is serialized,
/// reading a built row takes no lock. Ownership: owns the events. Complexity: O(1) once a row is
/// built; building one creates `slot_count` events.
template <class Platform>
class event_table {
public:
    using event_type = typename Platform::event;

    explicit event_table(std::size_t slot_count)
        : slot_count_(slot_count), device_count_(Platform::device_count()),
          rows_(std::make_unique<event_row[]>(static_cast<std::size_t>(std::max(device_count_, 1)))) {}

    /// The events of `device`, created on first use. Throws std::invalid_argument for a device
    /// that does not exist.
    std::vector<event_type>& row(int device) {
        if (device < 0 || device >= device_count_) {
            throw std::invalid_argument("custody: staging ring: device " + std::to_string(device) + " does not exist");
        }
        event_row& r = rows_[static_cast<std::size_t>(device)];
        if (!r.built.load(std::memory_order_acquire)) {
            std::lock_guard lock(mutex_);
            if (!r.built.load(std::memory_order_relaxed)) {
                std::vector<event_type> events;
                events.reserve(slot_count_);
                for (std::size_t i = 0; i < slot_count_; ++i) events.emplace_back(device);
                r.events = std::move(events);
                r.built.store(true, std::memory_order_release);
            }
        }
        return r.events;
    }

    /// The event of `slot` on `device` (see row()).
    event_type& at(int device, std::size_t slot) { return row(device)[slot]; }

private:
    /// The events of one device, one per region slot. Built once; read without the lock after.
    struct event_row {
        std::atomic<bool> built{false};
        std::vector<event_type> events;
    };

    std::size_t slot_count_;
    int device_count_;
    std::unique_ptr<event_row[]> rows_; ///< rows_[d] for each device d < device_count_
    custody::detail::mutex mutex_; ///< serializes building a row
};

} // namespace custody::staging::detail
