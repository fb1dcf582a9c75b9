/// @file
/// The host platform's streams underneath: one stream's queue, worker thread and capture
/// (`detail::stream_state`), the registry of live streams that lets a device be synchronized as a
/// whole, and the per-thread current device. The handles over them are platform/host.hpp.
#pragma once

#include <custody/platform/capture.hpp>
#include <custody/platform/detail/host_capture.hpp>

#include <gsl/assert>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
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

/// One stream's queue and worker thread, and the capture it records into, if any.
///
/// Invariants: completed_ <= enqueued_; task k (1-based, in enqueue order) has finished iff
/// completed_ >= k. Both only grow. id_ >= 1 is this stream's alone, for the process's lifetime.
/// capturing_ == (capture_ != nullptr); while capturing, enqueued work goes into capture_ and
/// enqueued_ does not move.
class stream_state : public std::enable_shared_from_this<stream_state> {
public:
    explicit stream_state(int device) : device_(device), id_(next_stream_id()) {}
    stream_state(const stream_state&) = delete;
    stream_state& operator=(const stream_state&) = delete;
    ~stream_state() { shutdown(); }

    void start() {
        worker_ = std::thread([this] { run(); });
    }

    /// Appends `task` to the queue, or to the capture while capturing.
    void enqueue(std::function<void()> task) {
        std::lock_guard lock(mutex_);
        if (capture_ != nullptr) [[unlikely]] {
            capture_->record(this, std::move(task));
            return;
        }
        queue_.push_back(std::move(task));
        enqueued_.store(enqueued_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
        work_cv_.notify_one();
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

    /// The capture this stream records into (nullptr when it is not capturing). One atomic load when
    /// it is not.
    [[nodiscard]] std::shared_ptr<capture_sequence> capture() const {
        if (!capturing_.load(std::memory_order_acquire)) [[likely]] return nullptr;
        std::lock_guard lock(mutex_);
        return capture_;
    }

    /// Starts recording into `c`; throws capture_violation(illegal_state) if already capturing.
    void begin_capture(const std::shared_ptr<capture_sequence>& c) {
        std::lock_guard lock(mutex_);
        if (capture_ != nullptr) {
            throw capture_violation(capture_violation::reason::illegal_state, "begin_capture",
                                    "the stream is already capturing");
        }
        set_capture(c);
    }

    /// Joins the capture `c` at point `f` (waiting on an event recorded in it). Throws
    /// capture_violation(merge) when the stream captures into another capture.
    void join_capture(const std::shared_ptr<capture_sequence>& c, const capture_frontier& f) {
        std::lock_guard lock(mutex_);
        if (capture_ != nullptr && capture_ != c) {
            capture_->invalidate("a wait would merge two captures");
            c->invalidate("a wait would merge two captures");
            throw capture_violation(capture_violation::reason::merge, "wait");
        }
        c->join(this, f);
        set_capture(c);
    }

    /// Stops recording into `c` (no effect if the stream records into another capture or none).
    void leave_capture(const capture_sequence* c) noexcept {
        std::lock_guard lock(mutex_);
        if (capture_.get() == c) set_capture(nullptr);
    }

    /// Lets every enqueued task finish, then joins the worker; a capture begun on this stream ends
    /// without a graph. Idempotent.
    void shutdown() noexcept {
        std::shared_ptr<capture_sequence> capture;
        {
            std::lock_guard lock(mutex_);
            if (stopping_) return;
            stopping_ = true;
            capture = std::move(capture_);
            capturing_.store(false, std::memory_order_release);
            work_cv_.notify_one();
        }
        if (capture != nullptr) abandon(*capture);
        if (worker_.joinable()) worker_.join();
    }

private:
    void set_capture(std::shared_ptr<capture_sequence> c) noexcept {
        capture_ = std::move(c);
        capturing_.store(capture_ != nullptr, std::memory_order_release);
    }

    /// A capture this stream was part of when it was destroyed: invalidated; ended if it began here.
    void abandon(capture_sequence& c) noexcept {
        if (c.origin() != this) {
            c.drop(this);
            return;
        }
        c.abandon("the stream the capture began on was destroyed");
        for (stream_state* member : c.members()) {
            if (member != this) member->leave_capture(&c);
        }
        capture_registry::instance().close(&c);
    }

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
    mutable std::mutex mutex_;
    std::condition_variable work_cv_;
    std::condition_variable done_cv_;
    std::deque<std::function<void()>> queue_;
    std::atomic<std::uint64_t> enqueued_{0};
    std::atomic<std::uint64_t> completed_{0};
    std::shared_ptr<capture_sequence> capture_; // guarded by mutex_
    std::atomic<bool> capturing_{false};
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

} // namespace custody::host
