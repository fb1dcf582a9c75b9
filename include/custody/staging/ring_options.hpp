/// @file
/// How a staging ring is laid out (`ring_options`) and what it counts (`staging_statistics`): plain values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace custody::staging {

/// How a staging ring is laid out. Plain value, copied into the ring.
struct ring_options {
    /// Bytes of pinned memory, allocated once; rounded up to a multiple of the ring's alignment (256).
    std::size_t capacity = std::size_t{64} << 20;
    /// Regions that may be live at once (reserved, in flight or held). One event per region and
    /// device is created up front; a producer past this count waits as for bytes.
    std::size_t max_regions = 64;
    /// Chunk that copy_to_device and copy_from_device stream through the ring; 0: a quarter of
    /// the capacity, at most default_chunk_limit (so that at least four chunks are in flight: the
    /// host fills one while the previous ones are copied, and the first transfer starts early).
    std::size_t chunk_bytes = 0;
    /// The largest default chunk: large enough that a copy's fixed cost is amortized, small
    /// enough that the pipeline fills quickly.
    static constexpr std::size_t default_chunk_limit = std::size_t{2} << 20;
    /// Devices whose events are created when the ring is; empty: the calling thread's current
    /// device. A copy on a stream of another device creates that device's events on first use.
    std::vector<int> devices{};
    /// Announce the ring to CUDA's tools through NVTX: the pinned region as a heap, each region
    /// handed out (reserved, in flight or held) as a region of it until it is reclaimed or given
    /// back unused. Takes effect when the process names an NVTX tool as the ring is built; otherwise
    /// a branch on a constant per region.
    bool annotate = true;
};

/// A snapshot of a ring's counters; a plain value.
///
/// Invariants: bytes_in_flight <= bytes_in_use <= capacity; peak_bytes_in_use <= capacity.
/// Completion is noticed lazily: a finished copy counts as in flight until the ring next needs
/// room, or until poll() or synchronize().
struct staging_statistics {
    std::size_t capacity = 0;
    std::size_t bytes_in_use = 0;      ///< reserved, in flight and held bytes, with alignment padding
    std::size_t peak_bytes_in_use = 0;
    std::size_t bytes_in_flight = 0;   ///< bytes of enqueued copies not yet seen complete
    std::size_t live_regions = 0;
    std::uint64_t reservations = 0;    ///< regions handed out (uploads and downloads)
    std::uint64_t commits = 0;         ///< uploads enqueued
    std::uint64_t downloads = 0;       ///< downloads enqueued
    std::uint64_t cancellations = 0;   ///< reservations given back without a copy
    std::uint64_t bytes_uploaded = 0;
    std::uint64_t bytes_downloaded = 0;
    std::uint64_t waits = 0;           ///< reserve/stage calls that had to wait for room
    std::uint64_t timeouts = 0;        ///< of which ended in timeout_error
    std::uint64_t try_failures = 0;    ///< try_reserve/try_stage calls that found no room
    std::chrono::nanoseconds wait_time{0}; ///< total time spent waiting for room
};

} // namespace custody::staging
