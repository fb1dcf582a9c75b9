/// @file
/// `tick_clock`: the recorder's timestamps. Reading the CPU's time-stamp counter costs a few
/// nanoseconds where the steady clock can cost fifty; the writer thread converts ticks to
/// nanoseconds against the steady clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

namespace custody::trace::detail {

/// The recording threads' clock: the time-stamp counter on x86-64 (invariant and synchronized
/// across cores on the CPUs the tracked programs run on; Linux uses it as its own clocksource),
/// the virtual counter on AArch64, the steady clock elsewhere.
[[nodiscard]] inline std::uint64_t ticks() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_ia32_rdtsc();
#elif defined(__aarch64__)
    std::uint64_t v = 0;
    asm volatile("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

[[nodiscard]] inline std::int64_t steady_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/// Converts ticks to nanoseconds since its construction: calibrated by pairs (ticks, steady ns)
/// taken at construction and at each calibrate(), so the rate is measured over the whole
/// recording so far (after a second, to better than a part in 10^5).
///
/// Invariants: last_ticks_ >= origin_ticks_; ns_per_tick_ = (last_ns_ - origin_ns_) /
/// (last_ticks_ - origin_ticks_) once at least min_window has passed.
/// Thread safety: none (the writer thread's).
class tick_clock {
public:
    /// The shortest calibration window: calibrate() waits until this much has passed since
    /// construction, so the first events are not converted with a rate measured over microseconds.
    static constexpr std::int64_t min_window_ns = 2'000'000;

    tick_clock() noexcept : origin_ticks_(ticks()), origin_ns_(steady_ns()) {}

    /// Takes a new calibration pair (waits out the minimum window the first time).
    void calibrate() noexcept {
        std::int64_t now = steady_ns();
        if (now - origin_ns_ < min_window_ns) {
            std::this_thread::sleep_for(std::chrono::nanoseconds(min_window_ns - (now - origin_ns_)));
        }
        const std::uint64_t t = ticks();
        now = steady_ns();
        if (t > origin_ticks_) ns_per_tick_ = static_cast<double>(now - origin_ns_) / static_cast<double>(t - origin_ticks_);
    }

    /// Nanoseconds since construction at `t` (ticks taken before construction give 0).
    [[nodiscard]] std::int64_t to_ns(std::uint64_t t) const noexcept {
        if (t <= origin_ticks_) return 0;
        return static_cast<std::int64_t>(static_cast<double>(t - origin_ticks_) * ns_per_tick_);
    }

private:
    std::uint64_t origin_ticks_;
    std::int64_t origin_ns_;
    double ns_per_tick_ = 1.0;
};

} // namespace custody::trace::detail
