/// @file
/// How a staging ring waits for room: the wait modes, timeouts turned into deadlines, and waiting
/// on one event with a growing back-off.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>
#include <utility>

namespace custody::staging::detail {

/// How long a request for room may wait: not at all (try_*), as long as it takes, or until a deadline.
enum class wait_mode { never, block, until };
using time_point = std::chrono::steady_clock::time_point;

/// `timeout` in nanoseconds, saturating (std::chrono::duration::max() and the like wait forever).
/// Throws std::invalid_argument for a NaN timeout, which is neither long nor short.
template <class Rep, class Period>
std::chrono::nanoseconds clamp_timeout(std::chrono::duration<Rep, Period> timeout) {
    using limit_type = std::chrono::duration<long double, std::nano>;
    const limit_type wanted = timeout;
    if (std::isnan(wanted.count())) throw std::invalid_argument("custody: staging ring: the timeout is NaN");
    if (wanted >= limit_type(std::chrono::nanoseconds::max())) return std::chrono::nanoseconds::max();
    if (wanted <= limit_type(0)) return std::chrono::nanoseconds(0);
    return std::chrono::duration_cast<std::chrono::nanoseconds>(timeout);
}

/// A deadline `limit` from now; timeouts too long to represent wait without one.
inline std::pair<wait_mode, time_point> deadline_after(std::chrono::nanoseconds limit) {
    const auto now = std::chrono::steady_clock::now();
    if (limit > time_point::max() - now) return {wait_mode::block, time_point{}};
    return {wait_mode::until, now + limit};
}

/// Waits for the event `e` (anything with synchronize() and ready()): blocking, or polling with a
/// growing back-off until `deadline`. Returns whether it completed.
template <class Event>
bool wait_event(const Event& e, wait_mode mode, time_point deadline) {
    if (mode != wait_mode::until) {
        e.synchronize();
        return true;
    }
    auto pause = std::chrono::microseconds(1);
    while (!e.ready()) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) return false;
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
        pause = std::min(pause * 2, std::chrono::microseconds(200));
    }
    return true;
}

} // namespace custody::staging::detail
