/// @file
/// The platform surface: the operations on devices, streams and events that every strategy is
/// written against once, and that both platforms (`cuda::platform`, `host::platform`) provide.
///
/// A platform P provides:
///
///   P::stream_view          non-owning, trivially copyable, equality-comparable stream handle;
///                           value-initialized it names the platform's default stream
///   P::stream               owning, move-only stream bound to one device; `.view()`
///   P::event                owning, move-only completion marker created on one device
///   P::name                 "cuda" or "host"
///   P::device_count()       number of devices
///   P::current_device()     this thread's current device
///   P::set_device(d)        makes d this thread's current device (throws if it cannot)
///   P::set_device_noexcept(d)   the same for destructors: reports a failure instead of throwing
///   P::device_active(d)     (optional) d is set up in this process already: making it current
///                           costs no new context (the cuda platform: d's primary context is
///                           active). Without it, every device counts as set up.
///   P::stream_key(s)        an integer that identifies s for the process's lifetime: a stream
///                           made after s is destroyed never has s's key (per-stream maps)
///   P::stream_device(s)     the device s belongs to
///   P::synchronize(s)       blocks until all work enqueued on s so far has finished
///   P::synchronize_device(d)  blocks until all work enqueued so far on every stream of device d
///                           (streams destroyed with work pending included) has finished
///   P::wait(s, e)           work enqueued on s after this call waits for e, without blocking the host
///   P::memory_info(d)       free and total memory of device d now (a device_memory), or nothing
///                           when the platform cannot tell; never throws
///   P::memcpy_async(dst, src, n, s), P::memset_async(dst, v, n, s)
///   P::is_exiting(e)        the exception e says the process is exiting (the CUDA runtime
///                           unloading): a failure a destructor has no need to report
///
///   graph capture (platform/capture.hpp has the vocabulary and the rules):
///   P::graph                owning, move-only executable graph; `.node_count()`
///   P::begin_capture(s, m)  work enqueued on s is recorded into a graph, not run (capture_mode m)
///   P::end_capture(s)       ends the capture begun on s and returns its graph (throws if invalidated)
///   P::launch(g, s)         enqueues one replay of g on s
///   P::query_capture(s)     s's capture_info (status, the capture's id) in one query
///   P::is_capturing(s)      query_capture(s).capturing()
///   P::exchange_capture_mode(m)  sets the calling thread's capture_mode, returns the previous one
///   P::exchange_capture_mode_noexcept(m)   the same for destructors
///
///   event e(device)         created on `device`
///   e.record(s)             e completes when all work enqueued on s before this call has finished
///   e.ready()               e has completed (non-blocking query)
///   e.synchronize()         blocks until e has completed
///
/// The `platform` concept below checks the shape; docs/platform.md explains the semantics.
/// run_exit_tolerant<P> is how every noexcept path (a destructor, a deallocate) runs a platform
/// operation that may fail; order_after<P>(first, then) orders one stream after another's work.
#pragma once

#include <custody/core/failure_callback.hpp>
#include <custody/platform/capture.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

