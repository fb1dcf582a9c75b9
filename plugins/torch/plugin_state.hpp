// The allocator library's state, shared by its entry points (custody_torch_allocator.cpp: the
// whole-process allocator; snapshot_export.cpp: PyTorch memory snapshots; mempool_backings.cpp: the
// memory behind torch.cuda.MemPool): the resources per device, the options set before they exist,
// and the helpers that turn exceptions into the C interface's answers. Internal to the library:
// inline functions, so that every translation unit shares one of each object.
#pragma once

#include "custody_torch_allocator.h"

#include <custody/core/detail/layers.hpp>
#include <custody/debug/history.hpp>
#include <custody/debug/segment_journal.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/interop/pluggable_allocator.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/recorded_streams.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(CUSTODY_TORCH_CUDA)
#include <custody/platform/cuda.hpp>
#include <custody/platform/cuda_vmm.hpp>
#include <custody/resource/cuda_malloc.hpp>
#else
#include <custody/platform/host.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/resource/simulated_device_memory.hpp>
#endif
#include <custody/resource/virtual_memory.hpp>

#define CUSTODY_EXPORT __attribute__((visibility("default")))

namespace custody_plugin {

/// The memory under each device's pool, two ways (docs/interop-pytorch.md, "backings"):
/// - mapped (the default): one address range reserved per device, into which the pool maps 2 MiB
///   granules as it grows and from which it unmaps them as it trims (resource::virtual_memory over
///   cuda::vmm; over the host's virtual memory in the host build, so that the host build measures
///   what a GPU user gets);
/// - chunked: chunks from cudaMalloc, which cudaIpcGetMemHandle and RDMA registration accept and
///   virtual-memory-management memory is refused by; for a device without virtual memory
///   management, or when asked (custody_configure("chunked", 1), CUSTODY_BACKING=chunked). The
///   host build's chunked leaf is simulated device memory.
#if defined(CUSTODY_TORCH_CUDA)
using platform = custody::cuda::platform;
using mapped_leaf = custody::resource::virtual_memory<custody::cuda::vmm>;
using chunked_leaf = custody::resource::cuda_malloc;
#else
using platform = custody::host::platform;
using mapped_leaf = custody::resource::virtual_memory<custody::host::vmm>;
using chunked_leaf = custody::host::simulated_device_memory;
#endif

/// The per-device resources over `Leaf`: custody's stream-ordered pool, holding blocks recorded
/// on other streams until their work is done (PyTorch's record_stream); with tracking on, the
/// tracking resource between the two (owners, snapshots, per-rank reports) and a segment journal
/// under the pool (the segments and history of a PyTorch memory snapshot).
template <class Leaf>
struct resources_over {
    using pool = custody::pool::stream_ordered_pool<Leaf>;
    using tracked_pool = custody::pool::stream_ordered_pool<custody::debug::segment_journal<Leaf>>;
    using plain_resource = custody::resource::recorded_streams<pool>;
    using tracked_resource = custody::resource::recorded_streams<custody::debug::tracking_resource<tracked_pool>>;
    using plain_allocator = custody::interop::pluggable_allocator<plain_resource>;
    using tracked_allocator = custody::interop::pluggable_allocator<tracked_resource>;
};
using mapped = resources_over<mapped_leaf>;
using chunked = resources_over<chunked_leaf>;

/// Whether `R` is a tracked resource (recorded_streams over a tracking_resource).
template <class R>
inline constexpr bool is_tracked = requires(R& r) { r.upstream().make_report(); };

/// The pool under a whole-process resource (under recorded_streams, and the tracker when tracked).
template <class R>
auto& pool_of(R& r) noexcept {
    if constexpr (is_tracked<R>) {
        return r.upstream().upstream();
    } else {
        return r.upstream();
    }
}

/// What custody_configure and the other setters chose, for the pools made afterwards.
/// Invariant: once `made` is set, the options below it no longer change what exists.
struct options_state {
    std::atomic<std::size_t> max_bytes{0};          ///< 0: not set
    std::atomic<std::size_t> headroom{SIZE_MAX};    ///< SIZE_MAX: not set
    std::atomic<bool> tracking{false};              ///< the tracked allocators serve
    std::atomic<bool> stacks{false};                ///< the tracker captures call stacks
    std::atomic<bool> chunked{false};               ///< the chunked backing was asked for (CUSTODY_BACKING wins)
    std::atomic<std::size_t> history_entries{0};    ///< each device's history keeps this many events
    std::atomic<bool> made{false};                  ///< a pool of the whole-process allocator exists
    std::mutex mutex;                               ///< guards device_max_bytes
    std::map<int, std::size_t> device_max_bytes;    ///< set_max_bytes for devices whose pool is not made yet
};

inline options_state& options() {
    static auto* const the = new options_state; // never destroyed: used while the process exits
    return *the;
}

/// CUSTODY_TORCH_MAX_BYTES caps each device's memory (0 or unset: no cap beyond the device's): a
/// count of bytes in decimal digits, the whole text, at most 2^64-1. Anything else is refused
/// naming the variable (std::invalid_argument), never read as a part or a wrapped number.
inline std::size_t environment_max_bytes() {
    const char* text = std::getenv("CUSTODY_TORCH_MAX_BYTES"); // NOLINT(concurrency-mt-unsafe)
    if (text == nullptr || *text == '\0') return 0;
    const std::string_view value(text);
    std::uint64_t n = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n, 10);
    if (ec != std::errc{} || end != value.data() + value.size() || value.front() < '0' || value.front() > '9') {
        const std::string shown(value.substr(0, 40));
        throw std::invalid_argument("custody: CUSTODY_TORCH_MAX_BYTES='" + shown + (value.size() > 40 ? "...'" : "'") +
                                    " is not a count of bytes in 0 .. 2^64-1 (decimal digits only)");
    }
    return static_cast<std::size_t>(n);
}

