/// @file
/// The host platform: streams that are real in-order worker threads, events that are their
/// completion marks, and virtual devices, with the same surface as the cuda platform
/// (platform/platform.hpp). It lets stream ordering, cross-stream reuse, back-pressure and races be
/// exercised for real on a machine without a GPU.
///
/// Devices: the host platform has `device_count()` virtual devices (8 unless set_device_count says
/// otherwise). The current device is per thread, as in CUDA; a stream's worker thread runs with
/// its stream's device current. Memory is ordinary host memory whatever the device.
///
/// Streams: work enqueued on a stream runs on its worker thread in order. The default stream
/// (a value-initialized stream_view) runs work at once in the calling thread.
///
/// Capture: a stream in capture (platform::begin_capture) records the work enqueued on it into a
/// graph instead of running it, under CUDA's rules (platform/capture.hpp): synchronizing a
/// capturing stream, querying an event recorded in a capture, waiting from a capturing stream on an
/// event recorded outside it, and potentially unsafe calls (event queries and synchronizations,
/// allocations from virtual device memory: platform::check_unsafe_call) prohibited by the capture
/// modes throw capture_violation and invalidate the capture as CUDA does. The default stream cannot
/// capture and is never part of a capture (host streams do not synchronize with it implicitly).
#pragma once

#include <custody/core/detail/mutex.hpp>
#include <custody/platform/capture.hpp>
#include <custody/platform/detail/host_capture.hpp>
#include <custody/platform/detail/host_streams.hpp>
#include <custody/platform/platform.hpp>

#include <gsl/assert>

#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace custody::host {

/// Sets the number of virtual devices. For tests and examples that model several GPUs.
inline void set_device_count(int count) {
    if (count < 1) throw std::invalid_argument("custody: host device count must be at least 1");
    detail::device_count_slot().store(count);
}

class event;
struct platform;

/// A non-owning handle to a host stream. Value-initialized, it names the default stream, which
/// runs work at once in the calling thread. Trivially copyable; valid while its stream lives.
class stream_view {
public:
    using platform_type = host::platform;

    constexpr stream_view() noexcept = default;
    explicit constexpr stream_view(detail::stream_state* state) noexcept : state_(state) {}

    [[nodiscard]] constexpr detail::stream_state* state() const noexcept { return state_; }
    [[nodiscard]] constexpr bool is_default() const noexcept { return state_ == nullptr; }

    /// Enqueues `task` to run after all work enqueued before it (the host platform's kernel launch).
    template <class F>
    void enqueue(F&& task) const {
        if (state_ == nullptr) {
            std::forward<F>(task)();
        } else {
            state_->enqueue(std::function<void()>(std::forward<F>(task)));
        }
    }

    friend constexpr bool operator==(stream_view, stream_view) noexcept = default;

private:
    detail::stream_state* state_ = nullptr;
};

/// An owning host stream: a worker thread bound to a device. Move-only. Destruction lets the
/// enqueued work finish, then ends the thread.
class stream {
public:
    /// Creates a stream on `device` (by default the calling thread's current device).
    explicit stream(int device = detail::current_device_slot())
        : state_(std::make_shared<detail::stream_state>(device)) {
        if (device < 0 || device >= detail::device_count_slot().load()) {
            state_.reset();
            throw std::invalid_argument("custody: host device " + std::to_string(device) + " does not exist");
        }
        state_->start();
        detail::stream_registry::instance().add(state_);
    }
    stream(stream&&) noexcept = default;
    stream& operator=(stream&& other) noexcept {
        if (this != &other) {
            reset();
            state_ = std::move(other.state_);
        }
        return *this;
    }
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;
    ~stream() { reset(); }

    [[nodiscard]] stream_view view() const noexcept { return stream_view(state_.get()); }
    operator stream_view() const noexcept { return view(); } // NOLINT: a stream is usable as its view
    [[nodiscard]] int device() const noexcept { return state_ ? state_->device() : -1; }

private:
    void reset() noexcept {
        if (state_) state_->shutdown();
        state_.reset();
    }
    std::shared_ptr<detail::stream_state> state_;
};

/// A completion marker. Move-only. Recording captures the work enqueued on a stream so far; the
/// event is ready once that work has finished. Never recorded, it is ready. Recorded on a capturing
/// stream, it marks a point of the capture instead: querying or synchronizing it is then a
/// capture_violation (captured_event) until it is recorded outside a capture again.
/// Thread safety: as a CUDA event, one thread records it while others may query it only through
/// external synchronization.
class event {
public:
    explicit event(int device = detail::current_device_slot()) : device_(device) {}
    event(event&&) noexcept = default;
    event& operator=(event&&) noexcept = default;
    event(const event&) = delete;
    event& operator=(const event&) = delete;
    ~event() = default;

