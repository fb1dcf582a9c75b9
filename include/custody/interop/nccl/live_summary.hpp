/// @file
/// A live cross-rank summary over an NCCL communicator: every rank's live bytes per owner of a
/// tracking resource, gathered to every rank while the job runs (NCCL builds only).
#pragma once

#include <custody/core/error.hpp>
#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>
#include <custody/debug/report.hpp>
#include <custody/interop/nccl/detail/all_gather.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace custody::interop::nccl {

/// Gathers the live bytes per owner of `tracker` from every rank of `comm` and merges them into
/// one cross-rank view (owners x ranks, imbalance), on every rank.
///
/// A collective: every rank of `comm` must call it, in the same order with the other
/// collectives on `comm`. Each rank's summary (its report without the live groups, violations
/// and timeline) travels as JSON text in a slot of `slot_bytes` bytes (ncclAllGather of chars
/// through two scratch buffers allocated on the communicator's device, which is made current for
/// the call and then restored; `stream` must belong to that device). Blocks until `stream` is done
/// with the gather. Throws std::length_error when a rank's summary does not fit in a slot,
/// custody::cuda_error / nccl_error when CUDA or NCCL fail, debug::report_error when the ranks
/// disagree (world size). Thread safety: as NCCL's (one collective at a time per communicator).
template <class Tracker>
[[nodiscard]] debug::cross_rank_view gather_live_summary(Tracker& tracker, ncclComm_t comm, cudaStream_t stream,
                                                         std::size_t slot_bytes = std::size_t{1} << 16) {
    int world = 0;
    CUSTODY_NCCL_TRY(ncclCommCount(comm, &world));
    debug::rank_report mine = tracker.make_report();
    mine.live = debug::leak_report{mine.rank.rank, mine.live.total_bytes, mine.live.total_count, {}};
    mine.violations.clear();
    mine.timeline.clear();
    const std::string text = debug::to_json(mine);
    // A rank that cannot send its summary still takes part (an empty slot), so no rank hangs.
    const bool fits = text.size() + sizeof(std::uint64_t) <= slot_bytes;
    std::vector<char> slot(slot_bytes, 0);
    const std::uint64_t length = fits ? text.size() : 0;
    std::memcpy(slot.data(), &length, sizeof length);
    if (fits) std::memcpy(slot.data() + sizeof length, text.data(), text.size());

    const std::vector<char> all = detail::all_gather_bytes(slot, comm, stream);
    if (!fits) {
        throw std::length_error("custody: this rank's live summary (" + std::to_string(text.size()) +
                                " B) does not fit in a slot of " + std::to_string(slot_bytes) + " B");
    }

    std::vector<debug::rank_report> reports;
    std::vector<std::string> names;
    for (int r = 0; r < world; ++r) {
        const char* base = all.data() + static_cast<std::size_t>(r) * slot_bytes;
        std::uint64_t n = 0;
        std::memcpy(&n, base, sizeof n);
        names.push_back("rank " + std::to_string(r) + " (over NCCL)");
        if (n == 0 || n > slot_bytes - sizeof n) {
            throw debug::report_error(debug::report_error::reason::missing, names.back(),
                                      "the rank sent no summary (too large)");
        }
        reports.push_back(debug::parse_rank_report(std::string_view(base + sizeof n, n), names.back()));
    }
    return debug::merge_reports(reports, names);
}

} // namespace custody::interop::nccl
