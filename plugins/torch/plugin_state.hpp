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
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(CUSTODY_TORCH_CUDA)
#include <custody/platform/cuda.hpp>
#include <custody/resource/cuda_async.hpp>
#else
#include <custody/platform/host.hpp>
#include <custody/resource/simulated_device_memory.hpp>
#endif

#define CUSTODY_EXPORT __attribute__((visibility("default")))

namespace custody_plugin {

#if defined(CUSTODY_TORCH_CUDA)
using platform = custody::cuda::platform;
using upstream = custody::resource::cuda_async;
#else
using platform = custody::host::platform;
using upstream = custody::host::simulated_device_memory;
#endif

/// The per-device resources: custody's stream-ordered pool over the device's memory, holding blocks
/// recorded on other streams until their work is done (PyTorch's record_stream); with tracking on,
/// the tracking resource between the two (owners, snapshots, per-rank reports) and a segment
/// journal under the pool (the segments and history of a PyTorch memory snapshot).
using pool_type = custody::pool::stream_ordered_pool<upstream>;
using tracked_pool = custody::pool::stream_ordered_pool<custody::debug::segment_journal<upstream>>;
using plain_resource = custody::resource::recorded_streams<pool_type>;
using tracked_resource = custody::resource::recorded_streams<custody::debug::tracking_resource<tracked_pool>>;
using plain_allocator = custody::interop::pluggable_allocator<plain_resource>;
using tracked_allocator = custody::interop::pluggable_allocator<tracked_resource>;

/// The pool under either resource.
inline pool_type& pool_of(plain_resource& r) noexcept { return r.upstream(); }
inline tracked_pool& pool_of(tracked_resource& r) noexcept { return r.upstream().upstream(); }

/// What custody_configure and the other setters chose, for the pools made afterwards.
/// Invariant: once `made` is set, the options below it no longer change what exists.
struct options_state {
    std::atomic<std::size_t> max_bytes{0};          ///< 0: not set
    std::atomic<std::size_t> headroom{SIZE_MAX};    ///< SIZE_MAX: not set
    std::atomic<bool> tracking{false};              ///< the tracked allocator serves
    std::atomic<bool> stacks{false};                ///< the tracker captures call stacks
    std::atomic<std::size_t> history_entries{0};    ///< each device's history keeps this many events
    std::atomic<std::uint64_t> trend_every{0};      ///< the trackers sample every N allocations (0: when asked)
    std::atomic<std::uint32_t> trend_window{1};     ///< trend_options::window_samples
    std::atomic<std::uint32_t> trend_levels{5};     ///< trend_options::levels
    std::atomic<std::uint32_t> trend_windows{16};   ///< trend_options::windows
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
/// device, else custody_configure's max_bytes, else CUSTODY_TORCH_MAX_BYTES. The pool keeps the
/// device's headroom free, asking the platform for the device's free memory at each growth (the
/// host platform cannot tell: its virtual devices are as large as the cap).
inline custody::pool::pool_options device_pool_options(int device) {
    options_state& o = options();
    custody::pool::pool_options p;
    std::size_t cap = o.max_bytes.load();
    if (cap == 0) cap = environment_max_bytes();
    {
        std::lock_guard lock(o.mutex);
        if (auto found = o.device_max_bytes.find(device); found != o.device_max_bytes.end()) cap = found->second;
    }
    if (cap != 0) p.maximum_size = cap;
    if (const std::size_t headroom = o.headroom.load(); headroom != SIZE_MAX) p.device_headroom = headroom;
    p.memory_info = &platform::memory_info;
    return p;
}

/// The host build's virtual devices are as large as the cap, 8 GiB without one.
inline std::size_t host_capacity(const custody::pool::pool_options& p) noexcept {
    return p.maximum_size != SIZE_MAX ? p.maximum_size : std::size_t{8} << 30;
}

/// The pool options of the host build: its virtual device is as large as the cap, so the cap is
/// all the pool may hold, with no headroom beside it unless one was configured.
inline custody::pool::pool_options host_pool_options(custody::pool::pool_options p) {
    if (options().headroom.load() == SIZE_MAX) p.device_headroom = 0;
    return p;
}

/// The tracker's options under PyTorch: no guard bytes nor poison (device memory, written on the
/// streams PyTorch owns), violations logged rather than thrown into PyTorch, rank from the
/// launcher's environment (torchrun's RANK, LOCAL_RANK, WORLD_SIZE), stacks when configured, the
/// device's history, and the trend's samples and scales as configured, its time left counted down
/// to the pool's device budget (`p`'s headroom; on the host build, the virtual device's size).
inline custody::debug::tracking_options tracker_options(std::shared_ptr<custody::debug::allocation_history> history,
                                                        const custody::pool::pool_options& p) {
    custody::debug::tracking_options o;
    o.name = "torch";
    o.canaries = false;
    o.poison = false;
    o.on_violation = custody::debug::policy::log;
    o.release_leaks = false;
    o.capture_stacks = options().stacks.load();
    o.history = std::move(history);
    o.trend.every_allocations = options().trend_every.load();
    o.trend.window_samples = options().trend_window.load();
    o.trend.levels = options().trend_levels.load();
    o.trend.windows = options().trend_windows.load();
    o.trend.headroom_bytes = p.device_headroom;
#if !defined(CUSTODY_TORCH_CUDA)
    const std::size_t headroom = options().headroom.load() == SIZE_MAX ? 0 : options().headroom.load();
    o.trend.budget_bytes = host_capacity(p) > headroom ? host_capacity(p) - headroom : 1;
#endif
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

template <class Resource>
std::unique_ptr<Resource> make_resource(int device) {
    options().made.store(true);
    const custody::pool::pool_options p = device_pool_options(device);
#if defined(CUSTODY_TORCH_CUDA)
    const auto leaf = [&](auto&&... head) { return std::make_unique<Resource>(head..., p, device); };
    const auto journaled = [&](auto&&... head) { return std::make_unique<Resource>(head..., device); };
#else
    const auto leaf = [&](auto&&... head) {
        return std::make_unique<Resource>(head..., host_pool_options(p), device, host_capacity(p));
    };
    const auto journaled = [&](auto&&... head) { return std::make_unique<Resource>(head..., device, host_capacity(p)); };
#endif
    if constexpr (std::is_same_v<Resource, tracked_resource>) {
        auto history = std::make_shared<custody::debug::allocation_history>(options().history_entries.load());
        {
            std::lock_guard lock(histories_mutex());
            auto& all = histories();
            if (static_cast<std::size_t>(device) < all.size()) all[static_cast<std::size_t>(device)] = history;
        }
        return journaled(tracker_options(history, p), p, history);
    } else {
        return leaf();
    }
}

/// The process's allocators. Never destroyed: PyTorch may free blocks while static objects are
/// being destroyed at exit, and custody never calls CUDA while the process is exiting.
inline plain_allocator& plain() {
    static plain_allocator* const the = new plain_allocator(platform::device_count(), &make_resource<plain_resource>);
    return *the;
}
inline tracked_allocator& tracked() {
    static tracked_allocator* const the =
        new tracked_allocator(platform::device_count(), &make_resource<tracked_resource>);
    return *the;
}

/// Calls `f` with the allocator in service.
template <class F>
decltype(auto) dispatch(F&& f) {
    if (options().tracking.load(std::memory_order_relaxed)) return std::forward<F>(f)(tracked());
    return std::forward<F>(f)(plain());
}

/// Sets this thread's last error, as the allocator in service reports it.
inline void set_error(std::string message) noexcept {
    if (options().tracking.load(std::memory_order_relaxed)) {
        tracked_allocator::set_last_error(std::move(message));
    } else {
        plain_allocator::set_last_error(std::move(message));
    }
}

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
/// streams), from its statistics and, where the resource is a pool, its segments.
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
    }
    return out;
}

/// The counters of a whole-process resource (a pool under recorded_streams).
template <class Resource>
std::pair<custody_torch_stats, custody_torch_segments> stats_of(Resource& r, std::uint64_t ooms) {
    return counters_of(pool_of(r), ooms, {r.held_bytes(), r.held_blocks()});
}

} // namespace custody_plugin
