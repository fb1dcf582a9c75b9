// The shared library behind PyTorch's CUDAPluggableAllocator: custody_alloc / custody_free and the
// statistics, trim and report functions of custody_torch_allocator.h, over one custody pool per
// device. Built twice: over CUDA devices (CUSTODY_TORCH_CUDA), and over the host platform's virtual
// devices so that the C interface is tested without a GPU.
#include "custody_torch_allocator.h"

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
#include <vector>

#if defined(CUSTODY_TORCH_CUDA)
#include <custody/platform/cuda.hpp>
#include <custody/pool/cuda_memory_info.hpp>
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

/// The per-device resource: custody's stream-ordered pool over the device's memory, holding blocks
/// recorded on other streams until their work is done (PyTorch's record_stream).
template <class Upstream>
using device_pool = custody::resource::recorded_streams<custody::pool::stream_ordered_pool<Upstream>>;

/// CUSTODY_TORCH_MAX_BYTES caps each device's memory (0 or unset: no cap beyond the device's).
std::size_t max_bytes() {
    const char* text = std::getenv("CUSTODY_TORCH_MAX_BYTES"); // NOLINT(concurrency-mt-unsafe)
    if (text == nullptr || *text == '\0') return 0;
    return static_cast<std::size_t>(std::strtoull(text, nullptr, 10));
}

/// What custody_configure set for the pools made afterwards (0 / SIZE_MAX: not set).
std::atomic<std::size_t> configured_max_bytes{0};
std::atomic<std::size_t> configured_headroom{SIZE_MAX};
/// Set once the first pool is being made: custody_configure refuses from then on.
std::atomic<bool> pools_made{false};

/// Makes `device`'s pool with the default options (see docs/pool.md), capped by custody_configure's
/// max_bytes or else CUSTODY_TORCH_MAX_BYTES. On CUDA the pool keeps the device's headroom free,
/// asking the device for its free memory at each growth; the host build's virtual devices are as
/// large as the cap.
std::unique_ptr<device_pool<upstream>> make_device_pool(int device) {
    pools_made.store(true);
    custody::pool::pool_options options;
    const std::size_t configured = configured_max_bytes.load();
    const std::size_t cap = configured != 0 ? configured : max_bytes();
    if (cap != 0) options.maximum_size = cap;
    if (const std::size_t headroom = configured_headroom.load(); headroom != SIZE_MAX) options.device_headroom = headroom;
#if defined(CUSTODY_TORCH_CUDA)
    options.memory_info = &custody::pool::cuda_memory_info;
    return std::make_unique<device_pool<upstream>>(options, device);
#else
    return std::make_unique<device_pool<upstream>>(options, device, cap != 0 ? cap : std::size_t{8} << 30);
#endif
}

using allocator = custody::interop::pluggable_allocator<device_pool<upstream>>;

/// The process's allocator. Never destroyed: PyTorch may free blocks while static objects are
/// being destroyed at exit, and custody never calls CUDA while the process is exiting.
allocator& instance() {
    static allocator* const the = new allocator(platform::device_count(), &make_device_pool);
    return *the;
}

platform::stream_view stream_of(void* stream) noexcept {
#if defined(CUSTODY_TORCH_CUDA)
    return platform::stream_view(static_cast<cudaStream_t>(stream));
#else
    return platform::stream_view(static_cast<custody::host::detail::stream_state*>(stream));
#endif
}

/// Why graph capture into a private pool is refused, for the capture hooks' callers.
constexpr const char* capture_refusal =
    "custody: CUDA graph capture into a private memory pool is not supported by this allocator yet; "
    "allocate the graph's memory before capture, or capture with PyTorch's own allocator";

/// Sets this thread's last error (through a call the allocator refuses) and returns -1.
int refuse(const char* why) noexcept {
    allocator::set_last_error(why);
    return -1;
}

} // namespace

