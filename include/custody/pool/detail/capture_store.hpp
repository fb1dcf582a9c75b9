/// @file
/// `capture_store`: the capture-private pools of one stream_ordered_pool: which streams' allocations
/// go to which private pool while a graph is captured, and when a pool's memory goes back to the
/// upstream (its chunks and blocks: private_pools.hpp).
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/capture.hpp>
#include <custody/pool/capture_error.hpp>
#include <custody/pool/capture_pool_id.hpp>
#include <custody/pool/detail/private_pools.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace custody::pool::detail {

/// The capture-private pools of a stream_ordered_pool over `Upstream`.
///
/// While a route is open (begin_route .. end_route: a graph is being captured), allocations on the
/// streams it claims are served from its private pool: the route's own stream without asking the
/// platform, streams forked into its capture (same capture id) and streams its filter accepts after
/// one Platform::query_capture. A block given back while its pool's route is open serves later
/// allocations on the stream it was given back on (capture order); once the route ends, any later
/// capture into the same pool. Ordinary allocations never get private memory. A private pool lives
/// while it holds memory or a route has not been released (holds > 0): release drops one hold, and
/// a pool without holds gives its wholly free chunks back to the upstream, after a device
/// synchronization (a replay may still run), as soon as no route is open; a block given back later
/// frees its chunk the same way. An id whose last hold was released is retired: never routed
/// again. A release while the id's route is open abandons that capture and ends the route.
///
/// The store never records events, never synchronizes a stream of the capture, and takes chunks
/// under a relaxed capture mode (asking the device for its free memory and taking memory do not
/// touch the capture; CUDA only calls them potentially unsafe), on a stream of its own (never the
/// default stream: over cudaMallocAsync the legacy default stream takes part implicitly in the
/// capture of any blocking stream, and work on it would invalidate that capture), so captures stay
/// valid.
///
/// Invariants (under mutex_):
///   routes_list_.size() == routes_ ; p.routing <=> exactly one route names p
///   id in retired_ <=> its last hold was released (then pools_[id], if any, has holds == 0)
///   each pool's own invariants (private_pool), and chunks_'s (private_chunks)
/// Thread safety: thread-safe (one mutex; the common path of the owning pool reads two atomics).
/// Ownership: owns the private chunks, taken from and given back to the owner's upstream, which
/// must outlive the store. Each chunk is announced to CUDA's tools as a heap of its own that is one
/// region end to end, named after its pool: a graph's replays touch every block its capture
/// allocated, given back during the capture or not, long after the host's calls. Complexity: O(log n) per call plus O(routes).
template <stream_ordered_resource Upstream>
class capture_store {
public:
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    /// Which streams a route claims (PyTorch passes one that asks for the stream's capture id).
    using filter_type = std::function<bool(stream_type)>;
    /// The owner's limits: true when `n` more bytes may be taken from the upstream.
    using limit_type = std::function<bool(std::size_t)>;
    /// Tells the owner whether its common path may serve calls (see update_attention).
    using quiet_type = std::function<void(bool)>;

    /// `always_careful`: the owner looks at every call itself (its checked mode, its annotations);
    /// `quiet(false)` is then said once, here.
    capture_store(Upstream& upstream, int device, std::size_t chunk_alignment, std::size_t growth_step,
                  capture_check check, limit_type may_take, custody::detail::memory_annotations& annotations,
                  bool always_careful = false, quiet_type quiet = [](bool) {})
        : every_call_(check == capture_check::every_call), always_careful_(always_careful), quiet_(std::move(quiet)),
          device_(device), chunks_(upstream, device, chunk_alignment, growth_step, std::move(may_take), annotations) {
        update_attention();
    }
    capture_store(const capture_store&) = delete;
    capture_store& operator=(const capture_store&) = delete;

    /// Waits for the device (a replay may still use private memory) and gives every chunk back.
    ~capture_store() {
        std::lock_guard lock(mutex_);
        chunks_.release_all();
    }

    /// The pool must look at captures on this call (a route is open, or every call is checked).
    [[nodiscard]] bool watching() const noexcept { return every_call_ || routes_.load(std::memory_order_acquire) != 0; }
    /// Some route is open: a graph is being captured with this pool's knowledge.
    [[nodiscard]] bool routing() const noexcept { return routes_.load(std::memory_order_acquire) != 0; }
    /// `address` lies in private memory. Lock-free; one atomic load while no private chunk exists.
    [[nodiscard, gnu::always_inline]] bool owns(std::uintptr_t address) const noexcept { return chunks_.owns(address); }
    [[nodiscard]] std::size_t reserved_bytes() const noexcept { return chunks_.reserved_bytes(); }

    [[nodiscard]] capture_pool_id make_id() noexcept { return {0, next_id_.fetch_add(1, std::memory_order_relaxed) + 1}; }

