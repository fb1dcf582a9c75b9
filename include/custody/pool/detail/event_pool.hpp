/// @file
/// `event_pool`: events created ahead of need on one device, so that no event is ever created on
/// an allocation's hot path.
#pragma once

#include <custody/core/detail/mutex.hpp>

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

namespace custody::pool::detail {

/// A stock of `Platform::event`s created on one device.
///
/// The pool takes one event per stream it meets (at that stream's first allocation or
/// deallocation, never again for that stream) and gives it back when the pool ends. Events are
/// created in batches of `batch` when the stock runs out, so a program that uses a handful of
/// streams creates all its events up front.
/// Thread safety: thread-safe (one mutex; used only when a stream is first seen).
/// Ownership: owns the events in stock.
template <class Platform>
class event_pool {
public:
    using event = typename Platform::event;

    /// Creates `initial` events on `device` now (may throw what the platform's event constructor
    /// throws; nothing is kept then).
    event_pool(int device, std::size_t initial, std::size_t batch) : device_(device), batch_(batch == 0 ? 1 : batch) {
        fill(initial);
    }
    event_pool(const event_pool&) = delete;
    event_pool& operator=(const event_pool&) = delete;

    /// Takes an event from the stock, creating a batch first when it is empty.
    [[nodiscard]] event acquire() {
        std::lock_guard lock(mutex_);
        if (stock_.empty()) fill(batch_);
        event e = std::move(stock_.back());
        stock_.pop_back();
        return e;
    }

    /// Puts `e` back into the stock. Never throws: if the stock cannot grow, `e` is destroyed.
    void release(event&& e) noexcept {
        std::lock_guard lock(mutex_);
        try {
            stock_.push_back(std::move(e));
        } catch (...) {
        }
    }

    [[nodiscard]] std::size_t available() const {
        std::lock_guard lock(mutex_);
        return stock_.size();
    }
    [[nodiscard]] int device() const noexcept { return device_; }

private:
    void fill(std::size_t n) {
        std::vector<event> fresh;
        fresh.reserve(n);
        for (std::size_t i = 0; i < n; ++i) fresh.emplace_back(device_);
        stock_.reserve(stock_.size() + n);
        for (auto& e : fresh) stock_.push_back(std::move(e));
    }

    int device_;
    std::size_t batch_;
    mutable custody::detail::mutex mutex_;
    std::vector<event> stock_; // events ready to hand out, all created on device_
};

} // namespace custody::pool::detail
