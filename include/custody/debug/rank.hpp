/// @file
/// `rank_info` and `detect_rank()`: which rank of a multi-process job this process is, read from
/// the launcher's environment (torchrun, Open MPI, Slurm) or given by the caller. No CUDA header.
#pragma once

#include <charconv>
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace custody::debug {

/// Where a process sits in a multi-process job.
///
/// Invariants for a detected rank: 0 <= rank < world_size, 0 <= local_rank <= rank.
/// A process that is not part of a job is rank 0 of 1 (`source == "default"`).
struct rank_info {
    int rank = 0;
    int local_rank = 0;
    int world_size = 1;
    std::string source = "default"; ///< "env:torchrun", "env:openmpi", "env:slurm", "caller", "nccl", "default"

    friend bool operator==(const rank_info&, const rank_info&) = default;
};

namespace detail {

/// Parses a non-negative decimal integer that fills the whole string; nullopt otherwise.
[[nodiscard]] inline std::optional<int> parse_non_negative(std::string_view text) noexcept {
    int value = 0;
    const char* first = text.data();
    const char* last = text.data() + text.size();
    const auto [end, ec] = std::from_chars(first, last, value);
    if (text.empty() || ec != std::errc{} || end != last || value < 0) return std::nullopt;
    return value;
}

} // namespace detail

/// Reads the rank from environment variables looked up through `getenv` (which returns nullptr for
/// an unset variable), trying in order:
///   torchrun/DeepSpeed:  RANK, LOCAL_RANK, WORLD_SIZE
///   Open MPI:            OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_SIZE
///   Slurm:               SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS
/// A launcher counts when its rank variable parses; a missing local rank defaults to the rank, a
/// missing world size to rank + 1. A set of variables that contradicts itself (rank >= world
/// size, local rank > rank) is skipped, and the next launcher is tried. Nothing found: rank 0 of 1.
/// Thread safety: as `getenv`. Complexity: constant.
[[nodiscard]] inline rank_info detect_rank(const std::function<const char*(const char*)>& getenv) {
    struct launcher {
        const char* rank;
        const char* local_rank;
        const char* world_size;
        const char* source;
    };
    static constexpr launcher launchers[] = {
        {"RANK", "LOCAL_RANK", "WORLD_SIZE", "env:torchrun"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "env:openmpi"},
        {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "env:slurm"},
    };
    const auto read = [&](const char* name) -> std::optional<int> {
        const char* value = getenv(name);
        if (value == nullptr) return std::nullopt;
        return detail::parse_non_negative(value);
    };
    for (const launcher& l : launchers) {
        const std::optional<int> rank = read(l.rank);
        if (!rank) continue;
        const int local = read(l.local_rank).value_or(*rank);
        const int world = read(l.world_size).value_or(*rank + 1);
        if (*rank >= world || local > *rank) continue;
        return rank_info{*rank, local, world, l.source};
    }
    return rank_info{};
}

/// Reads the rank from this process's environment (see the overload above).
[[nodiscard]] inline rank_info detect_rank() {
    return detect_rank([](const char* name) -> const char* { return std::getenv(name); });
}

/// A rank given by the caller, checked: throws std::invalid_argument unless
/// 0 <= local_rank <= rank < world_size.
[[nodiscard]] inline rank_info make_rank(int rank, int local_rank, int world_size) {
    if (rank < 0 || world_size < 1 || rank >= world_size || local_rank < 0 || local_rank > rank) {
        throw std::invalid_argument("custody: rank " + std::to_string(rank) + " (local " +
                                    std::to_string(local_rank) + ") of " + std::to_string(world_size) +
                                    " is not a valid rank");
    }
    return rank_info{rank, local_rank, world_size, "caller"};
}

} // namespace custody::debug