    /// Throws std::invalid_argument for the default stream while another device than the event's
    /// is current: the default stream is the current device's, and cudaEventRecord refuses an
    /// event and a stream of two devices.
    void record(stream_view s) {
        if (s.is_default() && detail::current_device_slot() != device_) {
            throw std::invalid_argument("custody: an event of host device " + std::to_string(device_) +
                                        " recorded on the default stream of device " +
                                        std::to_string(detail::current_device_slot()));
        }
        if (!s.is_default()) {
            if (auto capture = s.state()->capture()) [[unlikely]] {
                captured_ = std::make_shared<const captured_point>(captured_point{capture, capture->frontier(s.state())});
                state_.reset();
                ticket_ = 0;
                return;
            }
        }
        captured_.reset();
        if (s.is_default()) {
            state_.reset();
            ticket_ = 0;
        } else if (state_.get() == s.state()) {
            ticket_ = state_->mark(); // re-recorded on the same stream: no reference-count traffic
        } else {
            state_ = s.state()->shared_from_this();
            ticket_ = state_->mark();
        }
    }
    /// The recorded work has finished. A potentially unsafe call (see custody::capture_mode).
    [[nodiscard]] bool ready() const {
        check_queryable("event query");
        return !state_ || state_->reached(ticket_);
    }
    /// Blocks until the recorded work has finished. A potentially unsafe call.
    void synchronize() const {
        check_queryable("event synchronize");
        if (state_) state_->wait_for(ticket_);
    }
    [[nodiscard]] int device() const noexcept { return device_; }

private:
    friend struct platform;
    /// Where an event recorded in a capture stands: its capture and the point it marks.
    struct captured_point {
        std::shared_ptr<detail::capture_sequence> capture;
        detail::capture_frontier frontier;
    };

    void check_queryable(std::string_view call) const {
        if (captured_ != nullptr) [[unlikely]] {
            throw capture_violation(capture_violation::reason::captured_event, call,
                                    "the event was last recorded in a capture");
        }
        detail::capture_registry::instance().check_unsafe(call);
    }

    std::shared_ptr<detail::stream_state> state_;
    std::uint64_t ticket_ = 0;
    std::shared_ptr<const captured_point> captured_; // non-null: last recorded in a capture
    int device_;
};

/// An executable graph made by platform::end_capture: the work a capture recorded, replayed in
/// full by each platform::launch. Move-only; a moved-from or default graph is empty. Launches of
/// one graph are ordered one after another (as cudaGraphLaunch orders launches of one
/// cudaGraphExec_t), whatever stream each is on. The graph keeps its work (and what that work
/// holds) alive while a launch of it may still run.
class graph {
public:
    graph() noexcept = default;
    graph(graph&&) noexcept = default;
    graph& operator=(graph&&) noexcept = default;
    graph(const graph&) = delete;
    graph& operator=(const graph&) = delete;
    ~graph() = default;

    /// The number of nodes (pieces of work) the capture recorded.
    [[nodiscard]] std::size_t node_count() const noexcept { return body_ ? body_->tasks.size() : 0; }
    [[nodiscard]] explicit operator bool() const noexcept { return body_ != nullptr; }

private:
    friend struct platform;
    struct body {
        std::vector<std::function<void()>> tasks; // in an order that respects every dependency
        custody::detail::mutex mutex; // guards the last launch's mark
        std::shared_ptr<detail::stream_state> last_stream;
        std::uint64_t last_ticket = 0;
    };
    explicit graph(std::vector<std::function<void()>> tasks) : body_(std::make_shared<body>()) {
        body_->tasks = std::move(tasks);
    }
    std::shared_ptr<body> body_;
};

/// The host platform's operations (see platform/platform.hpp).
struct platform {
    using stream_view = host::stream_view;
    using stream = host::stream;
    using event = host::event;
    using graph = host::graph;
    static constexpr std::string_view name = "host";

    [[nodiscard]] static int device_count() noexcept { return detail::device_count_slot().load(); }
    [[nodiscard]] static int current_device() noexcept { return detail::current_device_slot(); }
    static void set_device(int device) {
        if (device < 0 || device >= device_count()) {
            throw std::invalid_argument("custody: host device " + std::to_string(device) + " does not exist");
        }
        detail::current_device_slot() = device;
    }
    static void set_device_noexcept(int device) noexcept { detail::current_device_slot() = device; }

