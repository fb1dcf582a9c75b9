/// @file
/// The rank of a process from an NCCL communicator: rank and world size from NCCL, the local rank
/// from the hosts of the communicator's ranks (NCCL builds only).
#pragma once

#include <custody/core/error.hpp>
#include <custody/core/rank.hpp>
#include <custody/interop/bind_device.hpp>
#include <custody/interop/nccl/detail/all_gather.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <source_location>
#include <string>
#include <vector>

namespace custody::interop::nccl {

/// This process's rank_info over `comm`: rank and world size from ncclCommUserRank and
/// ncclCommCount; local rank and local world size from the host names of all ranks, all-gathered
/// over `comm` (place_on_host). The device ordinal is no local rank: under CUDA_VISIBLE_DEVICES
/// every process may see its GPU as device 0. `host` names this process's host (empty:
/// gethostname()); names longer than device_claim::text_size - 1 bytes are compared truncated.
///
/// Collective: every rank of `comm` must call it, in the same order with the other collectives on
/// `comm`; `stream` must belong to the communicator's device. Blocks until the gather is done.
/// Throws custody::nccl_error / cuda_error when NCCL or CUDA fail, rank_error when the result is
/// inconsistent. Thread safety: as NCCL's (one collective at a time per communicator).
/// Complexity: one all-gather of 128 bytes per rank, O(world size) on the host.
[[nodiscard]] inline rank_info rank_from_communicator(ncclComm_t comm, cudaStream_t stream, const std::string& host = {}) {
    int rank = 0;
    int size = 0;
    CUSTODY_NCCL_TRY(ncclCommUserRank(comm, &rank));
    CUSTODY_NCCL_TRY(ncclCommCount(comm, &size));
    constexpr std::size_t slot_bytes = device_claim::text_size;
    std::vector<char> slot(slot_bytes, '\0');
    const std::string mine = host.empty() ? interop::detail::this_host_name() : host;
    std::memcpy(slot.data(), mine.data(), std::min(mine.size(), slot_bytes - 1));
    const std::vector<char> all = detail::all_gather_bytes(slot, comm, stream);
    std::vector<std::string> hosts;
    hosts.reserve(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
        const char* text = all.data() + static_cast<std::size_t>(r) * slot_bytes;
        hosts.emplace_back(text, ::strnlen(text, slot_bytes));
    }
    const host_placement placement = place_on_host(hosts, rank);
    return validate_rank(rank_info{rank, placement.local_rank, size, placement.local_world_size, "nccl"});
}

} // namespace custody::interop::nccl
