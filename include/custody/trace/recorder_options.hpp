/// @file
/// How a trace recorder writes (`recorder_options`, `trace_file_name`) and what it counts
/// (`recorder_statistics`).
#pragma once

#include <custody/core/rank.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace custody::trace {

/// The file name of a rank's trace: "rank-<R>.ctrace", as the tracking resource's reports are
/// "rank-<R>.json" (debug::report_file_name).
[[nodiscard]] inline std::string trace_file_name(const rank_info& rank) {
    return "rank-" + std::to_string(rank.rank) + ".ctrace";
}

/// How a recorder writes. Every field has a default that suits a production run.
struct recorder_options {
    /// The file to write. Empty (the default): `directory` / trace_file_name(rank).
    std::string path;
    std::string directory = ".";
    /// The rank written into the trace and its name. Default: detect_rank() (the launcher's
    /// environment, rank 0 of 1 outside a job).
    std::optional<rank_info> rank;
    /// Written into the trace's metadata ("host" or "cuda"); empty: not written.
    std::string platform;
    /// Events each recording thread buffers: 4096 (256 KiB a thread). A thread that fills its
    /// buffer waits for the writer, so no event is ever dropped; the writer is woken each time a
    /// buffer is half full, so a busy thread waits only if the disk cannot keep up.
    std::size_t thread_buffer_events = 4096;
    /// How often the writer drains the buffers of quiet threads.
    std::chrono::milliseconds flush_interval{20};
    /// The most events the writer holds back waiting for an earlier one (a thread descheduled
    /// between taking its sequence number and publishing its event); beyond it, threads wait.
    std::size_t reorder_limit = std::size_t{1} << 16;
    /// Record the owner of each allocation (custody::debug::owner_scope), at the cost of a
    /// thread-local read per event.
    bool record_owner = false;
};

/// A recorder's counters. A plain value.
struct recorder_statistics {
    std::uint64_t events = 0;         ///< sequence numbers handed out: events recorded
    std::uint64_t events_written = 0; ///< events whose bytes reached the file
    std::uint64_t bytes_written = 0;
    std::uint64_t writes = 0;         ///< write calls on the file (batches, not events)
    std::uint64_t full_waits = 0;     ///< times a thread found its buffer full and waited for the writer
    std::uint64_t dropped = 0;        ///< events lost because a new thread's buffer could not be allocated
    std::size_t largest_reorder = 0;  ///< most events the writer held waiting for an earlier one
    std::size_t threads = 0;          ///< threads that recorded, ever
};

} // namespace custody::trace
