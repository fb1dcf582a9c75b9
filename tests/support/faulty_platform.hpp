// A platform for tests that is the host platform with faults a test can arm: a stream's device
// query that throws (as cudaStreamGetDevice does on a destroyed stream), an event wait that throws,
// an asynchronous copy or fill that cannot be enqueued, and failures that read as the process
// exiting (as cudaErrorCudartUnloading does). With nothing
// armed it behaves exactly as host::platform. Plus `faulty_memory`, host memory on it.
#pragma once

#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/host.hpp>
#include <custody/platform/platform.hpp>
#include <custody/resource/detail/leaf.hpp>
#include <custody/resource/host_memory.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string_view>

namespace custody::test {

/// A failure of the faulty platform; `exiting` marks one that stands for the process exiting.
class platform_fault final : public custody::error {
public:
    platform_fault(const char* what, bool exiting) : error(what), exiting_(exiting) {}
    [[nodiscard]] bool exiting() const noexcept { return exiting_; }

private:
    bool exiting_;
};

/// What the faulty platform does wrong. Each count is a number of calls still to fail; every
/// failure throws platform_fault, marked as the process exiting while `exiting` is set.
/// Thread-safe (atomics); tests arm them and reset() them before they return.
struct platform_faults {
    static inline std::atomic<int> stream_device{0}; ///< faulty_platform::stream_device on a stream
    static inline std::atomic<int> event_synchronize{0};
    static inline std::atomic<int> stream_synchronize{0}; ///< faulty_platform::synchronize on a stream
    /// The n-th memcpy_async (memset_async) from now fails (0: none); counted down by every call.
    static inline std::atomic<int> copy_at{0};
    static inline std::atomic<int> fill_at{0};
    /// The n-th faulty_event::synchronize from now fails (0: none); counted down by every call.
    static inline std::atomic<int> event_wait_at{0};
    static inline std::atomic<bool> exiting{false};

    static void reset() noexcept {
        stream_device = 0;
        event_synchronize = 0;
        stream_synchronize = 0;
        copy_at = 0;
        fill_at = 0;
        event_wait_at = 0;
        exiting = false;
    }
    /// Takes one failure from `count` if any is left; then throws.
    static void fail_if_armed(std::atomic<int>& count, const char* what) {
        for (int n = count.load(); n > 0;) {
            if (count.compare_exchange_weak(n, n - 1)) throw platform_fault(what, exiting.load());
        }
    }
    /// Counts one call down on `at`; throws when it reaches the armed one.
    static void fail_at_call(std::atomic<int>& at, const char* what) {
        for (int n = at.load(); n > 0;) {
            if (at.compare_exchange_weak(n, n - 1)) {
                if (n == 1) throw platform_fault(what, exiting.load());
                return;
            }
        }
    }
};

/// Disarms the faulty platform when a test begins and when it ends, whatever happened.
struct faults_reset {
    faults_reset() { platform_faults::reset(); }
    ~faults_reset() { platform_faults::reset(); }
    faults_reset(const faults_reset&) = delete;
    faults_reset& operator=(const faults_reset&) = delete;
};

struct faulty_platform;

class faulty_stream_view {
public:
    using platform_type = faulty_platform;
    constexpr faulty_stream_view() noexcept = default;
    constexpr faulty_stream_view(host::stream_view view) noexcept : view_(view) {} // NOLINT: implicit by design
    [[nodiscard]] constexpr host::stream_view host_view() const noexcept { return view_; }
    friend constexpr bool operator==(faulty_stream_view, faulty_stream_view) noexcept = default;

private:
    host::stream_view view_;
};

class faulty_stream {
public:
    explicit faulty_stream(int device = host::platform::current_device()) : stream_(device) {}
    [[nodiscard]] faulty_stream_view view() const noexcept { return stream_.view(); }
    operator faulty_stream_view() const noexcept { return view(); } // NOLINT: usable as its view
    [[nodiscard]] int device() const noexcept { return stream_.device(); }

private:
    host::stream stream_;
};

class faulty_event {
public:
    explicit faulty_event(int device = host::platform::current_device()) : event_(device) {}
    void record(faulty_stream_view s) { event_.record(s.host_view()); }
    [[nodiscard]] bool ready() const noexcept { return event_.ready(); }
    void synchronize() const {
        platform_faults::fail_if_armed(platform_faults::event_synchronize, "faulty event: synchronize failed");
        platform_faults::fail_at_call(platform_faults::event_wait_at, "faulty event: synchronize failed");
        event_.synchronize();
    }
    [[nodiscard]] const host::event& host_event() const noexcept { return event_; }

private:
    host::event event_;
};

struct faulty_platform {
    using stream_view = faulty_stream_view;
    using stream = faulty_stream;
    using event = faulty_event;
    static constexpr std::string_view name = "faulty";

