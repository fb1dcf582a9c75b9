// The shared library behind PyTorch's CUDAPluggableAllocator: the allocation, free, record_stream,
// empty_cache and graph-capture entry points of custody_torch_allocator.h, with statistics,
// options, tracking by owner and the GPU claim, over one custody pool per device. Built twice: over
// CUDA devices (CUSTODY_TORCH_CUDA), and over the host platform's virtual devices so that the C
// interface is tested without a GPU.
#include "custody_torch_allocator.h"

#include <custody/debug/json_report.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/interop/device_lock.hpp>
#include <custody/interop/pluggable_allocator.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/recorded_streams.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
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

namespace {

#if defined(CUSTODY_TORCH_CUDA)
using platform = custody::cuda::platform;
using upstream = custody::resource::cuda_async;
#else
using platform = custody::host::platform;
using upstream = custody::host::simulated_device_memory;
#endif

/// The per-device resources: custody's stream-ordered pool over the device's memory, holding blocks
/// recorded on other streams until their work is done (PyTorch's record_stream); with tracking on,
/// the tracking resource between the two (owners, snapshots, per-rank reports).
using pool_type = custody::pool::stream_ordered_pool<upstream>;
using plain_resource = custody::resource::recorded_streams<pool_type>;
using tracked_resource = custody::resource::recorded_streams<custody::debug::tracking_resource<pool_type>>;
using plain_allocator = custody::interop::pluggable_allocator<plain_resource>;
using tracked_allocator = custody::interop::pluggable_allocator<tracked_resource>;

/// The pool under either resource.
pool_type& pool_of(plain_resource& r) noexcept { return r.upstream(); }
pool_type& pool_of(tracked_resource& r) noexcept { return r.upstream().upstream(); }

/// CUSTODY_TORCH_MAX_BYTES caps each device's memory (0 or unset: no cap beyond the device's).
std::size_t max_bytes() {
    const char* text = std::getenv("CUSTODY_TORCH_MAX_BYTES"); // NOLINT(concurrency-mt-unsafe)
    if (text == nullptr || *text == '\0') return 0;
    return static_cast<std::size_t>(std::strtoull(text, nullptr, 10));
}

/// What custody_configure set for the pools made afterwards (0 / SIZE_MAX: not set).
std::atomic<std::size_t> configured_max_bytes{0};
std::atomic<std::size_t> configured_headroom{SIZE_MAX};
/// Whether the tracked allocator serves (custody_configure("tracking", 1)); fixed once pools exist.
std::atomic<bool> tracking_on{false};
/// Set once the first pool is being made: custody_configure refuses from then on.
std::atomic<bool> pools_made{false};

/// The pool options for every device: the defaults (see docs/pool.md), capped by
/// custody_configure's max_bytes or else CUSTODY_TORCH_MAX_BYTES. The pool keeps the device's
/// headroom free, asking the platform for the device's free memory at each growth (the host
/// platform cannot tell: its virtual devices are as large as the cap).
custody::pool::pool_options device_pool_options() {
    pools_made.store(true);
    custody::pool::pool_options options;
    const std::size_t configured = configured_max_bytes.load();
    const std::size_t cap = configured != 0 ? configured : max_bytes();
    if (cap != 0) options.maximum_size = cap;
    if (const std::size_t headroom = configured_headroom.load(); headroom != SIZE_MAX) options.device_headroom = headroom;
    options.memory_info = &platform::memory_info;
    return options;
}

/// The tracker's options under PyTorch: no guard bytes nor poison (device memory, written on the
/// streams PyTorch owns), violations logged rather than thrown into PyTorch, rank from the
/// launcher's environment (torchrun's RANK, LOCAL_RANK, WORLD_SIZE).
custody::debug::tracking_options tracker_options() {
    custody::debug::tracking_options o;
    o.name = "torch";
    o.canaries = false;
    o.poison = false;
    o.on_violation = custody::debug::policy::log;
    o.release_leaks = false;
    return o;
}

template <class Resource>
std::unique_ptr<Resource> make_resource(int device) {
    const custody::pool::pool_options options = device_pool_options();
#if defined(CUSTODY_TORCH_CUDA)
    const auto make = [&](auto&&... tracker) {
        return std::make_unique<Resource>(tracker..., options, device);
    };
#else
    // The virtual device is as large as the cap, so the cap is all the pool may hold: no headroom
    // beside it unless one was configured.
    const std::size_t capacity = options.maximum_size != SIZE_MAX ? options.maximum_size : std::size_t{8} << 30;
    custody::pool::pool_options host_options = options;
    if (configured_headroom.load() == SIZE_MAX) host_options.device_headroom = 0;
    const auto make = [&](auto&&... tracker) {
        return std::make_unique<Resource>(tracker..., host_options, device, capacity);
    };
#endif
    if constexpr (std::is_same_v<Resource, tracked_resource>) {
        return make(tracker_options());
    } else {
        return make();
    }
}

/// The process's allocators. Never destroyed: PyTorch may free blocks while static objects are
/// being destroyed at exit, and custody never calls CUDA while the process is exiting.
plain_allocator& plain() {
    static plain_allocator* const the = new plain_allocator(platform::device_count(), &make_resource<plain_resource>);
    return *the;
}
tracked_allocator& tracked() {
    static tracked_allocator* const the =
        new tracked_allocator(platform::device_count(), &make_resource<tracked_resource>);
    return *the;
}

/// Calls `f` with the allocator in service.
template <class F>
decltype(auto) dispatch(F&& f) {
    if (tracking_on.load(std::memory_order_relaxed)) return std::forward<F>(f)(tracked());
    return std::forward<F>(f)(plain());
}

/// Sets this thread's last error, as the allocator in service reports it.
void set_error(std::string message) noexcept {
    if (tracking_on.load(std::memory_order_relaxed)) {
        tracked_allocator::set_last_error(std::move(message));
    } else {
        plain_allocator::set_last_error(std::move(message));
    }
}

platform::stream_view stream_of(void* stream) noexcept {
#if defined(CUSTODY_TORCH_CUDA)
    return platform::stream_view(static_cast<cudaStream_t>(stream));
#else
    return platform::stream_view(static_cast<custody::host::detail::stream_state*>(stream));
#endif
}

/// Sets this thread's last error and returns -1.
int refuse(std::string why) noexcept {
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

/// The tracker of `device` (-1: the first device in use); throws when tracking is off or the
/// device has allocated nothing yet.
custody::debug::tracking_resource<pool_type>& tracker_of(int device) {
    if (!tracking_on.load()) {
        throw std::logic_error("custody: tracking is off; turn it on before the first allocation "
                               "(custody_configure(\"tracking\", 1), custody.torch.enable(tracking=True))");
    }
    if (device == -1) {
        for (int d = 0; d < tracked().device_count(); ++d) {
            if (tracked().find(d) != nullptr) return tracked().find(d)->upstream();
        }
        throw std::logic_error("custody: no device has allocated through custody yet");
    }
    tracked_resource* r = tracked().find(device);
    if (r == nullptr) throw std::invalid_argument("custody: device " + std::to_string(device) + " has allocated nothing yet");
    return r->upstream();
}

/// Copies `text` into `buffer` (NUL-terminated, truncated to capacity); returns text's length.
size_t copy_out(const std::string& text, char* buffer, size_t capacity) noexcept {
    if (buffer != nullptr && capacity > 0) {
        const std::size_t n = std::min(text.size(), capacity - 1);
        std::memcpy(buffer, text.data(), n);
        buffer[n] = '\0';
    }
    return text.size();
}

/// The owner scopes this thread opened through custody_owner_push, innermost last.
std::vector<std::unique_ptr<custody::debug::owner_scope>>& owner_stack() {
    thread_local std::vector<std::unique_ptr<custody::debug::owner_scope>> stack;
    return stack;
}

/// Hands what the pool gave back to its upstream over to the device: cudaMallocAsync's pool keeps
/// freed memory (custody's cuda_async sets no release threshold), so it is trimmed once the pool's
/// frees, on the default stream, have run. Nothing to do over the host build's virtual devices.
void return_to_device([[maybe_unused]] pool_type& pool) {
#if defined(CUSTODY_TORCH_CUDA)
    CUSTODY_CUDA_TRY(cudaStreamSynchronize(nullptr));
    CUSTODY_CUDA_TRY(cudaMemPoolTrimTo(pool.upstream().pool_handle(), 0));
#endif
}

/// Gives back held blocks and cached memory of `device` (-1: every device), to the device itself;
/// the bytes the pools gave back.
template <class Allocator>
std::size_t trim_devices(Allocator& a, int device) noexcept {
    std::size_t released = 0;
    const int first = device == -1 ? 0 : device;
    const int last = device == -1 ? a.device_count() : device + 1;
    for (int d = first; d < last; ++d) {
        auto* r = a.find(d);
        if (r == nullptr) continue;
        custody::basic_device_guard<platform> guard(d, std::nothrow); // frees on d's default stream
        r->release_held();
        try {
            released += pool_of(*r).trim();
            return_to_device(pool_of(*r));
        } catch (const std::exception& e) {
            set_error(e.what());
        }
    }
    return released;
}

} // namespace

extern "C" {

#define CUSTODY_EXPORT __attribute__((visibility("default")))

CUSTODY_EXPORT void* custody_alloc(ssize_t size, int device, void* stream) {
    return dispatch([&](auto& a) { return a.alloc(size, device, stream_of(stream)); });
}

CUSTODY_EXPORT void* custody_torch_malloc(ssize_t size, int device, void* stream) {
    return dispatch([&](auto& a) { return a.allocate(size, device, stream_of(stream)); });
}

CUSTODY_EXPORT void custody_free(void* ptr, ssize_t size, int device, void* stream) {
    dispatch([&](auto& a) { a.free(ptr, size, device, stream_of(stream)); });
}

CUSTODY_EXPORT int custody_stats(int device, custody_torch_stats* out) {
    return dispatch([&](auto& a) {
        if (out == nullptr || device < 0 || device >= a.device_count()) return -1;
        *out = custody_torch_stats{};
        auto* r = a.find(device);
        if (r == nullptr) return 0;
        const custody::resource_statistics s = pool_of(*r).statistics();
        *out = custody_torch_stats{s.live_bytes,     s.peak_live_bytes,           s.reserved_bytes,
                                   s.peak_reserved_bytes, s.live_allocations,    s.allocations,
                                   s.deallocations,  a.out_of_memory_count(device), r->held_bytes()};
        return 0;
    });
}

CUSTODY_EXPORT int custody_configure(const char* name, uint64_t value) {
    const std::string key = name != nullptr ? name : "";
    if (key != "max_bytes" && key != "device_headroom" && key != "tracking") {
        return refuse("custody: unknown option '" + key + "' (known: max_bytes, device_headroom, tracking)");
    }
    if (pools_made.load()) {
        return refuse("custody: option '" + key + "' set after the first allocation; set options before it");
    }
    if (key == "tracking") {
        tracking_on.store(value != 0);
    } else {
        (key == "max_bytes" ? configured_max_bytes : configured_headroom).store(static_cast<std::size_t>(value));
    }
    set_error("");
    return 0;
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
    return dispatch([&](auto& a) { return a.record_stream(ptr, stream_of(stream)) ? 0 : -1; });
}

CUSTODY_EXPORT size_t custody_empty_cache(void) {
    return dispatch([](auto& a) { return trim_devices(a, -1); });
}

CUSTODY_EXPORT int custody_begin_allocate_to_pool(int device, uint64_t pool_id_first, uint64_t pool_id_second,
                                                  void* stream) {
    const platform::stream_view capturing = stream_of(stream);
    custody::capture_info info;
    try {
        info = platform::query_capture(capturing);
    } catch (const std::exception& e) {
        return refuse(e.what());
    }
    if (!info.capturing()) {
        return refuse("custody: begin_allocate_to_pool on device " + std::to_string(device) +
                      ": the stream is not capturing a graph (begin the capture first)");
    }
    // PyTorch's filter: the streams of this capture, whatever stream it forks onto.
    const std::uint64_t capture = info.id;
    const auto in_capture = [capture](platform::stream_view s) {
        const custody::capture_info i = platform::query_capture(s);
        return i.capturing() && i.id == capture;
    };
    return dispatch([&](auto& a) {
        return a.begin_allocate_to_pool(device, {pool_id_first, pool_id_second}, in_capture) ? 0 : -1;
    });
}

CUSTODY_EXPORT int custody_end_allocate_to_pool(int device, uint64_t pool_id_first, uint64_t pool_id_second) {
    return dispatch([&](auto& a) { return a.end_allocate_to_pool(device, {pool_id_first, pool_id_second}) ? 0 : -1; });
}

CUSTODY_EXPORT int custody_release_pool(int device, uint64_t pool_id_first, uint64_t pool_id_second) {
    return dispatch([&](auto& a) { return a.release_pool(device, {pool_id_first, pool_id_second}) ? 0 : -1; });
}

CUSTODY_EXPORT size_t custody_trim(int device) {
    return dispatch([&](auto& a) { return trim_devices(a, device); });
}

CUSTODY_EXPORT size_t custody_report(char* buffer, size_t capacity) {
    std::string text;
    try {
        text = dispatch([](auto& a) { return a.report(); });
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
        const std::string text = custody::debug::to_json(tracker_of(device).make_report());
        set_error("");
        return static_cast<ssize_t>(copy_out(text, buffer, capacity));
    } catch (const std::exception& e) {
        return refuse(e.what());
    }
}

CUSTODY_EXPORT int custody_write_report(int device, const char* path) {
    return checked([&] {
        if (path == nullptr || *path == '\0') throw std::invalid_argument("custody: empty report path");
        custody::debug::write_json_report(tracker_of(device).make_report(), path);
    });
}

CUSTODY_EXPORT const char* custody_last_error(void) {
    return dispatch([](auto& a) { return a.last_error(); });
}

CUSTODY_EXPORT const char* custody_platform(void) { return platform::name.data(); }

CUSTODY_EXPORT int custody_device_count(void) {
    return dispatch([](auto& a) { return a.device_count(); });
}

} // extern "C"
