/// @file
/// The forecast of a slow leak: `trend_options` (when a tracker samples the live bytes of each
/// owner and device, and how it tests their floor for growth) and `trend` (what the test says of
/// one owner or device: rising or not, how fast, how sure, how much so far, how long until the
/// device's budget). Plain values; docs/debug.md ("Forecasting a slow leak") tells the method.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace custody::debug {

/// How a tracking resource samples live bytes and tests their floor for growth.
///
/// A sample is taken at every snapshot() and sample(), and also every `every_allocations`
/// allocations and every `every_ns` of the tracker's clock when set. At each sample, each owner's
/// and each device's floor is the least live bytes since the previous sample. The floors are kept
/// at `levels` time scales: windows of window_samples * 4^l samples (1, 4, 16, 64 and 256 by
/// default), each window's floor the minimum over it, so a sawtooth (a KV cache grown through a
/// request and freed at its end) leaves its lowest point and a leak lifts it. At each scale the
/// last `windows` floors are tested: Mann-Kendall's z says whether they rise, Theil-Sen's slope how
/// fast (both ignore outliers). The coarsest scale raises an alarm when z >= z_alarm; a finer one
/// only when its rise also exceeds `margin` times the largest rise that scale showed before (the
/// sawtooth's own climbs; it has to have seen one coarsest span first), so a fast leak is caught at
/// the scale of its speed and a slow one at the coarsest. Once raised, the alarm is not raised
/// again until the floor has stopped rising at every scale (z < z_settle).
struct trend_options {
    std::uint64_t every_allocations = 0; ///< also sample every N allocations (0: not)
    std::int64_t every_ns = 0;           ///< also sample once T ns of the tracker's clock have passed (0: not)
    std::uint32_t window_samples = 1;    ///< the finest window, in samples (>= 1)
    std::uint32_t levels = 5;            ///< time scales, 1..8
    std::uint32_t windows = 16;          ///< floors tested at each scale, 4..64
    double z_alarm = 4.0;                ///< Mann-Kendall z of a significant rise
    double z_settle = 1.0;               ///< below it at every scale, the floor has stopped rising
    double margin = 1.5;                 ///< a finer scale's rise must exceed margin x its largest before
    /// The device's budget in bytes, which the time left counts down to. 0: the device's capacity
    /// (the upstream's device_capacity(), else the platform's memory_info) less headroom_bytes.
    std::size_t budget_bytes = 0;
    /// Kept free of the capacity when the budget is derived. SIZE_MAX: as the pool's default, an
    /// eighth of the device, at most 1 GiB.
    std::size_t headroom_bytes = SIZE_MAX;
};

/// What the floor test says of one owner or one device at the latest sample.
///
/// Steps are samples: with a snapshot() or sample() per decode step, a rate per step is a rate per
/// decode step. Time left: (budget - the highest live bytes of the device over the last coarsest
/// span) / rate; memory the tracker does not see (other processes, a pool's cached reserve) is not
/// counted, so the budget is the bound. The per-second figures need the tracker's clock to have
/// moved between the samples used (empty otherwise).
struct trend {
    std::string owner;          ///< an owner's trend: its name; a device's: ""
    int device = -1;            ///< a device's trend: the device; an owner's: -1
    std::uint64_t samples = 0;  ///< samples taken of it so far
    std::size_t floor_bytes = 0; ///< its floor at the latest sample
    bool rising = false;        ///< an alarm was raised and the floor has not stopped rising since
    std::uint64_t alarms = 0;   ///< rises announced so far (each once)
    double bytes_per_step = 0;  ///< Theil-Sen slope of the floor (the rising part once rising)
    std::optional<double> bytes_per_second;
    double confidence = 0;      ///< the probability that the floor rises, Phi(z), at the scale estimated from
    std::uint64_t rise_began = 0;          ///< the sample the rise began at (once rising)
    std::int64_t rise_began_unix_ns = 0;
    std::size_t leaked_bytes = 0;          ///< bytes_per_step x samples since the rise began (once rising)
    std::optional<double> steps_left;      ///< before the device's budget at this rate (rising, budget known)
    std::optional<double> seconds_left;
};

} // namespace custody::debug
