// The shared library behind PyTorch's CUDAPluggableAllocator: the allocation, free, record_stream,
// empty_cache and graph-capture entry points of custody_torch_allocator.h, with statistics,
// options, tracking by owner and the GPU claim, over one custody pool per device. Built twice: over
// CUDA devices (CUSTODY_TORCH_CUDA), and over the host platform's virtual devices so that the C
// interface is tested without a GPU. The state all entry points share is plugin_state.hpp; the
// snapshot and the MemPool backings have files of their own.
#include "custody_torch_allocator.h"
#include "plugin_state.hpp"
#include "python_frames.hpp"

#include <custody/debug/json_report.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/interop/device_lock.hpp>
#include <custody/interop/gpu_name.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace custody_plugin; // NOLINT(google-build-using-namespace): the library's own state

/// Calls `f` with the tracker of `device` (-1: the first device in use); throws when tracking is
/// off or the device has allocated nothing yet.
template <class F>
decltype(auto) with_tracker(int device, F&& f) {
    if (!options().tracking.load()) {
        throw std::logic_error("custody: tracking is off; turn it on before the first allocation "
                               "(custody_configure(\"tracking\", 1), custody.torch.enable(tracking=True))");
    }
    for (int d = 0; device == -1 && d < platform::device_count(); ++d) {
        if (dispatch_known(d, [&](auto& a) { return a.find(d) != nullptr; })) device = d;
    }
    if (device == -1) throw std::logic_error("custody: no device has allocated through custody yet");
    using result = std::invoke_result_t<F&, custody::debug::tracking_resource<mapped::tracked_pool>&>;
    return dispatch_known(device, [&](auto& a) -> result {
        auto* r = a.find(device);
        if (r == nullptr) throw std::invalid_argument("custody: device " + std::to_string(device) + " has allocated nothing yet");
        if constexpr (is_tracked<std::remove_pointer_t<decltype(r)>>) {
            return f(r->upstream());
        } else {
            throw std::logic_error("custody: tracking is off"); // not reached: tracking serves the tracked allocators
        }
    });
}

/// Fills *out with pick(the counters of `device`'s resource) of the allocator in service (zeros
/// before its first allocation): 0, or -1 for a bad device or a failed query.
template <class Out, class Pick>
int fill_counters(int device, Out* out, Pick pick) noexcept {
    return dispatch_known(device, [&](auto& a) {
        if (out == nullptr || device < 0 || device >= a.device_count()) return -1;
        *out = Out{};
        auto* r = a.find(device);
        if (r == nullptr) return 0;
        try {
            *out = pick(stats_of(*r, a.out_of_memory_count(device)));
        } catch (const std::exception& e) {
            return refuse(e.what());
        }
        return 0;
    });
}

/// custody_configure's trend_ options (trend_options' integers), each within its range.
int configure_trend(const std::string& key, std::uint64_t value) {
    options_state& o = options();
    const auto within = [&](std::uint64_t least, std::uint64_t most) {
        if (value >= least && value <= most) return true;
        refuse("custody: option '" + key + "' = " + std::to_string(value) + " is outside " + std::to_string(least) +
               " .. " + std::to_string(most));
        return false;
    };
    if (key == "trend_every_allocations") {
        o.trend_every.store(value);
    } else if (key == "trend_window_samples") {
        if (!within(1, 1u << 20)) return -1;
        o.trend_window.store(static_cast<std::uint32_t>(value));
    } else if (key == "trend_levels") {
        if (!within(1, 8)) return -1;
        o.trend_levels.store(static_cast<std::uint32_t>(value));
    } else if (key == "trend_windows") {
        if (!within(4, 64)) return -1;
        o.trend_windows.store(static_cast<std::uint32_t>(value));
    } else {
        return refuse("custody: unknown option '" + key + "'");
    }
    set_error("");
    return 0;
}

/// The owner scopes this thread opened through custody_owner_push, innermost last.
std::vector<std::unique_ptr<custody::debug::owner_scope>>& owner_stack() {
    thread_local std::vector<std::unique_ptr<custody::debug::owner_scope>> stack;
    return stack;
}

/// Whether a graph capture is routed into a pool of any device now (through either backing).
bool capture_anywhere() noexcept {
    bool underway = false;
    for_each_allocator([&](auto& a) {
        for (int d = 0; d < a.device_count(); ++d) {
            if (const auto* r = a.find(d); r != nullptr && custody::detail::capture_underway(*r)) underway = true;
        }
    });
    return underway;
}

