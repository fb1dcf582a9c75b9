// The sleepable memory of the allocator library: the entry points of custody_sleep.h over one
// custody::sleep::sleepable_memory per device. Built into both libraries: over CUDA devices
// (CUSTODY_TORCH_CUDA: cuda::vmm, offload to pinned memory) and over the host platform's virtual
// devices (host::vmm, offload to host memory), so that the C interface is tested without a GPU.
// The host memory of the offload comes from a pool over it, kept from one sleep to the next
// (pinning fresh memory at each sleep would cost more than the copy: docs/sleep.md) until
// custody_sleep_release_host gives it back.
#include "custody_sleep.h"
#include "plugin_state.hpp"

#include <custody/core/error.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/interop/pluggable_allocator.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/sleep/sleepable_memory.hpp>

#include <cstddef>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#if defined(CUSTODY_TORCH_CUDA)
#include <custody/platform/cuda.hpp>
#include <custody/platform/cuda_vmm.hpp>
#include <custody/resource/pinned_host.hpp>
#else
#include <custody/platform/host.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/resource/host_memory.hpp>
#endif

namespace {

using custody_plugin::platform;
using custody_plugin::stream_of; // PyTorch's streams as the whole library reads them

#if defined(CUSTODY_TORCH_CUDA)
using memory_type = custody::sleep::sleepable_memory<custody::cuda::vmm,
                                                     custody::pool::stream_ordered_pool<custody::resource::pinned_host>>;
#else
using memory_type = custody::sleep::sleepable_memory<custody::host::vmm,
                                                     custody::pool::stream_ordered_pool<custody::resource::host_memory>>;
#endif
using allocator_type = custody::interop::pluggable_allocator<memory_type>;

/// The process's sleepable memory, one resource per device, made on first use. Never destroyed:
/// PyTorch may free blocks while static objects are being destroyed at exit.
allocator_type& sleeper() {
    static allocator_type* const the = new allocator_type(platform::device_count(), [](int device) {
        custody::basic_device_guard<platform> guard(device);
        return std::make_unique<memory_type>(device);
    });
    return *the;
}

/// Runs `f` and returns CUSTODY_SLEEP_OK, or the status of the exception it threw (its message is
/// this thread's last error).
template <class F>
int status_of(F&& f) noexcept {
    try {
        f();
        allocator_type::set_last_error("");
        return CUSTODY_SLEEP_OK;
    } catch (const custody::sleep::sleep_error& e) {
        allocator_type::set_last_error(e.what());
        switch (e.why()) {
        case custody::sleep::sleep_error::reason::owner_asleep: return CUSTODY_SLEEP_OWNER_ASLEEP;
        case custody::sleep::sleep_error::reason::owner_awake: return CUSTODY_SLEEP_OWNER_AWAKE;
        case custody::sleep::sleep_error::reason::capture_open: return CUSTODY_SLEEP_CAPTURE_OPEN;
        }
        return CUSTODY_SLEEP_FAILED;
    } catch (const std::bad_alloc& e) {
        allocator_type::set_last_error(e.what());
        return CUSTODY_SLEEP_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
        allocator_type::set_last_error(e.what());
        return CUSTODY_SLEEP_FAILED;
    } catch (...) {
        allocator_type::set_last_error("custody: unknown exception");
        return CUSTODY_SLEEP_FAILED;
    }
}

std::vector<std::string_view> names(const char* const* owners, int count) {
    if (count < 0 || (count > 0 && owners == nullptr)) throw std::invalid_argument("custody: no owners given");
    std::vector<std::string_view> list;
    for (int i = 0; i < count; ++i) {
        if (owners[i] == nullptr) throw std::invalid_argument("custody: a null owner name");
        list.emplace_back(owners[i]);
    }
    return list;
}

} // namespace

