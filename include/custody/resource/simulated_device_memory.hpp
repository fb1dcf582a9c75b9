/// @file
/// `host::simulated_device_memory`: the host platform's stand-in for a GPU's memory: the memory of
/// one of its virtual devices, with a capacity. (Not CUDA virtual memory management.)
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/host.hpp>
#include <custody/resource/detail/leaf.hpp>

#include <gsl/assert>

#include <atomic>
#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

namespace custody::host {

/// The memory of virtual device `device` of the host platform, limited to `capacity` bytes, the way
/// a GPU's memory is limited. Lets exhaustion, per-device binding and stream-ordered frees be
/// tested for real without a GPU.
///
/// Device binding: every call runs with the resource's device current (a device guard), whatever
/// device the calling thread has current, and restores the caller's device.
/// Stream semantics: allocate returns memory usable at once by work on any stream; deallocate on a
/// stream enqueues the free on that stream; its capacity comes back when the free has run, as with
/// cudaFreeAsync.
/// Capture: allocating is a potentially unsafe call, as cudaMalloc is (see custody::capture_mode).
/// Thread safety: thread-safe (capacity kept with atomics). Maximum alignment: 4096.
/// Equality: identity (each instance accounts its own capacity).
class simulated_device_memory final : public resource::detail::leaf<simulated_device_memory, host::platform> {
public:
    static constexpr const char* name = "simulated_device_memory";
    static constexpr std::size_t max_alignment = custody::max_alignment;
    static constexpr bool interchangeable = false;

    /// Memory of `device` (by default the calling thread's current device), `capacity` bytes.
    explicit simulated_device_memory(int device = host::platform::current_device(),
                                   std::size_t capacity = std::size_t{8} << 30)
        : leaf(device), capacity_(capacity) {
        if (device < 0 || device >= host::platform::device_count()) {
            throw std::invalid_argument("custody: host device " + std::to_string(device) + " does not exist");
        }
    }

    simulated_device_memory(const simulated_device_memory&) = delete;
    simulated_device_memory& operator=(const simulated_device_memory&) = delete;

    /// Waits for frees still pending on streams, which refer to this resource.
    ~simulated_device_memory() {
        for (std::size_t n = pending_.load(); n != 0; n = pending_.load()) pending_.wait(n);
    }

    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    /// The device's size, as a pool over this resource asks it (pool_options::device_capacity):
    /// the capacity, said once, here.
    [[nodiscard]] std::size_t device_capacity() const noexcept { return capacity_; }
    /// Bytes taken from the capacity, including frees still pending on a stream.
    [[nodiscard]] std::size_t used() const noexcept { return used_.load(std::memory_order_acquire); }
    /// The device that was current inside the last call that allocated (for device-binding tests).
    [[nodiscard]] int device_seen_by_last_allocation() const noexcept { return seen_.load(); }

    /// Like cudaMalloc, a potentially unsafe call while a graph capture is open: throws
    /// capture_violation (and invalidates the capture) when the capture modes prohibit it.
    void* raw_allocate_sync(std::size_t bytes, std::size_t alignment) {
        host::platform::check_unsafe_call("simulated_device_memory allocation");
        host::device_guard guard(device());
        seen_.store(host::platform::current_device());
        std::size_t used = used_.load(std::memory_order_relaxed);
        do {
            if (bytes > capacity_ - used) return nullptr;
        } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_acq_rel));
        void* ptr = ::operator new(bytes, std::align_val_t{alignment}, std::nothrow);
        if (ptr == nullptr) used_.fetch_sub(bytes, std::memory_order_acq_rel);
        return ptr;
    }
    void raw_deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        ::operator delete(ptr, std::align_val_t{alignment});
        used_.fetch_sub(bytes, std::memory_order_acq_rel);
    }
    void* raw_allocate(stream_type, std::size_t bytes, std::size_t alignment) {
        return raw_allocate_sync(bytes, alignment);
    }
    void raw_deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        pending_.fetch_add(1);
        free_after_stream(stream, [this, ptr, bytes, alignment] {
            raw_deallocate_sync(ptr, bytes, alignment);
            pending_.fetch_sub(1);
            pending_.notify_all();
        });
    }

    friend void get_property(const simulated_device_memory&, device_accessible) noexcept {}

private:
    std::size_t capacity_;
    std::atomic<std::size_t> used_{0};   // used_ <= capacity_
    std::atomic<int> seen_{-1};
    std::atomic<std::size_t> pending_{0}; // frees enqueued on streams and not yet run
};

static_assert(try_allocatable_resource<simulated_device_memory>);
static_assert(has_property<simulated_device_memory, device_accessible>);

} // namespace custody::host
