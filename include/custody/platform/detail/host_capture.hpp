/// @file
/// The host platform's capture bookkeeping: a capture sequence (the work recorded by the streams
/// capturing into it, as a graph), the registry of open captures that decides which calls are
/// prohibited, and each thread's capture mode. Streams and events use it (platform/host.hpp).
#pragma once

#include <custody/core/detail/mutex.hpp>
#include <custody/platform/capture.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace custody::host::detail {

class stream_state;

/// A point in a capture: the nodes that work ordered after it depends on.
using capture_frontier = std::vector<std::size_t>;

/// One capture sequence: the work enqueued on the streams capturing into it, in the order it was
/// enqueued, with the dependencies that make it a graph. Begun on one stream (the origin); other
/// streams join it by waiting on an event recorded in it (a fork) and must be joined back (the
/// origin waits on an event recorded on them after their last work) before it ends.
///
/// Thread safety: thread-safe (one mutex). Complexity: recording a node O(frontier); finishing
/// O(nodes + edges).
///
/// Invariants (under mutex_):
///   deps_[k] ⊂ [0, k) for every node k, so the node order is an order to run them in
///   members_[0].stream == origin_; every member's frontier ⊂ [0, tasks_.size())
///   ended_ => no node and no member is added any more
///   invalidated_ == !why_.empty()
class capture_sequence {
public:
    capture_sequence(std::uint64_t id, capture_mode mode, stream_state* origin, std::thread::id thread)
        : id_(id), mode_(mode), origin_(origin), thread_(thread) {
        members_.push_back({origin, {}});
    }
    capture_sequence(const capture_sequence&) = delete;
    capture_sequence& operator=(const capture_sequence&) = delete;

    [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
    [[nodiscard]] capture_mode mode() const noexcept { return mode_; }
    [[nodiscard]] stream_state* origin() const noexcept { return origin_; }
    /// The thread that began the capture.
    [[nodiscard]] std::thread::id thread() const noexcept { return thread_; }

    [[nodiscard]] capture_status status() const {
        std::lock_guard lock(mutex_);
        return invalidated_ ? capture_status::invalidated : capture_status::active;
    }

    /// Marks the capture invalidated by `why` (the first reason is kept).
    void invalidate(std::string_view why) noexcept {
        std::lock_guard lock(mutex_);
        invalidate_locked(why);
    }

    /// Appends `task` as a node of stream `s` (a member): it depends on s's frontier and becomes it.
    /// Throws capture_violation when the capture has ended (a race with end_capture).
    void record(stream_state* s, std::function<void()> task) {
        std::lock_guard lock(mutex_);
        if (ended_) throw capture_violation(capture_violation::reason::invalidated, "enqueue", "the capture has ended");
        if (invalidated_) throw capture_violation(capture_violation::reason::invalidated, "enqueue", why_);
        member& m = member_of(s);
        nodes_.push_back({std::move(task), m.frontier});
        m.frontier.assign(1, nodes_.size() - 1);
    }

    /// The frontier of member `s` (what an event recorded on it now marks).
    [[nodiscard]] capture_frontier frontier(const stream_state* s) const {
        std::lock_guard lock(mutex_);
        for (const member& m : members_) {
            if (m.stream == s) return m.frontier;
        }
        return {};
    }

    /// Stream `s` waits on a point `f` of this capture: a member adds f to its frontier; any other
    /// stream becomes a member (a fork) whose frontier is f.
    void join(stream_state* s, const capture_frontier& f) {
        std::lock_guard lock(mutex_);
        if (ended_) throw capture_violation(capture_violation::reason::isolation, "wait", "the capture has ended");
        for (member& m : members_) {
            if (m.stream == s) {
                for (std::size_t node : f) {
                    if (std::find(m.frontier.begin(), m.frontier.end(), node) == m.frontier.end()) m.frontier.push_back(node);
                }
                return;
            }
        }
        members_.push_back({s, f});
    }

    /// The streams in the capture, origin first.
    [[nodiscard]] std::vector<stream_state*> members() const {
        std::lock_guard lock(mutex_);
        std::vector<stream_state*> out;
        out.reserve(members_.size());
        for (const member& m : members_) out.push_back(m.stream);
        return out;
    }

    /// Ends the capture. Returns its nodes' tasks in an order that respects every dependency, or
    /// throws capture_violation: `invalidated` (with the reason) or `unjoined` (a fork whose last
    /// work the origin does not wait for).
    std::vector<std::function<void()>> finish() {
        std::lock_guard lock(mutex_);
        ended_ = true;
        if (invalidated_) throw capture_violation(capture_violation::reason::invalidated, "end_capture", why_);
        std::vector<bool> reached(nodes_.size(), false);
        std::vector<std::size_t> todo = members_[0].frontier;
        while (!todo.empty()) {
            const std::size_t k = todo.back();
            todo.pop_back();
            if (reached[k]) continue;
            reached[k] = true;
            todo.insert(todo.end(), nodes_[k].deps.begin(), nodes_[k].deps.end());
        }
        for (const member& m : members_) {
            for (std::size_t k : m.frontier) {
                if (!reached[k]) {
                    throw capture_violation(capture_violation::reason::unjoined, "end_capture",
                                            "a stream forked into the capture has work the origin does not wait for");
                }
            }
        }
        std::vector<std::function<void()>> tasks;
        tasks.reserve(nodes_.size());
        for (node& n : nodes_) tasks.push_back(std::move(n.task));
        nodes_.clear();
        return tasks;
    }

    /// A member other than the origin is gone: the capture is invalidated (its fork can never be
    /// joined) and forgets the stream.
    void drop(const stream_state* s) noexcept {
        std::lock_guard lock(mutex_);
        std::erase_if(members_, [&](const member& m) { return m.stream == s && s != origin_; });
        invalidate_locked("a stream forked into the capture was destroyed");
    }

    /// Ends the capture without a graph (its origin is gone).
    void abandon(std::string_view why) noexcept {
        std::lock_guard lock(mutex_);
        invalidate_locked(why);
        ended_ = true;
    }

private:
    struct node {
        std::function<void()> task;
        capture_frontier deps;
    };
    struct member {
        stream_state* stream;
        capture_frontier frontier;
    };

    member& member_of(const stream_state* s) {
        for (member& m : members_) {
            if (m.stream == s) return m;
        }
        return members_.front(); // unreachable: only members record
    }
    void invalidate_locked(std::string_view why) noexcept {
        if (invalidated_) return;
        invalidated_ = true;
        try {
            why_.assign(why.empty() ? std::string_view("invalidated") : why);
        } catch (...) {
        }
    }

    const std::uint64_t id_;
    const capture_mode mode_;
    stream_state* const origin_;
    const std::thread::id thread_;
    mutable custody::detail::mutex mutex_;
    std::vector<node> nodes_;
    std::vector<member> members_;
    bool ended_ = false;
    bool invalidated_ = false;
    std::string why_;
};

/// The calling thread's capture mode (cudaThreadExchangeStreamCaptureMode's per-thread state).
inline capture_mode& thread_capture_mode() noexcept {
    thread_local capture_mode mode = capture_mode::global;
    return mode;
}

/// The open captures of the process, and the rule that prohibits potentially unsafe calls while
/// they are open (see capture_mode). Thread-safe; check_unsafe costs one atomic load while no
/// capture is open.
class capture_registry {
public:
    static capture_registry& instance() {
        static capture_registry r;
        return r;
    }