extern "C" {

#define CUSTODY_EXPORT __attribute__((visibility("default")))

CUSTODY_EXPORT void* custody_sleep_malloc(ssize_t size, int device, void* stream) {
    return sleeper().allocate(size, device, stream_of(stream));
}

CUSTODY_EXPORT void* custody_sleep_alloc(ssize_t size, int device, void* stream) {
    return sleeper().alloc(size, device, stream_of(stream));
}

CUSTODY_EXPORT void custody_sleep_free(void* ptr, ssize_t size, int device, void* stream) {
    sleeper().free(ptr, size, device, stream_of(stream));
}

CUSTODY_EXPORT int custody_sleep(int device, const char* const* owners, const int* offload, int count,
                                 void* const* streams, int stream_count) {
    return status_of([&] {
        const std::vector<std::string_view> list = names(owners, count);
        if (count > 0 && offload == nullptr) throw std::invalid_argument("custody: no policies given");
        if (stream_count < 0 || (stream_count > 0 && streams == nullptr)) throw std::invalid_argument("custody: no streams given");
        std::vector<custody::sleep::owner_sleep> request;
        for (int i = 0; i < count; ++i) {
            request.push_back({list[static_cast<std::size_t>(i)],
                               offload[i] != 0 ? custody::sleep::sleep_policy::offload : custody::sleep::sleep_policy::discard});
        }
        std::vector<platform::stream_view> after;
        for (int i = 0; i < stream_count; ++i) after.push_back(stream_of(streams[i]));
        memory_type& memory = sleeper().resource(device);
        custody::basic_device_guard<platform> guard(device);
        memory.sleep(request, after);
    });
}

CUSTODY_EXPORT int custody_wake(int device, const char* const* owners, int count) {
    return status_of([&] {
        const std::vector<std::string_view> list = names(owners, count);
        memory_type& memory = sleeper().resource(device);
        custody::basic_device_guard<platform> guard(device);
        memory.wake(list);
    });
}

CUSTODY_EXPORT int custody_sleep_stats_of(int device, custody_sleep_stats* out) {
    return status_of([&] {
        if (out == nullptr || device < 0 || device >= sleeper().device_count()) {
            throw std::invalid_argument("custody: no device " + std::to_string(device));
        }
        *out = custody_sleep_stats{};
        const memory_type* memory = sleeper().find(device);
        if (memory == nullptr) return;
        const custody::resource_statistics s = memory->statistics();
        const custody::sleep::sleep_statistics d = memory->detailed_statistics();
        *out = custody_sleep_stats{s.live_bytes,   s.live_allocations,  d.awake_bytes, d.asleep_bytes,
                                   d.mapped_bytes, d.offloaded_bytes,   d.stuck_bytes, d.sleeping_owners,
                                   d.sleeps,       d.wakes,             d.released_bytes};
    });
}

CUSTODY_EXPORT int custody_sleep_owner_stats_of(int device, const char* owner, custody_sleep_owner_stats* out) {
    return status_of([&] {
        if (out == nullptr || owner == nullptr || device < 0 || device >= sleeper().device_count()) {
            throw std::invalid_argument("custody: no device " + std::to_string(device) + " or no owner");
        }
        *out = custody_sleep_owner_stats{};
        const memory_type* memory = sleeper().find(device);
        if (memory == nullptr) return;
        const custody::sleep::owner_memory m = memory->owner_statistics(owner);
        *out = custody_sleep_owner_stats{m.blocks, m.bytes, m.mapped_bytes, m.offloaded_bytes, m.asleep ? 1 : 0,
                                         m.policy == custody::sleep::sleep_policy::offload ? 1 : 0};
    });
}

CUSTODY_EXPORT size_t custody_sleep_release_host(int device) {
    std::size_t released = 0;
    const int first = device == -1 ? 0 : device;
    const int last = device == -1 ? sleeper().device_count() : device + 1;
    for (int d = first; d < last; ++d) {
        memory_type* memory = sleeper().find(d);
        if (memory == nullptr) continue;
        try {
            released += memory->backing().trim();
        } catch (const std::exception& e) {
            allocator_type::set_last_error(e.what());
        }
    }
    return released;
}

CUSTODY_EXPORT const char* custody_sleep_last_error(void) { return allocator_type::last_error(); }

} // extern "C"
