/// @file
/// `rank_info`: where this process stands among the ranks of a job (global rank, local rank, world
/// size), read from the launcher's environment: torchrun and most launchers (RANK, LOCAL_RANK,
/// WORLD_SIZE), Open MPI (OMPI_COMM_WORLD_*) and Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS),
/// or given by the caller. One type for every layer: the tracking resource's reports and the
/// device binding of interop/ read the same rank. (From an NCCL communicator:
/// interop/nccl/rank.hpp.) No CUDA: compiles with a plain C++20 compiler.
#pragma once

#include <custody/core/error.hpp>

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace custody {

/// Rank and device-binding failures: an environment that names no rank or an inconsistent one, a
/// local rank without a device, two local ranks on one device.
class rank_error : public error {
public:
    using error::error;
};

/// This process's place in the job. Invariants: 0 <= rank < world_size; 0 <= local_rank;
/// local_world_size == -1 (unknown) or 0 <= local_rank < local_world_size <= world_size.
struct rank_info {
    int rank = 0;
    int local_rank = 0;
    int world_size = 1;
    int local_world_size = -1;
    /// Where the values came from: "torchrun", "Open MPI", "Slurm", "caller", "nccl", or "default"
    /// for a process outside any job (rank 0 of 1).
    std::string source = "default";

    friend bool operator==(const rank_info&, const rank_info&) = default;
};

/// Looks up an environment variable by name; nullopt when it is not set.
using environment_lookup = std::function<std::optional<std::string>(std::string_view)>;

namespace detail {

/// One launcher's variable names, in order of precedence.
struct launcher_variables {
    const char* launcher;
    const char* rank;
    const char* local_rank;
    const char* world_size;
    const char* local_world_size; ///< optional
};

inline constexpr std::array<launcher_variables, 3> launchers{{
    {"torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"},
}};

/// Parses a non-negative int, the whole string; throws rank_error naming the variable otherwise.
inline int parse_count(std::string_view name, const std::string& text) {
    int value = 0;
    const char* first = text.data();
    const char* last = text.data() + text.size();
    const auto [end, ec] = std::from_chars(first, last, value);
    if (text.empty() || ec != std::errc{} || end != last || value < 0) {
        throw rank_error("custody: " + std::string(name) + "='" + text + "' is not a non-negative integer");
    }
    return value;
}

inline std::optional<std::string> getenv_lookup(std::string_view name) {
    const char* value = std::getenv(std::string(name).c_str()); // NOLINT(concurrency-mt-unsafe): read-only
    if (value == nullptr) return std::nullopt;
    return std::string(value);
}

} // namespace detail

/// Checks the invariants of `info` and returns it; throws rank_error with the offending values.
inline rank_info validate_rank(rank_info info) {
    const std::string where = " (from " + info.source + ")";
    if (info.world_size < 1) {
        throw rank_error("custody: world size " + std::to_string(info.world_size) + " is not positive" + where);
    }
    if (info.rank < 0 || info.rank >= info.world_size) {
        throw rank_error("custody: rank " + std::to_string(info.rank) + " is not below the world size " +
                         std::to_string(info.world_size) + where);
    }
    if (info.local_rank < 0 || info.local_rank >= info.world_size) {
        throw rank_error("custody: local rank " + std::to_string(info.local_rank) +
                         " is not below the world size " + std::to_string(info.world_size) + where);
    }
    if (info.local_world_size != -1 &&
        (info.local_rank >= info.local_world_size || info.local_world_size > info.world_size)) {
        throw rank_error("custody: local rank " + std::to_string(info.local_rank) + " and local world size " +
                         std::to_string(info.local_world_size) + " do not fit world size " +
                         std::to_string(info.world_size) + where);
    }
    return info;
}

namespace detail {

/// Reads one launcher's set: its rank, local rank and world size must all be set, be non-negative
/// integers and be consistent; throws rank_error naming the variable otherwise.
inline rank_info read_launcher(const launcher_variables& vars, const std::string& rank_text,
                               const environment_lookup& lookup) {
    rank_info info;
    info.source = vars.launcher;
    info.rank = parse_count(vars.rank, rank_text);
    for (const auto& [name, field] : {std::pair{vars.local_rank, &info.local_rank},
                                      std::pair{vars.world_size, &info.world_size}}) {
        const auto value = lookup(name);
        if (!value) {
            throw rank_error(std::string("custody: ") + vars.rank + " is set but " + name +
                             " is not (launcher: " + vars.launcher + ")");
        }
        *field = parse_count(name, *value);
    }
    if (const auto local_size = lookup(vars.local_world_size)) {
        // Slurm's SLURM_NTASKS_PER_NODE may read "4(x2)" on uneven layouts: keep it unknown then.
        const std::string& text = *local_size;
        if (text.find_first_not_of("0123456789") == std::string::npos) {
            info.local_world_size = parse_count(vars.local_world_size, text);
        }
    }
    return validate_rank(std::move(info));
}

/// What a rank_error about `bad` adds when a later launcher's set is complete and consistent: the
/// set passed over and how to use it; empty when there is none.
inline std::string complete_set_after(const launcher_variables* bad, const environment_lookup& lookup) {
    for (const launcher_variables* later = bad + 1; later != launchers.data() + launchers.size(); ++later) {
        const auto rank = lookup(later->rank);
        if (!rank) continue;
        try {
            const rank_info other = read_launcher(*later, *rank, lookup);
            return std::string("; ") + later->launcher + "'s variables are complete (rank " +
                   std::to_string(other.rank) + " of " + std::to_string(other.world_size) + "): unset " + bad->rank +
                   ", " + bad->local_rank + ", " + bad->world_size + " and " + bad->local_world_size +
                   " to use them";
        } catch (const rank_error&) {
            continue;
        }
    }
    return {};
}

} // namespace detail

/// Reads the rank from the environment seen through `lookup`. The first launcher whose rank
/// variable is set decides (torchrun, then Open MPI, then Slurm); that launcher's rank, local rank
/// and world size must then all be set, be non-negative integers and be consistent.
///
/// Precedence when several sets are present: a launcher started inside another's job (torchrun
/// agents started by mpirun or srun, one per node) leaves the outer job's variables in its workers'
/// environment, describing the agents, not the workers. So a complete, consistent torchrun set wins
/// over Open MPI's and Slurm's, whatever they say. A set that is present but incomplete or
/// contradicts itself is an error, never skipped in favour of the next: a rank read from the wrong
/// set binds the wrong GPU and labels reports wrongly, silently. The message names a later set that
/// is complete, and which variables to unset to use it.
///
/// Throws rank_error when no launcher's variables are set (naming what was looked for), when one is
/// missing, or when a value is malformed or inconsistent (naming the variable and its value).
/// Thread safety: as `lookup`. Complexity: a few dozen lookups.
[[nodiscard]] inline rank_info rank_from_environment(const environment_lookup& lookup) {
    for (const auto& vars : detail::launchers) {
        const auto rank = lookup(vars.rank);
        if (!rank) continue;
        try {
            return detail::read_launcher(vars, *rank, lookup);
        } catch (const rank_error& e) {
            const std::string other = detail::complete_set_after(&vars, lookup);
            if (other.empty()) throw;
            throw rank_error(e.what() + other);
        }
    }
    throw rank_error("custody: no rank in the environment: set RANK, LOCAL_RANK and WORLD_SIZE (as torchrun "
                     "does), or launch under Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK, "
                     "OMPI_COMM_WORLD_SIZE) or Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS)");
}

/// Reads the rank from this process's environment (see the overload above).
/// Thread safety: safe unless another thread modifies the environment at the same time.
[[nodiscard]] inline rank_info rank_from_environment() { return rank_from_environment(&detail::getenv_lookup); }

/// As rank_from_environment, except that a process no launcher started (none of the rank variables
/// is set) is rank 0 of 1 with source "default" instead of an error: for tools that also run
/// outside a job, such as the tracking resource. Variables that are set but malformed or
/// inconsistent are still a rank_error, with the same precedence.
[[nodiscard]] inline rank_info detect_rank(const environment_lookup& lookup) {
    for (const auto& vars : detail::launchers) {
        if (lookup(vars.rank)) return rank_from_environment(lookup);
    }
    return rank_info{};
}

/// detect_rank over this process's environment.
[[nodiscard]] inline rank_info detect_rank() { return detect_rank(&detail::getenv_lookup); }

/// Where one rank stands among the ranks of its host.
struct host_placement {
    int local_rank = 0;       ///< the ranks of one host numbered 0, 1, ... in rank order
    int local_world_size = 0; ///< how many ranks run on that host
};

/// The placement of `rank` when rank r runs on host `hosts[r]`: its local rank is the number of
/// lower ranks on its host. What every rank computes alike from the same gathered host names,
/// whatever device ordinals CUDA_VISIBLE_DEVICES gave the processes. Throws rank_error when `rank`
/// is not an index of `hosts`. Complexity: O(hosts).
[[nodiscard]] inline host_placement place_on_host(const std::vector<std::string>& hosts, int rank) {
    if (rank < 0 || static_cast<std::size_t>(rank) >= hosts.size()) {
        throw rank_error("custody: rank " + std::to_string(rank) + " is not among the " +
                         std::to_string(hosts.size()) + " ranks whose hosts were gathered");
    }
    const std::string& mine = hosts[static_cast<std::size_t>(rank)];
    host_placement placement;
    for (std::size_t r = 0; r < hosts.size(); ++r) {
        if (hosts[r] != mine) continue;
        if (r < static_cast<std::size_t>(rank)) ++placement.local_rank;
        ++placement.local_world_size;
    }
    return placement;
}

/// A rank given by the caller, checked (see validate_rank): throws rank_error unless
/// 0 <= rank < world_size and 0 <= local_rank < world_size.
[[nodiscard]] inline rank_info make_rank(int rank, int local_rank, int world_size) {
    return validate_rank(rank_info{rank, local_rank, world_size, -1, "caller"});
}

} // namespace custody