    /// Opens a route to pool `id` (made with one hold if new, else given one more hold: a shared
    /// pool). It claims `origin` (the capturing stream, known without a query) and the streams of
    /// its capture, or the streams `filter` accepts. Throws std::invalid_argument when `id` is
    /// already routed or was released (retired, whether its memory is gone or not); bad_alloc.
    /// Strong.
    void begin_route(capture_pool_id id, filter_type filter, std::optional<stream_type> origin) {
        std::lock_guard lock(mutex_);
        if (retired_.contains(id)) throw std::invalid_argument("custody: capture pool " + text(id) + " was released");
        auto found = pools_.find(id);
        if (found != pools_.end() && found->second->routing) {
            throw std::invalid_argument("custody: capture pool " + text(id) + " is already being allocated to");
        }
        routes_list_.reserve(routes_list_.size() + 1);
        private_pool* p = nullptr;
        if (found == pools_.end()) {
            p = pools_.emplace(id, std::make_unique<private_pool>()).first->second.get();
            p->id = id;
            p->holds = 0;
        } else {
            p = found->second.get();
        }
        ++p->holds;
        p->routing = true;
        const std::uintptr_t origin_key = origin ? platform_type::stream_key(*origin) : no_key;
        routes_list_.push_back({p, std::move(filter), origin, origin_key, 0});
        routes_.store(routes_list_.size(), std::memory_order_release);
        update_attention();
    }

    /// Closes the route to `id`: its streams' allocations are ordinary again, and the blocks given
    /// back during the capture serve any later capture into the pool. Call it once the capture
    /// has ended. Throws std::invalid_argument when `id` is not routed.
    void end_route(capture_pool_id id) {
        std::lock_guard lock(mutex_);
        auto found = pools_.find(id);
        if (found == pools_.end() || !found->second->routing) {
            throw std::invalid_argument("custody: capture pool " + text(id) + " is not being allocated to");
        }
        close_route(*found->second);
        collect();
    }

    /// Drops one hold on pool `id`; without holds, its memory goes back to the upstream as it
    /// becomes free and no route is open, and the id is retired. A release while the id's route is
    /// open abandons that capture (its graph will never be replayed): the route ends with it, so
    /// that it keeps neither the stream's allocations private nor trim() from collecting. Throws
    /// std::invalid_argument when `id` holds nothing (never begun, or released as many times as
    /// begun); bad_alloc. Strong.
    void release(capture_pool_id id) {
        std::lock_guard lock(mutex_);
        auto found = pools_.find(id);
        if (found == pools_.end() || found->second->holds == 0) {
            throw std::invalid_argument("custody: capture pool " + text(id) + " is not held (released already, or never begun)");
        }
        private_pool& p = *found->second;
        if (p.holds == 1) retired_.insert(id); // the only step that can throw, taken first
        if (p.routing) close_route(p);
        --p.holds;
        collect();
    }

    /// Gives back what released pools no longer use, when no route is open. Returns the bytes.
    std::size_t collect_released() noexcept {
        std::lock_guard lock(mutex_);
        return collect();
    }

    /// Serves an allocation on `stream` from the private pool whose route claims it. Returns
    /// nullptr when none does and the stream is not capturing (an ordinary allocation). Throws
    /// capture_error when the stream is capturing and no route claims it, out_of_memory, and what
    /// Platform::query_capture throws; the store is unchanged then.
    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (!routing()) { // every call is checked, and no capture is routed: one query, no lock
            if (platform_type::is_capturing(stream)) throw capture_error(platform_type::stream_key(stream), bytes);
            return nullptr;
        }
        std::lock_guard lock(mutex_);
        route* r = route_for(stream, bytes);
        if (r == nullptr) return nullptr;
        private_pool& p = *r->pool;
        const free_block b = chunks_.take(p, platform_type::stream_key(stream), bytes, alignment);
        if (b.size == 0) {
            throw out_of_memory(bytes, alignment, device_, figures_locked().totals(), "stream_ordered_pool",
                                "capture pool " + text(p.id) + ": no free block fits and no chunk could be taken");
        }
        return reinterpret_cast<void*>(b.address);
    }

    /// Takes back a private block (owns(address)) given back on `stream`.
    void deallocate(stream_type stream, std::uintptr_t address, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        private_pool* p = chunks_.give(platform_type::stream_key(stream), address, bytes);
        if (p != nullptr && !p->routing && p->holds == 0) collect();
    }

    /// The stream is being captured (known from a route, else asked). For a block of the ordinary
    /// pool given back on it: the graph may use it at each replay. True when the query fails.
    [[nodiscard]] bool capturing(stream_type stream) const noexcept {
        if (routing()) {
            std::lock_guard lock(mutex_);
            const std::uintptr_t key = platform_type::stream_key(stream);
            for (const route& r : routes_list_) {
                if (r.origin_key == key) return true;
            }
        }
        try {
            return platform_type::query_capture(stream).capturing();
        } catch (...) {
            report_failure("stream_ordered_pool: asking whether a stream is capturing failed; the block given "
                           "back on it is quarantined");
            return true;
        }
    }

    [[nodiscard]] capture_figures figures() const {
        std::lock_guard lock(mutex_);
        return figures_locked();
    }