    [[nodiscard]] static int device_count() noexcept { return host::platform::device_count(); }
    [[nodiscard]] static int current_device() noexcept { return host::platform::current_device(); }
    static void set_device(int device) { host::platform::set_device(device); }
    static void set_device_noexcept(int device) noexcept { host::platform::set_device_noexcept(device); }
    [[nodiscard]] static std::uintptr_t stream_key(stream_view s) noexcept {
        return host::platform::stream_key(s.host_view());
    }
    [[nodiscard]] static int stream_device(stream_view s) {
        if (!s.host_view().is_default()) {
            platform_faults::fail_if_armed(platform_faults::stream_device, "faulty stream: device query failed");
        }
        return host::platform::stream_device(s.host_view());
    }
    static void synchronize(stream_view s) {
        if (!s.host_view().is_default()) {
            platform_faults::fail_if_armed(platform_faults::stream_synchronize, "faulty stream: synchronize failed");
        }
        host::platform::synchronize(s.host_view());
    }
    static void synchronize_device(int device) { host::platform::synchronize_device(device); }
    static void wait(stream_view s, const event& e) { host::platform::wait(s.host_view(), e.host_event()); }
    // Graph capture: the host platform's, unfaulted.
    using graph = host::graph;
    static void begin_capture(stream_view s, capture_mode mode) { host::platform::begin_capture(s.host_view(), mode); }
    static graph end_capture(stream_view s) { return host::platform::end_capture(s.host_view()); }
    static void launch(const graph& g, stream_view s) { host::platform::launch(g, s.host_view()); }
    [[nodiscard]] static capture_info query_capture(stream_view s) { return host::platform::query_capture(s.host_view()); }
    [[nodiscard]] static bool is_capturing(stream_view s) { return host::platform::is_capturing(s.host_view()); }
    static capture_mode exchange_capture_mode(capture_mode mode) noexcept { return host::platform::exchange_capture_mode(mode); }
    static void exchange_capture_mode_noexcept(capture_mode mode) noexcept {
        host::platform::exchange_capture_mode_noexcept(mode);
    }
    [[nodiscard]] static std::optional<device_memory> memory_info(int device) noexcept {
        return host::platform::memory_info(device);
    }
    [[nodiscard]] static bool is_exiting(const std::exception& e) noexcept {
        const auto* fault = dynamic_cast<const platform_fault*>(&e);
        return fault != nullptr && fault->exiting();
    }
    static void memcpy_async(void* dst, const void* src, std::size_t bytes, stream_view s) {
        platform_faults::fail_at_call(platform_faults::copy_at, "faulty stream: memcpy_async failed");
        host::platform::memcpy_async(dst, src, bytes, s.host_view());
    }
    static void memset_async(void* dst, int value, std::size_t bytes, stream_view s) {
        platform_faults::fail_at_call(platform_faults::fill_at, "faulty stream: memset_async failed");
        host::platform::memset_async(dst, value, bytes, s.host_view());
    }
};

static_assert(custody::platform<faulty_platform>);

/// host_memory, as memory of `device` on the faulty platform.
class faulty_memory final : public resource::detail::leaf<faulty_memory, faulty_platform> {
public:
    static constexpr const char* name = "faulty_memory";
    static constexpr std::size_t max_alignment = resource::host_memory::max_alignment;
    static constexpr bool interchangeable = false;

    explicit faulty_memory(int device = 0) noexcept : leaf(device) {}

    void* raw_allocate_sync(std::size_t bytes, std::size_t alignment) noexcept {
        return memory_.raw_allocate_sync(bytes, alignment);
    }
    void raw_deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        memory_.raw_deallocate_sync(ptr, bytes, alignment);
    }
    void* raw_allocate(stream_type s, std::size_t bytes, std::size_t alignment) noexcept {
        return memory_.raw_allocate(s.host_view(), bytes, alignment);
    }
    void raw_deallocate(stream_type s, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        memory_.raw_deallocate(s.host_view(), ptr, bytes, alignment);
    }

    friend void get_property(const faulty_memory&, device_accessible) noexcept {}
    friend void get_property(const faulty_memory&, host_accessible) noexcept {}

private:
    resource::host_memory memory_;
};

} // namespace custody::test
