/// @file
/// The rank of a process from an NCCL communicator (NCCL builds only).
#pragma once

#include <custody/core/error.hpp>
#include <custody/core/rank.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <source_location>

namespace custody::debug {

/// The rank and world size of `comm` (ncclCommUserRank, ncclCommCount). The local rank is the
/// communicator's CUDA device when `device_is_local_rank` (one rank per GPU, the common layout),
/// else the detected environment's local rank. Throws custody::nccl_error when NCCL fails.
/// Thread safety: as the NCCL queries (safe for a communicator not being destroyed).
[[nodiscard]] inline rank_info rank_from_communicator(ncclComm_t comm, bool device_is_local_rank = true) {
    int rank = 0;
    int size = 0;
    int device = 0;
    CUSTODY_NCCL_TRY(ncclCommUserRank(comm, &rank));
    CUSTODY_NCCL_TRY(ncclCommCount(comm, &size));
    CUSTODY_NCCL_TRY(ncclCommCuDevice(comm, &device));
    rank_info info;
    info.rank = rank;
    info.world_size = size;
    info.local_rank = device_is_local_rank ? device : detect_rank().local_rank;
    info.source = "nccl";
    return info;
}

} // namespace custody::debug
