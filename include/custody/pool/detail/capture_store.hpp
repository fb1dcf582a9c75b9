/// @file
/// `capture_store`: the capture-private pools of one stream_ordered_pool: which streams' allocations
/// go to which private pool while a graph is captured, the private pools' chunks and free blocks,
/// and when their memory goes back to the upstream.
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
#include <custody/pool/detail/address_ranges.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/growth.hpp>
#include <custody/pool/detail/size_classes.hpp>

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

/// What a capture_store holds, for the pool's statistics. A plain value.
///   reserved_bytes = live_block_bytes + free_bytes + lost_bytes
struct capture_figures {
    std::size_t reserved_bytes = 0;   ///< chunks held by private pools
    std::size_t live_bytes = 0;       ///< requested bytes of the private blocks handed out
    std::size_t live_block_bytes = 0; ///< the same blocks' bytes, rounded to the granule
    std::size_t free_bytes = 0;       ///< free in private pools (reusable by their later captures only)
    std::size_t lost_bytes = 0;       ///< given back when no host memory could record them: unused until released
    std::size_t pools = 0;            ///< private pools alive (holding memory or held by a graph)
    std::size_t routes = 0;           ///< begin_allocate_to_pool calls not yet ended
    std::size_t chunks = 0;
    std::uint64_t allocations = 0;
    std::uint64_t deallocations = 0;
    std::uint64_t upstream_allocations = 0;
    std::uint64_t upstream_deallocations = 0;