/// Gives back held blocks and cached memory of `device` (-1: every device), to the device itself;
/// the bytes the pools gave back. While a graph capture is routed into any device's pool, nothing
/// at all: synchronizing a device, or unmapping, or freeing with cudaFree, would invalidate a
/// capture begun in CUDA's global mode on any device of the process, and libraries call
/// torch.cuda.empty_cache() defensively inside captured regions.
std::size_t trim_devices(int device) noexcept {
    if (capture_anywhere()) return 0;
    std::size_t released = 0;
    for_each_allocator([&](auto& a) {
        const int first = device == -1 ? 0 : device;
        const int last = device == -1 ? a.device_count() : std::min(device + 1, a.device_count());
        for (int d = std::max(first, 0); d < last; ++d) {
            auto* r = a.find(d);
            if (r == nullptr) continue;
            custody::basic_device_guard<platform> guard(d, std::nothrow); // frees on d's default stream
            r->release_held();
            try {
                released += pool_of(*r).trim();
            } catch (const std::exception& e) {
                set_error(e.what());
            }
        }
    });
    return released;
}

/// One line per device in use: its backing and why, then the counters custody_stats gives (the
/// same numbers), and where the reserve is: granules mapped of the address range (mapped) or
/// chunks (chunked), cached on streams, free to all, the largest free block, held for streams.
std::string report_text() {
    std::string text;
    for (int d = 0; d < platform::device_count(); ++d) {
        dispatch_known(d, [&](auto& a) {
            auto* r = a.find(d);
            if (r == nullptr) return;
            const auto [s, segments] = stats_of(*r, a.out_of_memory_count(d));
            const auto p = pool_of(*r).detailed_statistics();
            const backing b = known_backing(d);
            text += "custody device " + std::to_string(d) + " (" + backing_name(b) + ": " + backing_reason(d) +
                    "): live " + std::to_string(s.live_bytes) + " B in " + std::to_string(s.live_allocations) +
                    " blocks, peak live " + std::to_string(s.peak_live_bytes) + " B, reserved " +
                    std::to_string(s.reserved_bytes) + " B (peak " + std::to_string(s.peak_reserved_bytes) + " B): ";
            if (b == backing::mapped) {
                text += std::to_string(segments.segments) + " granules of " + std::to_string(p.map_granule) +
                        " B mapped in " + std::to_string(p.address_space_bytes) + " B of address space";
            } else {
                text += std::to_string(segments.segments) + " chunks";
            }
            text += ", " + std::to_string(p.stream_cached_bytes) + " B cached on streams, " +
                    std::to_string(p.shared_free_bytes) + " B free to all, largest free block " +
                    std::to_string(p.largest_free_block) + " B, " + std::to_string(s.held_bytes) +
                    " B held for recorded streams; " + std::to_string(s.allocations) + " allocations, " +
                    std::to_string(s.deallocations) + " deallocations, " + std::to_string(s.num_ooms) +
                    " out of memory\n";
        });
    }
    return text.empty() ? std::string("custody: no device used yet\n") : text;
}

} // namespace