extern "C" {

__attribute__((visibility("default"))) void* custody_alloc(ssize_t size, int device, void* stream) {
    return instance().alloc(size, device, stream_of(stream));
}

__attribute__((visibility("default"))) void* custody_torch_malloc(ssize_t size, int device, void* stream) {
    return instance().allocate(size, device, stream_of(stream));
}

__attribute__((visibility("default"))) void custody_free(void* ptr, ssize_t size, int device, void* stream) {
    instance().free(ptr, size, device, stream_of(stream));
}

__attribute__((visibility("default"))) int custody_stats(int device, custody_torch_stats* out) {
    if (out == nullptr || device < 0 || device >= instance().device_count()) return -1;
    const custody::resource_statistics s = instance().statistics(device);
    std::uint64_t held = 0;
    if (device_pool<upstream>* r = instance().find(device)) held = r->held_bytes();
    *out = custody_torch_stats{s.live_bytes,     s.peak_live_bytes, s.reserved_bytes,
                               s.peak_reserved_bytes, s.live_allocations, s.allocations,
                               s.deallocations,  instance().out_of_memory_count(device), held};
    return 0;
}

__attribute__((visibility("default"))) int custody_configure(const char* name, uint64_t value) {
    const std::string key = name != nullptr ? name : "";
    if (key != "max_bytes" && key != "device_headroom") {
        allocator::set_last_error("custody: unknown option '" + key + "' (known: max_bytes, device_headroom)");
        return -1;
    }
    if (pools_made.load()) {
        allocator::set_last_error("custody: option '" + key + "' set after the first allocation; set options before it");
        return -1;
    }
    (key == "max_bytes" ? configured_max_bytes : configured_headroom).store(static_cast<std::size_t>(value));
    allocator::set_last_error("");
    return 0;
}

__attribute__((visibility("default"))) int custody_claim_device(const char* device_id, int rank, int device) {
    // The claims this process holds, kept until it exits.
    static std::mutex mutex;
    static auto* const claims = new std::vector<custody::interop::device_lock>;
    try {
        if (device_id == nullptr || *device_id == '\0') throw std::invalid_argument("custody: empty device identity");
        custody::interop::device_lock lock = custody::interop::device_lock::claim(device_id, rank, device);
        std::lock_guard guard(mutex);
        claims->push_back(std::move(lock));
        allocator::set_last_error("");
        return 0;
    } catch (const std::exception& e) {
        allocator::set_last_error(e.what());
    } catch (...) {
        allocator::set_last_error("custody: unknown exception claiming a device");
    }
    return -1;
}

__attribute__((visibility("default"))) int custody_record_stream(void* ptr, void* stream) {
    return instance().record_stream(ptr, stream_of(stream)) ? 0 : -1;
}

__attribute__((visibility("default"))) size_t custody_empty_cache(void) { return instance().trim(-1); }

__attribute__((visibility("default"))) int custody_begin_allocate_to_pool(int, uint64_t, uint64_t) {
    return refuse(capture_refusal);
}
__attribute__((visibility("default"))) int custody_end_allocate_to_pool(int, uint64_t, uint64_t) {
    return refuse(capture_refusal);
}
__attribute__((visibility("default"))) int custody_release_pool(int, uint64_t, uint64_t) { return 0; }

__attribute__((visibility("default"))) size_t custody_trim(int device) { return instance().trim(device); }

__attribute__((visibility("default"))) size_t custody_report(char* buffer, size_t capacity) {
    std::string text;
    try {
        text = instance().report();
    } catch (...) {
        text = "custody: the report could not be built\n";
    }
    if (buffer != nullptr && capacity > 0) {
        const std::size_t n = std::min(text.size(), capacity - 1);
        std::memcpy(buffer, text.data(), n);
        buffer[n] = '\0';
    }
    return text.size();
}

__attribute__((visibility("default"))) const char* custody_last_error(void) { return allocator::last_error(); }

__attribute__((visibility("default"))) const char* custody_platform(void) { return platform::name.data(); }

__attribute__((visibility("default"))) int custody_device_count(void) { return instance().device_count(); }

} // extern "C"
