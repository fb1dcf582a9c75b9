/// @file
/// `tracker_clock`: the tracking resource's time, in nanoseconds since the tracker was made, and
/// the Unix time it was made (to place its samples in a cross-rank trace).
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>
#include <functional>
#include <utility>

namespace custody::debug::detail {

/// Nanoseconds since construction. Coarse unless `precise`: Linux's coarse monotonic clock (a few
/// ms resolution, ~5 ns a read instead of up to ~100 ns in some VMs); the tracker's sequence
/// numbers order events exactly, times only place them. An injected clock (`custom`, a test's)
/// replaces both.
/// Thread safety: const after construction (an injected clock must be callable from any thread).
/// Invariant: now_ns() >= 0, non-decreasing (for an injected clock: while it is).
class tracker_clock {
public:
    explicit tracker_clock(bool precise, std::function<std::int64_t()> custom = {})
        : precise_(precise), custom_(std::move(custom)), custom_start_(custom_ ? custom_() : 0),
          start_(std::chrono::steady_clock::now()), start_coarse_ns_(coarse_now()), start_unix_ns_(unix_now_ns()) {}

    [[nodiscard]] std::int64_t now_ns() const noexcept {
        if (custom_) return custom_() - custom_start_;
#ifdef CLOCK_MONOTONIC_COARSE
        if (!precise_) return coarse_now() - start_coarse_ns_;
#endif
        return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
    }

    /// The Unix time of construction, in nanoseconds.
    [[nodiscard]] std::int64_t start_unix_ns() const noexcept { return start_unix_ns_; }

    [[nodiscard]] static std::int64_t unix_now_ns() noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    }

private:
    static std::int64_t coarse_now() noexcept {
#ifdef CLOCK_MONOTONIC_COARSE
        timespec ts{};
        ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
#else
        return 0;
#endif
    }

    bool precise_;
    std::function<std::int64_t()> custom_;
    std::int64_t custom_start_;
    std::chrono::steady_clock::time_point start_;
    std::int64_t start_coarse_ns_;
    std::int64_t start_unix_ns_;
};

} // namespace custody::debug::detail