extern "C" {

CUSTODY_EXPORT void* custody_alloc(ssize_t size, int device, void* stream) {
    try {
        return dispatch(device, [&](auto& a) { return a.alloc(size, device, stream_of(stream)); });
    } catch (const std::exception& e) { // the backing could not be decided (CUSTODY_BACKING)
        set_error(e.what());
        return nullptr;
    }
}

CUSTODY_EXPORT void* custody_torch_malloc(ssize_t size, int device, void* stream) {
    return dispatch(device, [&](auto& a) { return a.allocate(size, device, stream_of(stream)); });
}

CUSTODY_EXPORT void custody_free(void* ptr, ssize_t size, int device, void* stream) {
    dispatch_known(device, [&](auto& a) { a.free(ptr, size, device, stream_of(stream)); });
}

CUSTODY_EXPORT int custody_stats(int device, custody_torch_stats* out) {
    return fill_counters(device, out, [](const auto& counters) { return counters.first; });
}

CUSTODY_EXPORT int custody_segments(int device, custody_torch_segments* out) {
    return fill_counters(device, out, [](const auto& counters) { return counters.second; });
}

CUSTODY_EXPORT ssize_t custody_backing(int device, char* buffer, size_t capacity) {
    try {
        if (device < 0 || device >= platform::device_count()) {
            throw std::invalid_argument("custody: no device " + std::to_string(device) + " (" +
                                        std::to_string(platform::device_count()) + " devices)");
        }
        const std::string text = std::string(backing_name(backing_of(device))) + " (" + backing_reason(device) + ")";
        set_error("");
        return static_cast<ssize_t>(copy_out(text, buffer, capacity));
    } catch (const std::exception& e) {
        return refuse(e.what());
    }
}

CUSTODY_EXPORT int custody_configure(const char* name, uint64_t value) {
    const std::string key = name != nullptr ? name : "";
    options_state& o = options();
    if (key != "max_bytes" && key != "device_headroom" && key != "tracking" && key != "stacks" && key != "chunked" &&
        !key.starts_with("trend_")) {
        return refuse("custody: unknown option '" + key +
                      "' (known: max_bytes, device_headroom, tracking, stacks, chunked, trend_every_allocations, "
                      "trend_window_samples, trend_levels, trend_windows)");
    }
    if (o.made.load()) {
        return refuse("custody: option '" + key + "' set after the first allocation; set options before it");
    }
    if (const int decided = first_decided_backing(); key == "chunked" && decided != -1) {
        return refuse("custody: option 'chunked' set after device " + std::to_string(decided) +
                      "'s backing was decided (by custody_backing or an allocation); set it before");
    }
    if (key.starts_with("trend_")) return configure_trend(key, value);
    if (key == "tracking") {
        o.tracking.store(value != 0);
    } else if (key == "stacks") {
        o.stacks.store(value != 0);
        if (value != 0) static_cast<void>(install_python_frames()); // Python frames, in a Python process
    } else if (key == "chunked") {
        o.chunked.store(value != 0);
    } else {
        (key == "max_bytes" ? o.max_bytes : o.headroom).store(static_cast<std::size_t>(value));
    }
    set_error("");
    return 0;
}

CUSTODY_EXPORT int custody_set_max_bytes(int device, uint64_t bytes) {
    if (device < 0 || device >= platform::device_count()) {
        return refuse("custody: set_max_bytes: no device " + std::to_string(device) + " (" +
                      std::to_string(platform::device_count()) + " devices)");
    }
    return checked([&] {
        {
            std::lock_guard lock(options().mutex);
            options().device_max_bytes.insert_or_assign(device, static_cast<std::size_t>(bytes));
        }
        dispatch_known(device, [&](auto& a) {
            if (auto* r = a.find(device)) pool_of(*r).set_maximum_size(static_cast<std::size_t>(bytes));
        });
    });
}

CUSTODY_EXPORT int custody_set_out_of_memory_callback(custody_out_of_memory_callback callback, void* user) {
    return checked([&] {
        auto forward = [callback, user](int device, std::size_t bytes, const char* diagnostics) {
            callback(device, bytes, diagnostics, user);
        };
        mapped_plain().set_out_of_memory_callback(callback != nullptr ? forward : mapped::plain_allocator::out_of_memory_callback{});
        mapped_tracked().set_out_of_memory_callback(callback != nullptr ? forward : mapped::tracked_allocator::out_of_memory_callback{});
        chunked_plain().set_out_of_memory_callback(callback != nullptr ? forward : chunked::plain_allocator::out_of_memory_callback{});
        chunked_tracked().set_out_of_memory_callback(callback != nullptr ? forward : chunked::tracked_allocator::out_of_memory_callback{});
    });
}

CUSTODY_EXPORT ssize_t custody_device_name(int device, char* buffer, size_t capacity) {
    try {
        if (device < 0 || device >= platform::device_count()) {
            throw std::invalid_argument("custody: no device " + std::to_string(device));
        }
        std::array<unsigned char, 16> uuid{};
#if defined(CUSTODY_TORCH_CUDA)
        cudaDeviceProp prop{};
        CUSTODY_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
        std::memcpy(uuid.data(), prop.uuid.bytes, uuid.size());
#else
        // A virtual device's identity: "host" and its number, in a UUID's shape.
        std::memcpy(uuid.data(), "host", 4);
        uuid[15] = static_cast<unsigned char>(device);
#endif
        set_error("");
        return static_cast<ssize_t>(copy_out(custody::interop::gpu_name(uuid), buffer, capacity));
    } catch (const std::exception& e) {
        return refuse(e.what());
    }
}

CUSTODY_EXPORT int custody_claim_device(const char* device_id, int rank, int device) {
    // The claims this process holds, kept until it exits.
    static std::mutex mutex;
    static auto* const claims = new std::vector<custody::interop::device_lock>;
    return checked([&] {
        if (device_id == nullptr || *device_id == '\0') throw std::invalid_argument("custody: empty device identity");
        custody::interop::device_lock lock = custody::interop::device_lock::claim(device_id, rank, device);
        std::lock_guard guard(mutex);
        claims->push_back(std::move(lock));
    });
}

CUSTODY_EXPORT int custody_record_stream(void* ptr, void* stream) {
    int device = 0;
    try {
        device = platform::stream_device(stream_of(stream));
    } catch (const std::exception& e) {
        return refuse(e.what());
    }
    return dispatch_known(device, [&](auto& a) { return a.record_stream(ptr, stream_of(stream)) ? 0 : -1; });
}

CUSTODY_EXPORT size_t custody_empty_cache(void) { return trim_devices(-1); }

CUSTODY_EXPORT int custody_begin_allocate_to_pool(int device, uint64_t pool_id_first, uint64_t pool_id_second,
                                                  void* stream) {
    if (stream == nullptr) {
        return refuse("custody: begin_allocate_to_pool on device " + std::to_string(device) +
                      " needs the stream about to be captured, not the default stream (no graph is captured on it)");
    }
    // Opened before the capture begins, on the stream about to be captured (the pool claims the
    // streams forked into its capture once it has begun).
    try {
        return dispatch(device, [&](auto& a) {
            return a.begin_allocate_to_pool(device, {pool_id_first, pool_id_second}, stream_of(stream)) ? 0 : -1;
        });
    } catch (const std::exception& e) { // the backing could not be decided (CUSTODY_BACKING)
        return refuse(e.what());
    }
}

CUSTODY_EXPORT int custody_end_allocate_to_pool(int device, uint64_t pool_id_first, uint64_t pool_id_second) {
    return dispatch_known(device, [&](auto& a) { return a.end_allocate_to_pool(device, {pool_id_first, pool_id_second}) ? 0 : -1; });
}

CUSTODY_EXPORT int custody_release_pool(int device, uint64_t pool_id_first, uint64_t pool_id_second) {
    return dispatch_known(device, [&](auto& a) { return a.release_pool(device, {pool_id_first, pool_id_second}) ? 0 : -1; });
}

CUSTODY_EXPORT size_t custody_trim(int device) { return trim_devices(device); }

CUSTODY_EXPORT size_t custody_report(char* buffer, size_t capacity) {
    std::string text;
    try {
        text = report_text();
    } catch (...) {
        text = "custody: the report could not be built\n";
    }
    return copy_out(text, buffer, capacity);
}

CUSTODY_EXPORT int custody_owner_push(const char* name) {
    return checked([&] {
        auto& stack = owner_stack();
        stack.reserve(stack.size() + 1); // so that push_back below cannot throw after the scope opened
        stack.push_back(std::make_unique<custody::debug::owner_scope>(name != nullptr ? name : ""));
    });
}

CUSTODY_EXPORT int custody_owner_pop(void) {
    auto& stack = owner_stack();
    if (stack.empty()) return refuse("custody: custody_owner_pop without an owner scope open on this thread");
    stack.pop_back();
    set_error("");
    return 0;
}

CUSTODY_EXPORT size_t custody_owner_current(char* buffer, size_t capacity) {
    return copy_out(std::string(custody::debug::owner_name(custody::debug::current_owner())), buffer, capacity);
}

CUSTODY_EXPORT ssize_t custody_report_json(int device, char* buffer, size_t capacity) {
    try {
        const std::string text =
            custody::debug::to_json(with_tracker(device, [](auto& tracker) { return tracker.make_report(); }));
        set_error("");
        return static_cast<ssize_t>(copy_out(text, buffer, capacity));
    } catch (const std::exception& e) {
        return refuse(e.what());
    }
}

CUSTODY_EXPORT int custody_sample(int device) {
    return checked([&] { with_tracker(device, [](auto& tracker) { tracker.sample(); }); });
}

CUSTODY_EXPORT int custody_write_report(int device, const char* path) {
    return checked([&] {
        if (path == nullptr || *path == '\0') throw std::invalid_argument("custody: empty report path");
        custody::debug::write_json_report(with_tracker(device, [](auto& tracker) { return tracker.make_report(); }), path);
    });
}

CUSTODY_EXPORT const char* custody_last_error(void) { return last_slot().get(); }

CUSTODY_EXPORT const char* custody_platform(void) { return custody_plugin::platform::name.data(); }

CUSTODY_EXPORT int custody_device_count(void) { return platform::device_count(); }

} // extern "C"