/// The pool options for `device`: the defaults (see docs/pool.md), capped by set_max_bytes for the
/// device (0 included: nothing may be allocated), else custody_configure's max_bytes, else
/// CUSTODY_TORCH_MAX_BYTES (0 from those two: no cap). The pool keeps the device's headroom free,
/// asking the platform for the device's free memory at each growth (the host platform cannot tell:
/// its virtual devices are as large as the cap).
inline custody::pool::pool_options device_pool_options(int device) {
    options_state& o = options();
    custody::pool::pool_options p;
    std::size_t cap = o.max_bytes.load();
    if (cap == 0) cap = environment_max_bytes();
    if (cap != 0) p.maximum_size = cap;
    {
        std::lock_guard lock(o.mutex);
        if (auto found = o.device_max_bytes.find(device); found != o.device_max_bytes.end()) p.maximum_size = found->second;
    }
    if (const std::size_t headroom = o.headroom.load(); headroom != SIZE_MAX) p.device_headroom = headroom;
    p.memory_info = &platform::memory_info;
    return p;
}

/// The host build's virtual devices are as large as the cap, 8 GiB without one.
inline std::size_t host_capacity(const custody::pool::pool_options& p) noexcept {
    return p.maximum_size != SIZE_MAX ? p.maximum_size : std::size_t{8} << 30;
}

/// The pool options of the platform. The host build's virtual device is as large as the cap, so the
/// cap is all the pool may hold, with no headroom beside it unless one was configured.
inline custody::pool::pool_options platform_pool_options(custody::pool::pool_options p) {
#if !defined(CUSTODY_TORCH_CUDA)
    if (options().headroom.load() == SIZE_MAX) p.device_headroom = 0;
    p.maximum_size = host_capacity(p);
#endif
    return p;
}

/// How the mapped backing maps on `device`. The granule: the device's granularity; in the host
/// build the GPU's 2 MiB, so that it rounds as it would on a GPU (the host's own is a page). The
/// access: the device and every device that can reach it as a peer. PyTorch copies between GPUs
/// directly once it has enabled peer access (cudaDeviceEnablePeerAccess), which covers cudaMalloc
/// memory and not mapped memory; its own expandable segments grant each peer access to what they
/// map (addPeer), and a pluggable allocator is told nothing of peers, so it grants them all up front.
inline custody::resource::reservation_options mapping_options([[maybe_unused]] int device) {
    custody::resource::reservation_options r;
#if defined(CUSTODY_TORCH_CUDA)
    for (int peer = 0; peer < platform::device_count(); ++peer) {
        int reachable = 0;
        if (peer != device && cudaDeviceCanAccessPeer(&reachable, peer, device) == cudaSuccess && reachable != 0) {
            r.peers.push_back(peer);
        }
    }
    static_cast<void>(cudaGetLastError());
#else
    r.granule = std::size_t{2} << 20;
#endif
    return r;
}