    /// A fresh capture id (never 0).
    std::uint64_t next_id() noexcept { return ids_.fetch_add(1, std::memory_order_relaxed) + 1; }

    void open(std::shared_ptr<capture_sequence> c) {
        std::lock_guard lock(mutex_);
        open_.push_back(std::move(c));
        count_.store(open_.size(), std::memory_order_release);
    }
    void close(const capture_sequence* c) noexcept {
        std::lock_guard lock(mutex_);
        std::erase_if(open_, [&](const auto& o) { return o.get() == c; });
        count_.store(open_.size(), std::memory_order_release);
    }

    /// For a potentially unsafe call (`call`) by the calling thread: invalidates every open capture
    /// that prohibits it and throws capture_violation(unsupported); returns when none does.
    void check_unsafe(std::string_view call) {
        if (count_.load(std::memory_order_acquire) == 0) [[likely]] return;
        const capture_mode mine = thread_capture_mode();
        if (mine == capture_mode::relaxed) return;
        const std::thread::id self = std::this_thread::get_id();
        bool prohibited = false;
        {
            std::lock_guard lock(mutex_);
            for (const auto& c : open_) {
                const bool own = c->thread() == self && c->mode() != capture_mode::relaxed;
                const bool others = mine == capture_mode::global && c->thread() != self && c->mode() == capture_mode::global;
                if (own || others) {
                    c->invalidate(std::string(call) + " was called while the capture was open");
                    prohibited = true;
                }
            }
        }
        if (prohibited) {
            throw capture_violation(capture_violation::reason::unsupported, call,
                                    "potentially unsafe while a capture is open (see custody::capture_mode)");
        }
    }

    /// True when some capture is open (one atomic load).
    [[nodiscard]] bool any_open() const noexcept { return count_.load(std::memory_order_acquire) != 0; }

private:
    custody::detail::mutex mutex_;
    std::vector<std::shared_ptr<capture_sequence>> open_;
    std::atomic<std::size_t> count_{0}; // == open_.size()
    std::atomic<std::uint64_t> ids_{0};
};

} // namespace custody::host::detail