    /// The private pools' share of a resource's statistics (no peaks: the owner keeps those).
    [[nodiscard]] resource_statistics totals() const noexcept {
        resource_statistics s;
        s.live_bytes = live_bytes;
        s.reserved_bytes = reserved_bytes;
        s.allocations = allocations;
        s.deallocations = deallocations;
        s.live_allocations = static_cast<std::size_t>(allocations - deallocations);
        return s;
    }
};

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
///   for each pool p: p.reserved = sum of p.chunks = p.block_bytes + p.common.bytes()
///                    + sum of p.pending[*].bytes() + p.lost
///   p.pending is empty unless p.routing
///   chunk_owner_ and ranges_ hold exactly the chunks of every pool; reserved_ = sum of p.reserved
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

    /// The GPU's large page: a private chunk is growth_step, or the request rounded up to this.
    static constexpr std::size_t chunk_rounding = std::size_t{2} << 20;

    /// Tells the owner whether its common path may serve calls (see update_attention).
    using quiet_type = std::function<void(bool)>;

    /// `always_careful`: the owner looks at every call itself (its checked mode, its annotations);
    /// `quiet(false)` is then said once, here.
    capture_store(Upstream& upstream, int device, std::size_t chunk_alignment, std::size_t growth_step,
                  capture_check check, limit_type may_take, custody::detail::memory_annotations& annotations,
                  bool always_careful = false, quiet_type quiet = [](bool) {})
        : upstream_(upstream), device_(device), chunk_alignment_(chunk_alignment), growth_step_(growth_step),
          every_call_(check == capture_check::every_call), always_careful_(always_careful),
          may_take_(std::move(may_take)), quiet_(std::move(quiet)), annotations_(annotations) {
        update_attention();
    }
    capture_store(const capture_store&) = delete;
    capture_store& operator=(const capture_store&) = delete;

    /// Waits for the device (a replay may still use private memory) and gives every chunk back.
    ~capture_store() {
        std::lock_guard lock(mutex_);
        if (chunk_owner_.empty()) return;
        try {
            synchronize_devices();
        } catch (...) {
            report_failure("stream_ordered_pool: synchronizing the device failed before giving capture memory back");
        }
        for (auto& [base, pool] : chunk_owner_) {
            annotations_.heap_returned(reinterpret_cast<void*>(base));
            upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(base), pool->chunks.at(base), chunk_alignment_);
        }
    }

    /// The pool must look at captures on this call (a route is open, or every call is checked).
    [[nodiscard]] bool watching() const noexcept { return every_call_ || routes_.load(std::memory_order_acquire) != 0; }
    /// Some route is open: a graph is being captured with this pool's knowledge.
    [[nodiscard]] bool routing() const noexcept { return routes_.load(std::memory_order_acquire) != 0; }
    /// `address` lies in private memory. Lock-free; one atomic load while no private chunk exists.
    [[nodiscard, gnu::always_inline]] bool owns(std::uintptr_t address) const noexcept { return ranges_.contains(address); }
    [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved_.load(std::memory_order_relaxed); }

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
        const std::size_t size = align_up(bytes, granule);
        free_block b;
        if (auto pending = p.pending.find(platform_type::stream_key(stream)); pending != p.pending.end()) {
            b = pending->second.take(size, alignment);
        }
        if (b.size == 0) b = p.common.take(size, alignment);
        if (b.size == 0 && grow(p, size, alignment)) b = p.common.take(size, alignment);
        if (b.size == 0) {
            throw out_of_memory(bytes, alignment, device_, figures_locked().totals(), "stream_ordered_pool",
                                "capture pool " + text(p.id) + ": no free block fits and no chunk could be taken");
        }
        p.block_bytes += b.size;
        live_bytes_ += bytes;
        ++allocations_;
        return reinterpret_cast<void*>(b.address);
    }

    /// Takes back a private block (owns(address)) given back on `stream`.
    void deallocate(stream_type stream, std::uintptr_t address, std::size_t bytes) noexcept {
        std::lock_guard lock(mutex_);
        auto it = chunk_owner_.upper_bound(address);
        if (it == chunk_owner_.begin()) return; // unreachable: owns(address)
        --it;
        private_pool& p = *it->second;
        const free_block b{address, align_up(bytes, granule), it->first};
        p.block_bytes -= b.size;
        live_bytes_ -= bytes;
        ++deallocations_;
        if (p.routing) {
            try {
                keep_free(p, p.pending[platform_type::stream_key(stream)], b);
            } catch (...) {
                lose(p, b.size);
            }
        } else {
            keep_free(p, p.common, b);
            if (p.holds == 0) collect();
        }
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
    /// One private pool.
    struct private_pool {
        capture_pool_id id;
        std::size_t holds = 0;       ///< begin_route calls not yet released
        bool routing = false;        ///< a route to it is open
        std::map<std::uintptr_t, std::size_t> chunks; ///< base -> size
        std::size_t reserved = 0;    ///< sum of chunks' sizes
        std::size_t block_bytes = 0; ///< handed out, rounded
        std::size_t lost = 0;
        free_set common;             ///< free for any later allocation routed here
        std::map<std::uintptr_t, free_set> pending; ///< stream key -> given back there during the route
    };
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
            set.drain([&](const free_block& b) { keep_free(p, p.common, b); });
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

    /// Takes a chunk for `size` bytes at `alignment` into p's common set (mutex_ held). Strong.
    /// Under a relaxed capture mode from the start: the owner's limit may ask the device for its
    /// free memory (cudaMemGetInfo), as potentially unsafe as taking the memory.
    bool grow(private_pool& p, std::size_t size, std::size_t alignment) {
        const basic_capture_mode_guard<platform_type> relaxed(capture_mode::relaxed);
        const std::size_t need = size + (alignment > chunk_alignment_ ? alignment - chunk_alignment_ : 0);
        const std::size_t preferred = need <= growth_step_ ? growth_step_ : align_up(need, chunk_rounding);
        const std::size_t tries[2] = {preferred, need}; // the exact need when the preferred chunk is refused
        for (std::size_t i = 0; i < (preferred == need ? 1U : 2U); ++i) {
            const std::size_t n = tries[i];
            if (!may_take_(n)) continue;
            ranges_.reserve(ranges_.size() + 1);
            void* ptr = take_chunk(n);
            if (ptr == nullptr) continue;
            const auto base = reinterpret_cast<std::uintptr_t>(ptr);
            try {
                p.chunks.emplace(base, n);
                try {
                    chunk_owner_.emplace(base, &p);
                    p.common.insert({base, n, base});
                } catch (...) {
                    chunk_owner_.erase(base);
                    throw;
                }
            } catch (...) {
                p.chunks.erase(base);
                upstream_.deallocate(growth_stream_->view(), ptr, n, chunk_alignment_);
                throw;
            }
            ranges_.insert(base, base + n); // room reserved above
            update_attention();
            announce(p, ptr, n);
            p.reserved += n;
            reserved_.fetch_add(n, std::memory_order_relaxed);
            ++upstream_allocations_;
            return true;
        }
        return false;
    }

    /// `n` bytes from the upstream on the store's own stream (made at the first growth), usable by
    /// every stream once taken (the stream is synchronized: it runs nothing else); nullptr when the
    /// upstream has none. Throws what making or synchronizing the stream throws, giving the memory
    /// back first (mutex_ held, relaxed capture mode).
    void* take_chunk(std::size_t n) { return take_waited(upstream_, growth_stream_, device_, n, chunk_alignment_); }

    /// Announces a new chunk of `p` to CUDA's tools: a heap that is one region, named after `p`.
    void announce(const private_pool& p, const void* chunk, std::size_t n) noexcept {
        if (!annotations_.on()) return; // spares the name
        try {
            annotations_.heap_taken(chunk, n, "custody capture pool " + text(p.id), /*whole=*/true);
        } catch (...) { // no memory for the name: the chunk goes unannounced
        }
    }

    void keep_free(private_pool& p, free_set& set, const free_block& b) noexcept {
        try {
            set.insert(b);
        } catch (...) {
            lose(p, b.size);
        }
    }
    void lose(private_pool& p, std::size_t size) noexcept {
        p.lost += size;
        report_failure("stream_ordered_pool: no host memory to record a free capture block; it stays unused until its pool is released");
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
        const auto whole = [](const private_pool& p) {
            return [&p](std::uintptr_t address, std::size_t size) {
                auto c = p.chunks.find(address);
                return c != p.chunks.end() && c->second == size;
            };
        };
        bool any = false;
        for (private_pool* p : released) {
            p->common.for_each([&](const free_block& b) { any = any || whole(*p)(b.address, b.size); });
        }
        if (!any) return 0;
        try {
            synchronize_devices();
        } catch (...) {
            report_failure("stream_ordered_pool: synchronizing the device failed; capture memory is kept for now");
            return 0;
        }
        std::size_t given = 0;
        for (private_pool* p : released) {
            p->common.take_whole_chunks(whole(*p), [&](const free_block& b) {
                p->chunks.erase(b.address);
                chunk_owner_.erase(b.address);
                ranges_.erase(b.address);
                update_attention();
                p->reserved -= b.size;
                reserved_.fetch_sub(b.size, std::memory_order_relaxed);
                annotations_.heap_returned(reinterpret_cast<void*>(b.address));
                upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(b.address), b.size, chunk_alignment_);
                ++upstream_deallocations_;
                given += b.size;
            });
            if (p->chunks.empty()) pools_.erase(p->id);
        }
        return given;
    }

    void synchronize_devices() const {
        if (device_ >= 0) {
            platform_type::synchronize_device(device_);
        } else {
            for (int d = 0; d < platform_type::device_count(); ++d) platform_type::synchronize_device(d);
        }
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
        f.live_bytes = live_bytes_;
        f.pools = pools_.size();
        f.routes = routes_list_.size();
        f.allocations = allocations_;
        f.deallocations = deallocations_;
        f.upstream_allocations = upstream_allocations_;
        f.upstream_deallocations = upstream_deallocations_;
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

    static std::string text(capture_pool_id id) {
        return "{" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}";
    }

    Upstream& upstream_;
    const int device_;
    const std::size_t chunk_alignment_;
    const std::size_t growth_step_;
    const bool every_call_;
    const bool always_careful_;
    const limit_type may_take_;
    const quiet_type quiet_;
    custody::detail::memory_annotations& annotations_;

    mutable custody::detail::mutex mutex_;
    std::optional<typename platform_type::stream> growth_stream_; ///< made at the first growth
    std::map<capture_pool_id, std::unique_ptr<private_pool>> pools_;
    std::set<capture_pool_id> retired_; ///< ids released for good: one small node per released id
    std::map<std::uintptr_t, private_pool*> chunk_owner_; ///< chunk base -> its pool
    std::vector<route> routes_list_;
    std::atomic<std::size_t> routes_{0};  ///< == routes_list_.size(), read without the lock
    std::atomic<std::size_t> reserved_{0};
    std::atomic<std::uint64_t> next_id_{0};
    address_ranges ranges_;
    std::size_t live_bytes_ = 0;
    std::uint64_t allocations_ = 0;
    std::uint64_t deallocations_ = 0;
    std::uint64_t upstream_allocations_ = 0;
    std::uint64_t upstream_deallocations_ = 0;
};

} // namespace custody::pool::detail