/// The address space the mapped backing reserves on `device`: four times the device's memory (what
/// virtual_memory reserves by default: address space costs no memory, and a pool that grows in it
/// keeps free holes); in the host build, four times the virtual device (at least one granule).
inline std::size_t mapped_address_space(int device, [[maybe_unused]] const custody::pool::pool_options& p) {
#if defined(CUSTODY_TORCH_CUDA)
    return mapped_leaf::default_capacity(device);
#else
    static_cast<void>(device);
    return 4 * std::max(host_capacity(p), std::size_t{2} << 20);
#endif
}

// ---- which backing serves a device -----------------------------------------------------------

enum class backing : unsigned char { undecided = 0, mapped, chunked };

/// CUSTODY_BACKING: "mapped" or "chunked" (the whole text), or nullopt when unset or empty.
/// Anything else is refused naming the variable (std::invalid_argument).
inline std::optional<backing> environment_backing() {
    const char* text = std::getenv("CUSTODY_BACKING"); // NOLINT(concurrency-mt-unsafe)
    if (text == nullptr || *text == '\0') return std::nullopt;
    const std::string_view value(text);
    if (value == "mapped") return backing::mapped;
    if (value == "chunked") return backing::chunked;
    throw std::invalid_argument("custody: CUSTODY_BACKING='" + std::string(value.substr(0, 40)) +
                                (value.size() > 40 ? "...'" : "'") + " is neither 'mapped' nor 'chunked'");
}

/// The devices' backings, each decided once (backing_of) and kept for the process.
inline std::atomic<backing>* backings() {
    static auto* const the = new std::atomic<backing>[static_cast<std::size_t>(std::max(platform::device_count(), 1))]{};
    return the;
}

/// What decides the backing of `device`, in words (for the report).
inline std::string backing_reason(int device) {
    std::optional<backing> asked;
    try {
        asked = environment_backing();
    } catch (const std::exception& e) {
        return e.what();
    }
    if (asked) return std::string("CUSTODY_BACKING=") + (*asked == backing::chunked ? "chunked" : "mapped");
    if (options().chunked.load()) return "the option chunked";
    if (!mapped_leaf::vmm_type::supported(device)) return "no virtual memory management on the device";
    return "the default";
}

/// The backing of `device`, decided on the first call: chunked when asked (CUSTODY_BACKING, which
/// wins, else custody_configure("chunked", 1)) or when the device has no virtual memory management
/// (its attribute), mapped otherwise. Throws std::invalid_argument for a malformed CUSTODY_BACKING
/// (nothing decided then). A device out of range: mapped (its allocator refuses the device).
inline backing backing_of(int device) {
    if (device < 0 || device >= platform::device_count()) return backing::mapped;
    std::atomic<backing>& slot = backings()[device];
    if (const backing b = slot.load(std::memory_order_acquire); b != backing::undecided) return b;
    const std::optional<backing> asked = environment_backing();
    backing chosen = asked.value_or(options().chunked.load() ? backing::chunked : backing::mapped);
    if (chosen == backing::mapped && !mapped_leaf::vmm_type::supported(device)) chosen = backing::chunked;
    backing expected = backing::undecided;
    slot.compare_exchange_strong(expected, chosen, std::memory_order_acq_rel);
    return slot.load(std::memory_order_acquire);
}

/// The first device whose backing is decided, or -1 while none is.
inline int first_decided_backing() noexcept {
    for (int d = 0; d < platform::device_count(); ++d) {
        if (backings()[d].load(std::memory_order_acquire) != backing::undecided) return d;
    }
    return -1;
}

/// The backing `device` was given, deciding nothing (mapped while undecided: nothing exists).
inline backing known_backing(int device) noexcept {
    if (device < 0 || device >= platform::device_count()) return backing::mapped;
    const backing b = backings()[device].load(std::memory_order_acquire);
    return b == backing::undecided ? backing::mapped : b;
}

[[nodiscard]] inline const char* backing_name(backing b) noexcept { return b == backing::chunked ? "chunked" : "mapped"; }

/// The tracker's options under PyTorch: no guard bytes nor poison (device memory, written on the
/// streams PyTorch owns), violations logged rather than thrown into PyTorch, rank from the
/// launcher's environment (torchrun's RANK, LOCAL_RANK, WORLD_SIZE), stacks when configured, and
/// the device's history.
inline custody::debug::tracking_options tracker_options(std::shared_ptr<custody::debug::allocation_history> history) {
    custody::debug::tracking_options o;
    o.name = "torch";
    o.canaries = false;
    o.poison = false;
    o.on_violation = custody::debug::policy::log;
    o.release_leaks = false;
    o.capture_stacks = options().stacks.load();
    o.history = std::move(history);
    return o;
}