    /// The stream's own id (0 for the default stream): a stream made where a destroyed one was
    /// never has the destroyed one's key.
    [[nodiscard]] static std::uintptr_t stream_key(stream_view s) noexcept {
        return s.is_default() ? 0 : static_cast<std::uintptr_t>(s.state()->id());
    }
    [[nodiscard]] static int stream_device(stream_view s) noexcept {
        return s.is_default() ? current_device() : s.state()->device();
    }
    /// Synchronizing a capturing stream invalidates its capture and throws capture_violation;
    /// otherwise a potentially unsafe call.
    static void synchronize(stream_view s) {
        if (!s.is_default()) {
            if (auto capture = s.state()->capture()) [[unlikely]] {
                capture->invalidate("a capturing stream was synchronized");
                throw capture_violation(capture_violation::reason::unsupported, "stream synchronize",
                                        "the stream is capturing");
            }
        }
        detail::capture_registry::instance().check_unsafe("stream synchronize");
        if (!s.is_default()) s.state()->wait_for(s.state()->mark());
    }
    /// As synchronize() for every stream of the device: a capture on any of them is an error.
    static void synchronize_device(int device) {
        const auto streams = detail::stream_registry::instance().of_device(device);
        bool capturing = false;
        for (const auto& s : streams) {
            if (auto capture = s->capture()) {
                capture->invalidate("the device of a capturing stream was synchronized");
                capturing = true;
            }
        }
        if (capturing) {
            throw capture_violation(capture_violation::reason::unsupported, "device synchronize",
                                    "a stream of the device is capturing");
        }
        detail::capture_registry::instance().check_unsafe("device synchronize");
        for (const auto& s : streams) s->wait_for(s->mark());
    }
    /// Work enqueued on s after this call waits for e. An event recorded in a capture makes s join
    /// that capture (a fork) or, when s is part of it, a dependency; an event recorded outside a
    /// capture cannot be waited on by a capturing stream (capture_violation, isolation).
    static void wait(stream_view s, const event& e) {
        if (e.captured_ != nullptr) [[unlikely]] {
            if (s.is_default()) {
                throw capture_violation(capture_violation::reason::isolation, "wait",
                                        "the default stream cannot take part in a capture");
            }
            s.state()->join_capture(e.captured_->capture, e.captured_->frontier);
            return;
        }
        if (!s.is_default()) {
            if (auto capture = s.state()->capture()) [[unlikely]] {
                if (!e.state_) return; // never recorded: nothing to wait for
                capture->invalidate("a capturing stream waited on an event recorded outside the capture");
                throw capture_violation(capture_violation::reason::isolation, "wait",
                                        "the event was recorded outside the capture");
            }
        }
        if (!e.state_ || e.state_->reached(e.ticket_)) return;
        if (s.is_default()) {
            e.synchronize();
            return;
        }
        if (e.state_.get() == s.state()) return; // in-order: already ordered
        s.state()->enqueue([state = e.state_, ticket = e.ticket_] { state->wait_for(ticket); });
    }
    [[nodiscard]] static bool is_capturing(stream_view s) { return query_capture(s).capturing(); }
    /// Nothing: virtual devices have no memory of their own (a resource such as
    /// simulated_device_memory gives one its capacity).
    [[nodiscard]] static std::optional<device_memory> memory_info(int) noexcept { return std::nullopt; }
    /// Nothing unloads under the host platform: no failure means the process is exiting.
    [[nodiscard]] static bool is_exiting(const std::exception&) noexcept { return false; }
    static void memcpy_async(void* dst, const void* src, std::size_t bytes, stream_view s) {
        if (bytes == 0) return;
        s.enqueue([=] { std::memcpy(dst, src, bytes); });
    }
    static void memset_async(void* dst, int value, std::size_t bytes, stream_view s) {
        if (bytes == 0) return;
        s.enqueue([=] { std::memset(dst, value, bytes); });
    }

    // ---- capture ----

    /// Starts capturing `s` in `mode`: work enqueued on s is recorded, not run, until end_capture.
    /// Throws capture_violation: unsupported for the default stream, illegal_state when s is
    /// already capturing.
    static void begin_capture(stream_view s, capture_mode mode) {
        if (s.is_default()) {
            throw capture_violation(capture_violation::reason::unsupported, "begin_capture",
                                    "the default stream cannot be captured");
        }
        auto& registry = detail::capture_registry::instance();
        auto capture = std::make_shared<detail::capture_sequence>(registry.next_id(), mode, s.state(),
                                                                  std::this_thread::get_id());
        s.state()->begin_capture(capture);
        try {
            registry.open(capture);
        } catch (...) {
            s.state()->leave_capture(capture.get());
            throw;
        }
    }