private:
    /// An open route: the pool it serves and the streams it claims.
    struct route {
        private_pool* pool;
        filter_type filter;
        std::optional<stream_type> origin;
        /// origin's Platform::stream_key, asked once at begin_route, while the stream surely lives
        /// (no_key without an origin): asking a destroyed stream its key is undefined on CUDA.
        std::uintptr_t origin_key;
        std::uint64_t capture_id; ///< origin's capture id, asked once when first needed (0: not yet)
    };

    /// Ends p's route (mutex_ held): its streams' allocations are ordinary again, and the blocks
    /// given back during the capture join p's common set.
    void close_route(private_pool& p) noexcept {
        std::erase_if(routes_list_, [&](const route& r) { return r.pool == &p; });
        routes_.store(routes_list_.size(), std::memory_order_release);
        update_attention();
        p.routing = false;
        for (auto& [key, set] : p.pending) {
            set.drain([&](const free_block& b) { chunks_.keep_free(p, p.common, b); });
        }
        p.pending.clear();
    }

    /// The route that claims `stream` (mutex_ held), or nullptr for an ordinary stream.
    route* route_for(stream_type stream, std::size_t bytes) {
        const std::uintptr_t key = platform_type::stream_key(stream);
        for (route& r : routes_list_) {
            if (r.origin_key == key) return &r;
        }
        const capture_info info = platform_type::query_capture(stream);
        if (info.capturing() && info.id != 0) {
            for (route& r : routes_list_) {
                if (r.origin && r.capture_id == 0) r.capture_id = platform_type::query_capture(*r.origin).id;
                if (r.capture_id == info.id) return &r;
            }
        }
        for (route& r : routes_list_) {
            if (r.filter && r.filter(stream)) return &r;
        }
        if (info.capturing()) throw capture_error(key, bytes);
        return nullptr;
    }

    /// Gives back the free chunks of pools without holds, when no route is open (mutex_ held).
    /// Waits for the device first: a graph replay may still be using them. Returns the bytes.
    std::size_t collect() noexcept {
        if (!routes_list_.empty()) return 0;
        std::erase_if(pools_, [](const auto& entry) { return entry.second->holds == 0 && entry.second->chunks.empty(); });
        std::vector<private_pool*> released;
        try {
            for (auto& [id, p] : pools_) {
                if (p->holds == 0) released.push_back(p.get());
            }
        } catch (...) {
            return 0;
        }
        const std::size_t given = chunks_.give_back(released);
        std::erase_if(pools_, [](const auto& entry) { return entry.second->holds == 0 && entry.second->chunks.empty(); });
        return given;
    }

    [[nodiscard]] capture_figures figures_locked() const noexcept {
        capture_figures f;
        for (const auto& [id, p] : pools_) {
            f.reserved_bytes += p->reserved;
            f.live_block_bytes += p->block_bytes;
            f.free_bytes += p->common.bytes();
            for (const auto& [key, set] : p->pending) f.free_bytes += set.bytes();
            f.lost_bytes += p->lost;
            f.chunks += p->chunks.size();
        }
        chunks_.add_to(f);
        f.pools = pools_.size();
        f.routes = routes_list_.size();
        return f;
    }

    /// Tells the owner, after a change of the routes (mutex_ held, or at construction), whether its
    /// common path may serve calls: while nothing about captures concerns it (no route is open,
    /// every call is not checked) and it is not always careful. Its deallocate also asks owns(),
    /// so that private chunks kept for the life of the process (graphs replayed to the end) leave
    /// the common path to every stream that is not capturing.
    void update_attention() noexcept { quiet_(!every_call_ && !always_careful_ && routes_list_.empty()); }

    /// The key of no stream (a route without an origin).
    static constexpr std::uintptr_t no_key = ~std::uintptr_t{0};

    const bool every_call_;
    const bool always_careful_;
    const quiet_type quiet_;
    const int device_;

    mutable custody::detail::mutex mutex_;
    std::map<capture_pool_id, std::unique_ptr<private_pool>> pools_;
    std::set<capture_pool_id> retired_; ///< ids released for good: one small node per released id
    std::vector<route> routes_list_;
    std::atomic<std::size_t> routes_{0}; ///< == routes_list_.size(), read without the lock
    std::atomic<std::uint64_t> next_id_{0};
    private_chunks<Upstream> chunks_;    ///< guarded by mutex_ (owns() and reserved_bytes() are lock-free)
};

} // namespace custody::pool::detail