namespace custody {

/// What a device has, as its platform reports it (P::memory_info).
struct device_memory {
    std::size_t free = 0;  ///< bytes no one has allocated yet
    std::size_t total = 0; ///< bytes the device has
};

template <class P>
concept platform = requires(typename P::stream_view s, typename P::event& e, const typename P::event& ce,
                            typename P::graph& g, capture_mode mode, int device, void* dst, const void* src,
                            std::size_t bytes, const std::exception& ex) {
    requires std::is_trivially_copyable_v<typename P::stream_view>;
    requires std::equality_comparable<typename P::stream_view>;
    requires std::movable<typename P::stream> && !std::copyable<typename P::stream>;
    requires std::movable<typename P::event> && !std::copyable<typename P::event>;
    requires std::constructible_from<typename P::event, int>;
    { P::name } -> std::convertible_to<std::string_view>;
    { P::device_count() } -> std::same_as<int>;
    { P::current_device() } -> std::same_as<int>;
    P::set_device(device);
    P::set_device_noexcept(device);
    { P::stream_key(s) } -> std::same_as<std::uintptr_t>;
    { P::stream_device(s) } -> std::same_as<int>;
    P::synchronize(s);
    P::synchronize_device(device);
    P::wait(s, ce);
    requires std::movable<typename P::graph> && !std::copyable<typename P::graph>;
    { std::as_const(g).node_count() } -> std::same_as<std::size_t>;
    P::begin_capture(s, mode);
    { P::end_capture(s) } -> std::same_as<typename P::graph>;
    P::launch(std::as_const(g), s);
    { P::query_capture(s) } -> std::same_as<capture_info>;
    { P::is_capturing(s) } -> std::same_as<bool>;
    { P::exchange_capture_mode(mode) } -> std::same_as<capture_mode>;
    P::exchange_capture_mode_noexcept(mode);
    { P::memory_info(device) } noexcept -> std::same_as<std::optional<device_memory>>;
    P::memcpy_async(dst, src, bytes, s);
    P::memset_async(dst, 0, bytes, s);
    { P::is_exiting(ex) } noexcept -> std::same_as<bool>;
    e.record(s);
    { ce.ready() } -> std::same_as<bool>;
    ce.synchronize();
};

/// Runs `step`, a platform operation, on a path that must not throw (a destructor, a deallocate).
/// If it throws, the failure is reported through custody::report_failure as "`what` failed: <the
/// exception's message>", unless Platform::is_exiting says it is the process exiting (on the cuda
/// platform, the runtime unloading): then the driver reclaims everything and there is nothing to
/// report. Returns whether `step` ran to its end. Never throws.
template <class Platform, class Step>
bool run_exit_tolerant(std::string_view what, Step&& step) noexcept {
    // Reported inside the handler: e.what() lives only as long as the exception does.
    const auto report = [what](const char* message) noexcept {
        char line[512];
        const int n =
            std::snprintf(line, sizeof line, "%.*s failed: %s", static_cast<int>(what.size()), what.data(), message);
        const std::size_t written = n > 0 ? static_cast<std::size_t>(n) : 0U; // snprintf truncates at the end
        report_failure(std::string_view(line, written < sizeof line ? written : sizeof line - 1));
    };
    try {
        std::forward<Step>(step)();
        return true;
    } catch (const std::exception& e) {
        if (!Platform::is_exiting(e)) report(e.what());
    } catch (...) {
        report("an unknown exception");
    }
    return false;
}

/// Makes the work enqueued on `then` from now on wait for the work enqueued on `first` so far: an
/// event recorded on `first`, waited on by `then`, without blocking the host; nothing when they are
/// one stream. Creates an event, so it is for a one-time ordering (a buffer's first use on another
/// stream, a block freed on another stream than its users'), not for a hot loop.
template <class Platform>
void order_after(typename Platform::stream_view first, typename Platform::stream_view then) {
    if (first == then) return;
    typename Platform::event e(Platform::stream_device(first));
    e.record(first);
    Platform::wait(then, e);
}

/// Whether a scope that made another device current should make `previous` current again when it
/// ends: only when `previous` is set up already (Platform::device_active). A thread that never
/// chose a device reads device 0 as current without device 0 having a context; making it current
/// again would create one, on a multi-GPU node a stray context on GPU 0 that every rank pays for.
/// The thread is left on the device the scope chose instead, as PyTorch's device guards do
/// (c10::cuda::MaybeSetDevice). Ask before switching: switching to another device never sets
/// `previous` up. Never throws.
template <class Platform>
[[nodiscard]] bool worth_restoring(int previous) noexcept {
    if constexpr (requires { { Platform::device_active(previous) } noexcept -> std::convertible_to<bool>; }) {
        return Platform::device_active(previous);
    } else {
        return true;
    }
}

/// Makes a device current for a scope and restores the previous one on exit, on any platform,
/// when the previous one was set up (see worth_restoring: a thread that never chose a device is
/// not given one on exit). Not thread-safe by nature: the current device is per thread, and so is
/// a guard.
template <class Platform>
class basic_device_guard {
public:
    /// Makes `device` current; a negative device (memory that belongs to no device) changes nothing.
    explicit basic_device_guard(int device) : previous_(Platform::current_device()) {
        if (device >= 0 && device != previous_) {
            restore_ = worth_restoring<Platform>(previous_);
            Platform::set_device(device);
            switched_ = true;
        }
    }
    /// For destructors and deallocate: never throws; if `device` cannot be made current, the
    /// failure is reported and the caller's device stays current.
    basic_device_guard(int device, std::nothrow_t) noexcept : previous_(current_or_negative()) {
        if (device >= 0 && previous_ >= 0 && device != previous_) {
            restore_ = worth_restoring<Platform>(previous_);
            Platform::set_device_noexcept(device);
            switched_ = true;
        }
    }
    ~basic_device_guard() {
        if (switched_ && restore_) Platform::set_device_noexcept(previous_);
    }
    basic_device_guard(const basic_device_guard&) = delete;
    basic_device_guard& operator=(const basic_device_guard&) = delete;

private:
    static int current_or_negative() noexcept {
        try {
            return Platform::current_device();
        } catch (...) {
            return -1;
        }
    }

    int previous_;
    bool switched_ = false;
    bool restore_ = false; ///< previous_ was set up when the guard switched away from it
};

} // namespace custody
