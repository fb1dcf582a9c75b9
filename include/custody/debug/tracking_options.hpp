/// @file
/// `tracking_options`: how a tracking resource checks, reports, remembers and samples, with the
/// live-bytes alarms it may carry (`watch`, and the `watch_event` a watch's callback receives).
/// Plain values; every field has a safe default.
#pragma once

#include <custody/core/rank.hpp>
#include <custody/debug/history.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/trend.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace custody::debug {

/// What a watch saw when it fired.
struct watch_event {
    int watch_id = 0;
    std::string subject; ///< "owner 'decoder'" or "device 1", for a message
    std::string owner;   ///< for an owner's watch: the owner's name ("<untagged>" for untagged); else ""
    int device = -1;     ///< for a device's watch: the device; else -1
    int rank = 0;
    std::size_t live_bytes = 0;
    bool growth = false; ///< true: fired by growth across samples
    bool trend = false;  ///< true: fired by the floor's trend (`forecast`); both false: by the threshold
    int consecutive_growths = 0;
    /// For a trend alarm: the rate (per step and per second), its confidence, the bytes leaked since
    /// the floor began to rise and the time left before the device's budget (see trend).
    debug::trend forecast;
};

/// A live-bytes alarm on one owner (exact name) or one device. It calls `callback`:
///  - threshold: when the live bytes rise above `threshold_bytes`, once; it re-arms at a sample
///    (every snapshot is one; tracking_options::trend may add more) that finds them at or below the
///    threshold without their having risen above it since the previous sample, so live bytes that
///    swing across it within a step (activations freed and taken again over a rising floor) raise
///    one alarm, not one per swing;
///  - growth: when the live bytes grew at each of `growth_snapshots` consecutive samples, once per
///    run of growth (it re-arms after a sample without growth);
///  - trend: when the floor of the live bytes rises significantly (trend.hpp), once per rise.
/// Python's custody.LeakWatch means the same (docs/debug.md).
struct watch {
    enum class subject { owner, device };
    subject what = subject::owner;
    std::string owner;                      ///< for subject::owner: the exact owner name ("" = untagged)
    int device = -1;                        ///< for subject::device
    std::size_t threshold_bytes = SIZE_MAX; ///< SIZE_MAX: no threshold
    int growth_snapshots = 0;               ///< 0: no growth alarm
    bool trend = false;                     ///< the floor's trend alarm
    /// Called outside the tracker's lock, on the thread that allocated or took the snapshot. Must
    /// not throw: an exception it throws is reported through custody::report_failure and dropped.
    std::function<void(const watch_event&)> callback;
};

/// The largest tracking_options::guard_bytes.
inline constexpr std::size_t max_guard_bytes = 256;

/// The tracking resource's options.
struct tracking_options {
    std::string name = "tracking"; ///< names the tracker in reports
    std::optional<rank_info> rank; ///< default: detect_rank()
    bool capture_stacks = false;   ///< record each allocation's call stack (backtrace)
    bool canaries = true;          ///< guard bytes around each block, checked at free
    std::size_t guard_bytes = 64;  ///< per side; 1..max_guard_bytes
    unsigned char canary_byte = 0xCB;
    bool poison = true;               ///< fill freed memory with poison_byte before giving it back
    unsigned char poison_byte = 0xFF; ///< 0xFF.. is a NaN in float, bfloat16 and half
    bool check_device = true;         ///< report frees on another device
    bool check_streams = true;        ///< report frees on an unordered other stream
    policy on_violation = policy::throw_error;
    policy on_leak = policy::log; ///< at destruction; throw_error logs (destructors do not throw)
    std::function<void(const violation&)> violation_callback; ///< policy::callback; must not throw
    std::function<void(const leak_report&)> leak_callback;    ///< policy::callback for leaks
    std::size_t remembered_frees = 4096; ///< freed blocks remembered to tell a double free
    std::size_t kept_violations = 256;   ///< the most recent violations kept for reports
    std::size_t kept_samples = 4096;     ///< the most recent timeline samples kept for reports
    bool release_leaks = true;           ///< at destruction, give leaked blocks back to the upstream
    bool precise_time = false;           ///< steady_clock per allocation instead of a coarse (ms) clock
    /// When set, every allocation, free and out-of-memory is also recorded in it (a
    /// segment_journal under the tracker's pool adds the segments): what a PyTorch memory snapshot
    /// plays back (debug/pytorch_snapshot.hpp). Shared: the caller keeps it to read it.
    std::shared_ptr<allocation_history> history;
    /// When and how owners' and devices' live bytes are sampled and their floor tested for a slow
    /// leak (trend.hpp): reports carry the trends, `watch::trend` raises their alarms.
    trend_options trend;
    /// The tracker's clock, in nanoseconds from any fixed point (non-decreasing): what it stamps
    /// allocations, samples and the rates per second with. Empty: the steady clock (see
    /// precise_time). Tests inject one, so that time passes without waiting. Called from every
    /// thread that allocates or frees, inside noexcept paths: it must not throw.
    std::function<std::int64_t()> clock;
    /// Name each block after its owner for CUDA's tools (NVTX): compute-sanitizer's leak report
    /// then says "called decode/kv_cache". Takes effect when the process names an NVTX tool as the
    /// tracker is built; otherwise a branch on a constant per allocation.
    bool annotate = true;
};

} // namespace custody::debug
