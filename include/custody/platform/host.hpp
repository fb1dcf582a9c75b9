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
#pragma once

#include <custody/platform/platform.hpp>

#include <gsl/assert>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
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

inline constexpr int default_device_count = 8;

namespace detail {

inline int& current_device_slot() noexcept {
    thread_local int device = 0;
    return device;
}

inline std::atomic<int>& device_count_slot() noexcept {
    static std::atomic<int> count{default_device_count};
    return count;
}

/// The identity of the next stream: 1, 2, 3, ... in creation order, never given twice.
inline std::uint64_t next_stream_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
}

/// One stream's queue and worker thread.
///
/// Invariants: completed_ <= enqueued_; task k (1-based, in enqueue order) has finished iff
/// completed_ >= k. Both only grow. id_ >= 1 is this stream's alone, for the process's lifetime.
class stream_state : public std::enable_shared_from_this<stream_state> {
public:
    explicit stream_state(int device) : device_(device), id_(next_stream_id()) {}
    stream_state(const stream_state&) = delete;
    stream_state& operator=(const stream_state&) = delete;
    ~stream_state() { shutdown(); }

    void start() {
        worker_ = std::thread([this] { run(); });
    }

    /// Appends `task`; returns its ticket.
    std::uint64_t enqueue(std::function<void()> task) {
        std::lock_guard lock(mutex_);
        queue_.push_back(std::move(task));
        const std::uint64_t ticket = enqueued_.load(std::memory_order_relaxed) + 1;
        enqueued_.store(ticket, std::memory_order_release);
        work_cv_.notify_one();
        return ticket;
    }

    /// The ticket of the last task enqueued so far (0 if none).
    [[nodiscard]] std::uint64_t mark() const noexcept { return enqueued_.load(std::memory_order_acquire); }

    [[nodiscard]] bool reached(std::uint64_t ticket) const noexcept {
        return completed_.load(std::memory_order_acquire) >= ticket;
    }

    void wait_for(std::uint64_t ticket) {
        if (reached(ticket)) return;
        Expects(std::this_thread::get_id() != worker_.get_id()); // a stream waiting on itself never ends
        std::unique_lock lock(mutex_);
        done_cv_.wait(lock, [&] { return completed_.load(std::memory_order_acquire) >= ticket; });
    }

    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] std::uint64_t id() const noexcept { return id_; }

    /// Lets every enqueued task finish, then joins the worker. Idempotent.
    void shutdown() noexcept {
        {
            std::lock_guard lock(mutex_);
            if (stopping_) return;
            stopping_ = true;
            work_cv_.notify_one();
        }
        if (worker_.joinable()) worker_.join();
    }

private:
    void run() {
        current_device_slot() = device_;
        for (;;) {
            std::function<void()> task;
            {
                std::unique_lock lock(mutex_);
                work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
                if (queue_.empty()) return; // stopping and drained
                task = std::move(queue_.front());
                queue_.pop_front();
            }
            task();
            task = nullptr; // release captures before marking completion
            std::lock_guard lock(mutex_);
            completed_.fetch_add(1, std::memory_order_acq_rel);
            done_cv_.notify_all();
        }
    }

    int device_;
    std::uint64_t id_;
    std::mutex mutex_;
    std::condition_variable work_cv_;
    std::condition_variable done_cv_;
    std::deque<std::function<void()>> queue_;
    std::atomic<std::uint64_t> enqueued_{0};
    std::atomic<std::uint64_t> completed_{0};
    bool stopping_ = false;
    std::thread worker_;
};

/// Every live stream's state, so that a device can be synchronized as a whole. Thread-safe.
/// A stream's destruction lets its work finish, so streams no longer listed have none pending.
class stream_registry {
public:
    static stream_registry& instance() {
        static stream_registry r;
        return r;
    }
    void add(const std::shared_ptr<stream_state>& s) {
        std::lock_guard lock(mutex_);
        std::erase_if(streams_, [](const std::weak_ptr<stream_state>& w) { return w.expired(); });
        streams_.push_back(s);
    }
    /// The live streams of `device`.
    [[nodiscard]] std::vector<std::shared_ptr<stream_state>> of_device(int device) {
        std::vector<std::shared_ptr<stream_state>> found;
        std::lock_guard lock(mutex_);
        for (const auto& w : streams_) {
            if (auto s = w.lock(); s && s->device() == device) found.push_back(std::move(s));
        }
        return found;
    }

private:
    std::mutex mutex_;
    std::vector<std::weak_ptr<stream_state>> streams_;
};

} // namespace detail

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
/// event is ready once that work has finished. Never recorded, it is ready.
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
    [[nodiscard]] bool ready() const noexcept { return !state_ || state_->reached(ticket_); }
    void synchronize() const {
        if (state_) state_->wait_for(ticket_);
    }
    [[nodiscard]] int device() const noexcept { return device_; }

private:
    friend struct platform;
    std::shared_ptr<detail::stream_state> state_;
    std::uint64_t ticket_ = 0;
    int device_;
};

/// The host platform's operations (see platform/platform.hpp).
struct platform {
    using stream_view = host::stream_view;
    using stream = host::stream;
    using event = host::event;
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
    static void synchronize(stream_view s) {
        if (!s.is_default()) s.state()->wait_for(s.state()->mark());
    }
    static void synchronize_device(int device) {
        for (const auto& s : detail::stream_registry::instance().of_device(device)) s->wait_for(s->mark());
    }
    static void wait(stream_view s, const event& e) {
        if (!e.state_ || e.state_->reached(e.ticket_)) return;
        if (s.is_default()) {
            e.synchronize();
            return;
        }
        if (e.state_.get() == s.state()) return; // in-order: already ordered
        s.state()->enqueue([state = e.state_, ticket = e.ticket_] { state->wait_for(ticket); });
    }
    [[nodiscard]] static bool is_capturing(stream_view) noexcept { return false; }
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

} // namespace custody::host
