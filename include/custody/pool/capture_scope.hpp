/// @file
/// `capture_scope` and `captured_graph`: graph capture with a pool's capture-private memory, for
/// C++ callers (the hooks they are made of, begin/end_allocate_to_pool and release_pool, are the
/// pool's members; docs/pool.md).
#pragma once

#include <custody/core/failure_callback.hpp>
#include <custody/platform/capture.hpp>
#include <custody/pool/capture_pool_id.hpp>

#include <gsl/assert>

#include <utility>

namespace custody::pool {

/// A graph captured by a capture_scope, with its hold on the private pool its allocations came
/// from: destroying it (or reset()) destroys the graph and releases the hold, so the private
/// memory goes back to the upstream once no graph of that pool is left (docs/pool.md).
///
/// Ownership: owns the graph and one hold; the pool must outlive it. Move-only.
/// Stream semantics: launch(s) enqueues one replay on s (Platform::launch); replays of one graph
/// run one after another. Destruction waits for the device before private memory is given back.
/// Thread safety: as Platform::graph (launch from one thread at a time).
template <class Pool>
class captured_graph {
public:
    using platform_type = typename Pool::platform_type;
    using stream_type = typename Pool::stream_type;
    using graph_type = typename platform_type::graph;

    captured_graph() noexcept = default;
    captured_graph(captured_graph&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)), id_(other.id_), graph_(std::move(other.graph_)) {}
    captured_graph& operator=(captured_graph&& other) noexcept {
        if (this != &other) {
            reset();
            pool_ = std::exchange(other.pool_, nullptr);
            id_ = other.id_;
            graph_ = std::move(other.graph_);
        }
        return *this;
    }
    captured_graph(const captured_graph&) = delete;
    captured_graph& operator=(const captured_graph&) = delete;
    ~captured_graph() { reset(); }

    /// Enqueues one replay on `stream`.
    void launch(stream_type stream) const {
        Expects(pool_ != nullptr);
        platform_type::launch(graph_, stream);
    }
    [[nodiscard]] const graph_type& graph() const noexcept { return graph_; }
    /// The private pool the graph's allocations came from: pass it to another capture_scope to
    /// share that memory (the two graphs must then never run concurrently).
    [[nodiscard]] capture_pool_id pool_id() const noexcept { return id_; }
    [[nodiscard]] explicit operator bool() const noexcept { return pool_ != nullptr; }

    /// Destroys the graph and releases its hold on the private pool.
    void reset() noexcept {
        if (pool_ == nullptr) return;
        graph_ = graph_type{};
        try {
            std::exchange(pool_, nullptr)->release_pool(id_);
        } catch (...) {
            report_failure("captured_graph: releasing its capture pool failed");
        }
    }

private:
    template <class>
    friend class capture_scope;
    captured_graph(Pool& pool, capture_pool_id id, graph_type graph) noexcept
        : pool_(&pool), id_(id), graph_(std::move(graph)) {}

    Pool* pool_ = nullptr; // nullptr: empty (no graph, no hold)
    capture_pool_id id_;
    graph_type graph_;
};

/// Captures the work enqueued on one stream into a graph, with every allocation that `pool` serves
/// on that stream (and on the streams forked into the capture) taken from the private pool `id`:
/// their addresses are fixed in the graph and stay reserved for as long as the graph exists. The
/// capture and the routing begin in the constructor and end in end(), which returns the graph.
///
///     custody::pool::capture_scope scope(pool, stream);       // a fresh private pool
///     step(stream);                                          // allocates from pool, launches work
///     custody::pool::captured_graph graph = scope.end();
///     for (...) graph.launch(stream);
///
/// Ownership: holds the private pool from construction until end() hands the hold to the graph;
/// `pool` must outlive the scope and the graph. Not copyable nor movable.
/// Stream semantics: the stream's allocations are known to be in capture without asking the
/// platform; others are asked once per call while the scope is open. A scope left without end()
/// (an exception) ends the capture, drops the graph and releases the hold.
/// Thread safety: one scope is used by one thread (the one that begun the capture, unless the
/// mode is relaxed). Other threads may use `pool` meanwhile.
template <class Pool>
class capture_scope {
public:
    using platform_type = typename Pool::platform_type;
    using stream_type = typename Pool::stream_type;

    /// Begins capturing `stream` in `mode`, its allocations served from private pool `id` (made if
    /// new; shared with the graphs that already use it, which must never run concurrently with
    /// this one). Throws std::invalid_argument when `id` is being allocated to or was released,
    /// and what Platform::begin_capture throws; nothing is changed then.
    capture_scope(Pool& pool, stream_type stream, capture_pool_id id, capture_mode mode = capture_mode::global)
        : pool_(pool), stream_(stream), id_(id) {
        pool_.begin_allocate_to_pool(id_, stream_);
        try {
            platform_type::begin_capture(stream_, mode);
        } catch (...) {
            close();
            throw;
        }
    }
    /// The same with a fresh private pool (Pool::make_capture_pool_id()).
    capture_scope(Pool& pool, stream_type stream, capture_mode mode = capture_mode::global)
        : capture_scope(pool, stream, pool.make_capture_pool_id(), mode) {}

    capture_scope(const capture_scope&) = delete;
    capture_scope& operator=(const capture_scope&) = delete;

    ~capture_scope() {
        if (!open_) return;
        try {
            static_cast<void>(platform_type::end_capture(stream_));
        } catch (...) {
        }
        close();
    }

    /// Ends the capture and returns the graph, which takes over the hold on the private pool.
    /// Throws what Platform::end_capture throws (an invalidated capture, ...); the capture and the
    /// routing are then over and the hold released, unless the capture is still open (ended from
    /// the wrong thread), which leaves the scope as it was.
    [[nodiscard]] captured_graph<Pool> end() {
        Expects(open_);
        typename platform_type::graph graph;
        try {
            graph = platform_type::end_capture(stream_);
        } catch (...) {
            if (!platform_type::is_capturing(stream_)) close();
            throw;
        }
        open_ = false;
        pool_.end_allocate_to_pool(id_);
        return captured_graph<Pool>(pool_, id_, std::move(graph));
    }

    [[nodiscard]] capture_pool_id pool_id() const noexcept { return id_; }
    [[nodiscard]] stream_type stream() const noexcept { return stream_; }

private:
    /// Ends the routing and releases the hold (the capture is over).
    void close() noexcept {
        open_ = false;
        try {
            pool_.end_allocate_to_pool(id_);
            pool_.release_pool(id_);
        } catch (...) {
            report_failure("capture_scope: closing its capture pool failed");
        }
    }

    Pool& pool_;
    stream_type stream_;
    capture_pool_id id_;
    bool open_ = true;
};

} // namespace custody::pool
