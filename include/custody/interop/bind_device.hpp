/// @file
/// `bind_device`: binds this rank to the device its local rank names, after checking with every
/// other rank (through an exchange: an NCCL communicator on GPUs, anything that can all-gather in
/// tests) that no two ranks on one host chose the same device.
#pragma once

#include <custody/core/rank.hpp>
#include <custody/platform/platform.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace custody::interop {

/// What one rank tells the others about the device it chose. A fixed-size trivially copyable
/// record, so that it can travel as raw bytes (an NCCL all-gather of `sizeof(device_claim)` bytes).
struct device_claim {
    static constexpr std::size_t text_size = 128;

    int rank = -1;
    int local_rank = -1;
    int device = -1;
    std::array<char, text_size> host{};      ///< NUL-terminated, truncated if longer
    std::array<char, text_size> device_id{}; ///< NUL-terminated: a GPU UUID, or "device N"

    [[nodiscard]] std::string_view host_name() const noexcept { return view(host); }
    [[nodiscard]] std::string_view device_name() const noexcept { return view(device_id); }

    /// Copies `text` into `field`, truncated to fit with its terminating NUL.
    static void assign(std::array<char, text_size>& field, std::string_view text) noexcept {
        field.fill('\0');
        std::memcpy(field.data(), text.data(), std::min(text.size(), text_size - 1));
    }

private:
    static std::string_view view(const std::array<char, text_size>& field) noexcept {
        return {field.data(), ::strnlen(field.data(), text_size)};
    }
};
static_assert(std::is_trivially_copyable_v<device_claim>);

/// Two ranks on one host chose the same device. Every rank that takes part in the claim check
/// throws it with the same pair (the lowest two ranks in conflict), so no rank goes on alone; a
/// device_lock throws it in the process that came second, naming the holder first. `detail`, when
/// given, is appended (which process holds the device).
class duplicate_device_error final : public rank_error {
public:
    duplicate_device_error(int first_rank, int second_rank, int device, std::string host, std::string device_id,
                           const std::string& detail = {})
        : rank_error("custody: ranks " + std::to_string(first_rank) + " and " + std::to_string(second_rank) +
                     " both chose device " + std::to_string(device) + " on host " + host + " (" + device_id +
                     "); give each local rank its own device (LOCAL_RANK, CUDA_VISIBLE_DEVICES)" +
                     (detail.empty() ? std::string() : "; " + detail)),
          first_rank_(first_rank), second_rank_(second_rank), device_(device), host_(std::move(host)) {}

    [[nodiscard]] int first_rank() const noexcept { return first_rank_; }
    [[nodiscard]] int second_rank() const noexcept { return second_rank_; }
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] const std::string& host() const noexcept { return host_; }

private:
    int first_rank_;
    int second_rank_;
    int device_;
    std::string host_;
};

/// Something that gathers one claim from every rank of the job: `all_gather(mine)` returns the
/// claims of all ranks (any order). Every rank must call it, once per binding. On GPUs the NCCL
/// exchange of interop/nccl.hpp; in tests, threads or processes meeting at a barrier.
template <class E>
concept claim_exchange = requires(E& e, const device_claim& mine) {
    { e.all_gather(mine) } -> std::same_as<std::vector<device_claim>>;
};

/// Throws duplicate_device_error if two claims name one host and one device identity, and
/// rank_error if the claims do not cover ranks 0..world_size-1 exactly once. Deterministic: every
/// rank reaches the same verdict from the same claims. Complexity: O(n log n).
inline void check_device_claims(std::vector<device_claim> claims, int world_size) {
    std::sort(claims.begin(), claims.end(),
              [](const device_claim& a, const device_claim& b) { return a.rank < b.rank; });
    if (static_cast<int>(claims.size()) != world_size) {
        throw rank_error("custody: the device check gathered " + std::to_string(claims.size()) +
                         " claims for a world of " + std::to_string(world_size) + " ranks");
    }
    for (int r = 0; r < world_size; ++r) {
        if (claims[static_cast<std::size_t>(r)].rank != r) {
            throw rank_error("custody: the device check found no claim from rank " + std::to_string(r) +
                             " (two processes may share a rank)");
        }
    }
    // (host, device identity) -> lowest rank that claimed it; claims are visited in rank order.
    std::map<std::pair<std::string_view, std::string_view>, const device_claim*> owners;
    for (const device_claim& c : claims) {
        const auto [it, fresh] = owners.emplace(std::pair{c.host_name(), c.device_name()}, &c);
        if (!fresh) {
            throw duplicate_device_error(it->second->rank, c.rank, c.device, std::string(c.host_name()),
                                         std::string(c.device_name()));
        }
    }
}