/// Each device's history, made with its tracked resource (null before); kept for the process.
inline std::vector<std::shared_ptr<custody::debug::allocation_history>>& histories() {
    static auto* const the = new std::vector<std::shared_ptr<custody::debug::allocation_history>>(
        static_cast<std::size_t>(std::max(platform::device_count(), 0)));
    return *the;
}
inline std::mutex& histories_mutex() {
    static auto* const the = new std::mutex;
    return *the;
}

/// Calls `make` with the constructor arguments of `device`'s leaf of type `Leaf` (the trailing
/// arguments of the resources above it) and returns what it returns.
template <class Leaf, class Make>
auto with_leaf_arguments(int device, const custody::pool::pool_options& p, Make make) {
    if constexpr (std::is_same_v<Leaf, mapped_leaf>) {
        return make(device, mapped_address_space(device, p), mapping_options(device));
    } else {
#if defined(CUSTODY_TORCH_CUDA)
        return make(device);
#else
        return make(device, host_capacity(p));
#endif
    }
}

/// `device`'s whole-process resource of type `Resource` (one of resources_over<Leaf>'s two).
template <class Leaf, class Resource>
std::unique_ptr<Resource> make_resource(int device) {
    options().made.store(true);
    const custody::pool::pool_options p = platform_pool_options(device_pool_options(device));
    if constexpr (is_tracked<Resource>) {
        auto history = std::make_shared<custody::debug::allocation_history>(options().history_entries.load());
        {
            std::lock_guard lock(histories_mutex());
            auto& all = histories();
            if (static_cast<std::size_t>(device) < all.size()) all[static_cast<std::size_t>(device)] = history;
        }
        return with_leaf_arguments<Leaf>(device, p, [&](auto&&... leaf) {
            return std::make_unique<Resource>(tracker_options(history), p, history, leaf...);
        });
    } else {
        return with_leaf_arguments<Leaf>(device, p, [&](auto&&... leaf) { return std::make_unique<Resource>(p, leaf...); });
    }
}

/// The process's allocators, one per backing and mode (plain or tracked). Never destroyed: PyTorch
/// may free blocks while static objects are being destroyed at exit, and custody never calls CUDA
/// while the process is exiting.
template <class Allocator, class Leaf>
Allocator& allocator_instance() {
    static Allocator* const the =
        new Allocator(platform::device_count(), &make_resource<Leaf, typename Allocator::resource_type>);
    return *the;
}
inline mapped::plain_allocator& mapped_plain() { return allocator_instance<mapped::plain_allocator, mapped_leaf>(); }
inline mapped::tracked_allocator& mapped_tracked() { return allocator_instance<mapped::tracked_allocator, mapped_leaf>(); }
inline chunked::plain_allocator& chunked_plain() { return allocator_instance<chunked::plain_allocator, chunked_leaf>(); }
inline chunked::tracked_allocator& chunked_tracked() {
    return allocator_instance<chunked::tracked_allocator, chunked_leaf>();
}

/// Where this thread's last error is kept: the slot of the allocator its last call went through
/// (each allocator type keeps its own), so that custody_last_error reads what that call wrote.
struct error_slot {
    const char* (*get)() noexcept;
    void (*set)(std::string) noexcept;
};
template <class Allocator>
inline constexpr error_slot slot_of{&Allocator::last_error, &Allocator::set_last_error};
inline error_slot& last_slot() noexcept {
    thread_local error_slot slot = slot_of<mapped::plain_allocator>;
    return slot;
}

/// Calls `f` with allocator `a`, whose slot then holds this thread's last error.
template <class Allocator, class F>
decltype(auto) serve(Allocator& a, F&& f) {
    last_slot() = slot_of<Allocator>;
    return std::forward<F>(f)(a);
}

/// Calls `f` with the allocator in service for backing `b` (tracked or plain, as configured); `f`
/// returns the same type for each.
template <class F>
decltype(auto) dispatch_backing(backing b, F&& f) {
    const bool tracking = options().tracking.load(std::memory_order_relaxed);
    if (b == backing::chunked) {
        if (tracking) return serve(chunked_tracked(), std::forward<F>(f));
        return serve(chunked_plain(), std::forward<F>(f));
    }
    if (tracking) return serve(mapped_tracked(), std::forward<F>(f));
    return serve(mapped_plain(), std::forward<F>(f));
}