    /// Ends the capture begun on `s` and returns its graph; every stream forked into it stops
    /// capturing. Throws capture_violation: illegal_state when s is not capturing, unmatched when
    /// the capture began on another stream, wrong_thread when another thread began a capture that
    /// is not relaxed (the capture stays open), invalidated and unjoined (the capture has ended).
    static graph end_capture(stream_view s) {
        auto capture = s.is_default() ? nullptr : s.state()->capture();
        if (capture == nullptr) {
            throw capture_violation(capture_violation::reason::illegal_state, "end_capture", "the stream is not capturing");
        }
        if (capture->origin() != s.state()) {
            throw capture_violation(capture_violation::reason::unmatched, "end_capture",
                                    "the capture was begun on another stream");
        }
        if (capture->mode() != capture_mode::relaxed && capture->thread() != std::this_thread::get_id()) {
            throw capture_violation(capture_violation::reason::wrong_thread, "end_capture");
        }
        const auto finish_streams = [&]() noexcept {
            for (detail::stream_state* member : capture->members()) member->leave_capture(capture.get());
            detail::capture_registry::instance().close(capture.get());
        };
        std::vector<std::function<void()>> tasks;
        try {
            tasks = capture->finish();
        } catch (...) {
            finish_streams();
            throw;
        }
        finish_streams();
        return graph(std::move(tasks));
    }

    /// Enqueues one replay of `g` on `s`, after the previous launch of g wherever it ran. Launched
    /// on a capturing stream, the replay becomes one node of that capture.
    static void launch(const graph& g, stream_view s) {
        Expects(g.body_ != nullptr);
        auto run = [body = g.body_] {
            for (const auto& task : body->tasks) task();
        };
        if (s.is_default()) {
            std::unique_lock lock(g.body_->mutex);
            if (g.body_->last_stream) g.body_->last_stream->wait_for(g.body_->last_ticket);
            g.body_->last_stream.reset();
            lock.unlock();
            run();
            return;
        }
        if (s.state()->capture() != nullptr) {
            s.enqueue(std::move(run));
            return;
        }
        std::lock_guard lock(g.body_->mutex);
        graph::body& b = *g.body_;
        if (b.last_stream && b.last_stream.get() != s.state() && !b.last_stream->reached(b.last_ticket)) {
            s.enqueue([state = b.last_stream, ticket = b.last_ticket] { state->wait_for(ticket); });
        }
        s.enqueue(std::move(run));
        b.last_stream = s.state()->shared_from_this();
        b.last_ticket = b.last_stream->mark();
    }

    /// `s`'s capture state. Never a potentially unsafe call; one atomic load when s is not capturing.
    [[nodiscard]] static capture_info query_capture(stream_view s) {
        if (s.is_default()) return {};
        const auto capture = s.state()->capture();
        if (capture == nullptr) return {};
        return {capture->status(), capture->id()};
    }

    /// Sets the calling thread's capture mode; returns the previous one.
    static capture_mode exchange_capture_mode(capture_mode mode) noexcept {
        return std::exchange(detail::thread_capture_mode(), mode);
    }
    static void exchange_capture_mode_noexcept(capture_mode mode) noexcept { detail::thread_capture_mode() = mode; }

    /// Models a runtime call that capture may prohibit (cudaMalloc, for virtual device memory):
    /// throws capture_violation(unsupported), invalidating the captures that prohibit it, when the
    /// calling thread's mode and the open captures prohibit potentially unsafe calls.
    static void check_unsafe_call(std::string_view call) { detail::capture_registry::instance().check_unsafe(call); }
};

static_assert(custody::platform<platform>);

/// Runs `free` once every task enqueued on `stream` so far has run: the free is itself enqueued
/// (on the default stream it runs at once). If it cannot be enqueued (no memory for the queue
/// node), waits for the stream and runs it then, so a free is never lost. The host platform's
/// counterpart of cudaFreeAsync, for the deallocate of its resources.
template <class Free>
void free_after_stream(stream_view stream, Free free) noexcept {
    if (stream.is_default()) {
        free();
        return;
    }
    try {
        stream.enqueue(free);
    } catch (...) {
        platform::synchronize(stream);
        free();
    }
}

/// Sets and restores the calling thread's current virtual device.
using device_guard = basic_device_guard<platform>;
/// Sets and restores the calling thread's capture mode.
using capture_mode_guard = basic_capture_mode_guard<platform>;

} // namespace custody::host