/// The result of a binding: the rank, the device it is bound to, and how the others saw it.
struct device_binding {
    rank_info rank;
    int device = -1;
    std::string host;
    std::string device_id;
};

/// Options of bind_device.
struct binding_options {
    /// The host name claimed; empty means gethostname(). Tests set it to model several hosts.
    std::string host;
    /// Names a device the way the other ranks can compare (a GPU's UUID on the cuda platform, so
    /// that two processes that see the same GPU under different ordinals still collide). Empty
    /// means "device N".
    std::function<std::string(int)> identify;
};

namespace detail {
inline std::string this_host_name() {
    std::array<char, 256> name{};
    if (::gethostname(name.data(), name.size() - 1) != 0) return "unknown-host";
    return name.data();
}
} // namespace detail

/// The device of `rank` when its process sees `visible` devices: local_rank mod visible.
///  - every process sees all the host's GPUs: the local rank;
///  - the launcher gave each process one GPU (CUDA_VISIBLE_DEVICES=<its GPU>): device 0;
///  - each process sees its own k GPUs (CUDA_VISIBLE_DEVICES=<k of them>, fewer than the local
///    ranks): local_rank mod k of its own set.
/// A layout where this puts two ranks of one host on one GPU (8 local ranks that all see the same
/// 4 GPUs) is caught by the identity check of bind_device (GPU UUIDs, not ordinals), and on the
/// cuda platform already by the device lock a communicator takes. Throws rank_error when no
/// device is visible. Complexity: O(1).
[[nodiscard]] inline int choose_device(const rank_info& rank, int visible) {
    if (visible < 1) {
        throw rank_error("custody: local rank " + std::to_string(rank.local_rank) + " (rank " +
                         std::to_string(rank.rank) + ") has no device: no device is visible on host " +
                         detail::this_host_name() + " (CUDA_VISIBLE_DEVICES, the driver)");
    }
    return rank.local_rank % visible;
}

/// Chooses the device of `rank` on `Platform` (choose_device over Platform::device_count()).
template <platform Platform>
[[nodiscard]] int device_for(const rank_info& rank) {
    return choose_device(rank, Platform::device_count());
}

/// Binds this rank to its device on `Platform`:
///  1. chooses the device from the local rank (device_for, choose_device);
///  2. all-gathers (host, device identity) over `exchange`, and checks that no two ranks on one
///     host chose one device (check_device_claims);
///  3. only then makes the device current on the calling thread.
/// On any error nothing was changed (the current device is untouched) and every rank of the
/// exchange throws the same error. Collective: every rank must call it with its own rank_info.
///
/// Thread safety: sets the calling thread's current device; call it once per rank.
/// Complexity: one all-gather of world_size claims, O(n log n) checking.
template <platform Platform, claim_exchange Exchange>
device_binding bind_device(const rank_info& rank, Exchange& exchange, const binding_options& options = {}) {
    const rank_info checked = validate_rank(rank);
    const int device = device_for<Platform>(checked);
    device_binding binding{checked, device, options.host.empty() ? detail::this_host_name() : options.host,
                           options.identify ? options.identify(device) : "device " + std::to_string(device)};
    device_claim mine;
    mine.rank = checked.rank;
    mine.local_rank = checked.local_rank;
    mine.device = device;
    device_claim::assign(mine.host, binding.host);
    device_claim::assign(mine.device_id, binding.device_id);
    check_device_claims(exchange.all_gather(mine), checked.world_size);
    Platform::set_device(device);
    return binding;
}

} // namespace custody::interop