/// Calls `f` with the allocator in service for `device`, deciding its backing (backing_of; throws
/// what it throws): for the calls that make a device's pool.
template <class F>
decltype(auto) dispatch(int device, F&& f) {
    return dispatch_backing(backing_of(device), std::forward<F>(f));
}

/// Calls `f` with the allocator in service for the backing `device` was given, deciding nothing:
/// for the calls that only reach what exists.
template <class F>
decltype(auto) dispatch_known(int device, F&& f) {
    return dispatch_backing(known_backing(device), std::forward<F>(f));
}

/// Calls `f` with each backing's allocator in service (for the calls that reach every device).
template <class F>
void for_each_allocator(F&& f) {
    dispatch_backing(backing::mapped, f);
    dispatch_backing(backing::chunked, f);
}

/// Sets this thread's last error, where custody_last_error reads it.
inline void set_error(std::string message) noexcept { last_slot().set(std::move(message)); }

/// Sets this thread's last error and returns -1.
inline int refuse(std::string why) noexcept {
    set_error(std::move(why));
    return -1;
}

/// Runs `f` (returning 0), turning an exception into -1 and this thread's last error.
template <class F>
int checked(F&& f) noexcept {
    try {
        std::forward<F>(f)();
        set_error("");
        return 0;
    } catch (const std::exception& e) {
        return refuse(e.what());
    } catch (...) {
        return refuse("custody: unknown exception");
    }
}

/// The stream PyTorch names. PyTorch names its default stream nullptr, which custody takes for the
/// synchronous pair (memory usable at once by the host, a host wait where a block comes from
/// another stream); PyTorch orders its work on the legacy default stream, so it is served as that
/// stream, stream-ordered (cudaStreamLegacy, the same stream by an explicit handle).
inline platform::stream_view stream_of(void* stream) noexcept {
#if defined(CUSTODY_TORCH_CUDA)
    return platform::stream_view(stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream));
#else
    return platform::stream_view(static_cast<custody::host::detail::stream_state*>(stream));
#endif
}

/// Copies `text` into `buffer` (NUL-terminated, truncated to capacity); returns text's length.
inline size_t copy_out(const std::string& text, char* buffer, size_t capacity) noexcept {
    if (buffer != nullptr && capacity > 0) {
        const std::size_t n = std::min(text.size(), capacity - 1);
        std::memcpy(buffer, text.data(), n);
        buffer[n] = '\0';
    }
    return text.size();
}

/// A resource's counters in the C interface's structs (`held`: bytes and blocks it holds for other
/// streams), from its statistics and, where the resource is a pool, its segments: the chunks it
/// holds and the chunks taken and given back (chunked), or the granules it has mapped and the
/// granules mapped and unmapped (mapped: each granule is a physical allocation of its own).
template <class Resource>
std::pair<custody_torch_stats, custody_torch_segments> counters_of(const Resource& r, std::uint64_t ooms,
                                                                   std::pair<std::uint64_t, std::uint64_t> held) {
    const custody::resource_statistics s = r.statistics();
    std::pair<custody_torch_stats, custody_torch_segments> out{
        custody_torch_stats{s.live_bytes, s.peak_live_bytes, s.reserved_bytes, s.peak_reserved_bytes,
                            s.live_allocations, s.allocations, s.deallocations, ooms, held.first},
        custody_torch_segments{held.second, 0, 0, 0}};
    if constexpr (requires { r.detailed_statistics().chunks; }) {
        const auto p = r.detailed_statistics();
        out.second.segments = p.chunks;
        out.second.device_allocations = p.upstream_allocations;
        out.second.device_frees = p.upstream_deallocations;
        using leaf_type = std::remove_cvref_t<decltype(r.upstream())>;
        if constexpr (requires(leaf_type& u) { u.map_at(nullptr, std::size_t{0}); u.statistics(); }) {
            // Mapped: each granule is a physical allocation of its own; its leaf counts them.
            const custody::resource_statistics leaf = r.upstream().statistics();
            out.second.segments = (s.reserved_bytes + p.map_granule - 1) / p.map_granule;
            out.second.device_allocations = leaf.allocations;
            out.second.device_frees = leaf.deallocations;
        }
    }
    return out;
}

/// The counters of a whole-process resource (a pool under recorded_streams).
template <class Resource>
std::pair<custody_torch_stats, custody_torch_segments> stats_of(Resource& r, std::uint64_t ooms) {
    return counters_of(pool_of(r), ooms, {r.held_bytes(), r.held_blocks()});
}

} // namespace custody_plugin
