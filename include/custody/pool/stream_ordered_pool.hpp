/// @file
/// `stream_ordered_pool`: a pool of memory taken from an upstream resource in chunks and handed out
/// in stream order, with O(1) size classes per stream, best fit with coalescing for large blocks,
/// safe cross-stream reuse, limits, and out-of-memory errors that say why.
///
/// Map of the types (docs/pool.md tells the whole design):
///   stream_ordered_pool<Upstream>   the resource
///     shard                         per stream: its lock, its event, its size-class lists and
///                                   free spans (all given back on that stream)
///     shared_                       free spans any stream may use at once (fresh chunks, and
///                                   streams' blocks once their work is known to have finished)
///   Memory is segregated by kind: small chunks serve the size classes (<= 1 MiB), large chunks
///   the larger requests, so that long-lived small blocks never pin holes into the ranges large
///   requests need (the classic fragmentation of mixed lifetimes).
///     chunks_                       what was taken from the upstream
///   pool_options, reuse_policy      pool/pool_options.hpp
///   pool_statistics                 pool/pool_statistics.hpp
///   capture_error                   pool/capture_error.hpp
#pragma once

#include <custody/core/detail/atomic_peak.hpp>
#include <custody/core/detail/format.hpp>
#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/report.hpp>
#include <custody/core/statistics.hpp>
#include <custody/pool/capture_error.hpp>
#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/chunk_map.hpp>
#include <custody/pool/detail/class_lists.hpp>
#include <custody/pool/detail/event_pool.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/growth.hpp>
#include <custody/pool/detail/recent_blocks.hpp>
#include <custody/pool/detail/shard.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/size_classes.hpp>
#include <custody/pool/detail/spin_mutex.hpp>
#include <custody/pool/detail/stream_table.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/pool_statistics.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace custody::pool {

/// A stream-ordered pool over `Upstream` (held by value, constructed in place from the
/// constructor's trailing arguments; the pool keeps it alive and gives every chunk back to it).
///
/// **Sizes.** Every block is a multiple of 256 bytes. Requests up to 1 MiB are rounded up to one of
/// 144 size classes (at most 6.25% above the request) and served from the calling stream's list
/// for that class in O(1); larger requests are rounded up to 256 bytes and served from the
/// stream's four most recent large blocks when one has exactly that size (O(1)), else by best fit
/// from the stream's own large spans, then from the shared free set, splitting the block and
/// coalescing free neighbours when blocks come back (O(log n)). Size-class blocks are carved (best
/// fit) from chunks of their own, apart from large blocks. See pool/detail/size_classes.hpp.
///
/// **Stream semantics.** allocate(s, ...) returns memory usable by work enqueued on s after the
/// call. deallocate(s, p, ...) puts p in s's cache, so p is reused at once by later allocations
/// on s (they are ordered after the work that used p). Another stream t gets p only once s's
/// event, recorded on s after the free (every pool_options::record_interval frees or
/// record_bytes bytes given back on s, or when s's blocks move into its spans), covers it, and then as the reuse_policy allows: once that
/// event has completed (opportunistic), or after making t wait on it (follow_dependencies), or,
/// under same_stream, only by the last-resort reclaim, which waits on the host (for the event,
/// or for the whole device when blocks are not yet covered). The synchronous pair acts on the
/// default stream. The common path makes no driver call.
/// Streams must belong to the pool's device (std::invalid_argument otherwise).
///
/// **Graph capture.** An allocation on a stream being captured throws capture_error and changes
/// nothing: the pool never records events nor synchronizes during capture. A block given back on a
/// capturing stream is quarantined: never reused, returned to the upstream only when the pool ends.
///
/// **Growth and limits.** Chunks come from the upstream through custody::try_allocate on the
/// default stream: pool_options::initial_size at construction, then chunks of
/// max(growth_step, reserved / growth_divisor) (whole 2 MiB pages once above 2 MiB), never beyond
/// maximum_size nor the device budget (device_headroom). A large block cut from a chunk keeps the
/// free rest of the chunk behind it on its stream when that rest is too small for any large
/// request. trim() gives back every chunk that is wholly free. Before throwing out_of_memory the
/// pool waits for every stream's event, moves every cached block to the shared set (coalescing
/// across streams), gives wholly free chunks back to the upstream and retries once; the error then
/// carries live, reserved, largest free block, free bytes per stream and fragmentation. Live blocks and counters
/// are unchanged by a failed call (only the reserve may have shrunk by the chunks given back).
///
/// **Thread safety.** Thread-safe. The common path (a size-class hit, and every deallocate) takes
/// only the calling stream's shard lock (a spin lock), found without locking in a fixed table; two
/// threads on two streams never share a lock there, nor write a shared cache line: live bytes are
/// counted per stream, and the exact peak is kept with per-stream credits (see detail/peak_counter.hpp). The
/// slow paths take the shared set's mutex.
///
/// **Ownership.** Owns its chunks and events. Blocks still out when the pool is destroyed are
/// reported through custody::report_failure, and their memory is given back all the same.
/// Neither copyable nor movable. Equality: identity.
template <stream_ordered_resource Upstream>
class stream_ordered_pool final {
public:
    using upstream_type = Upstream;
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using event_type = typename platform_type::event;

    static constexpr const char* name = "stream_ordered_pool";
    /// The largest alignment served: a page.
    static constexpr std::size_t max_alignment = custody::max_alignment;
    static constexpr std::size_t granule = detail::granule;
    static constexpr std::size_t small_threshold = detail::small_threshold;
    /// The GPU's large page, which cudaMalloc rounds every allocation to: a chunk for one large
    /// request is its size rounded up to this, a chunk sized by growth_divisor is rounded down to it.
    static constexpr std::size_t chunk_rounding = detail::chunk_rounding;
    /// The alignment chunks are requested with: the upstream's largest (when it declares one),
    /// at most a page, at least the granule. Larger alignments are served by splitting.
    static constexpr std::size_t chunk_alignment = [] {
        if constexpr (requires { Upstream::max_alignment; }) {
            return std::clamp<std::size_t>(Upstream::max_alignment, detail::granule, custody::max_alignment);
        } else {
            return detail::granule;
        }
    }();

    /// Builds the pool with `options` over an upstream constructed from `upstream_args`.
    /// Throws out_of_memory if options.initial_size cannot be taken, std::invalid_argument for
    /// options that cannot work (max_streams == 0), and what the platform throws creating events.
    template <class... Args>
    explicit stream_ordered_pool(pool_options options, Args&&... upstream_args)
        : upstream_(std::forward<Args>(upstream_args)...), options_(validated(options)),
          device_(upstream_device()), events_(event_device(), options_.initial_events, options_.event_batch),
          streams_(options_.max_streams),
          growth_(options_), request_limit_(growth_.request_limit()) {
        if (options_.initial_size > 0) {
            std::lock_guard lock(shared_mutex_);
            if (!grow_exactly(block_kind::large, align_up(options_.initial_size, granule))) {
                throw out_of_memory(options_.initial_size, chunk_alignment, device_, statistics(), name,
                                    "the pool's initial size could not be taken from its upstream");
            }
        }
    }

    /// A pool with the default options (pool_options{}).
    stream_ordered_pool()
        requires std::default_initializable<Upstream>
        : stream_ordered_pool(pool_options{}) {}

    stream_ordered_pool(const stream_ordered_pool&) = delete;
    stream_ordered_pool& operator=(const stream_ordered_pool&) = delete;

    /// Waits for the work recorded on every stream's event, reports blocks still out, and gives
    /// every chunk back to the upstream.
    ~stream_ordered_pool() {
        bool uncovered = false;
        streams_.for_each([&](shard& sh) {
            uncovered = uncovered || sh.dirty(options_.record_interval);
            try {
                sh.event.synchronize();
            } catch (...) {
                report_failure("stream_ordered_pool: waiting for a stream's event failed at destruction");
            }
        });
        if (uncovered) {
            try {
                synchronize_devices();
            } catch (...) {
                report_failure("stream_ordered_pool: synchronizing the device failed at destruction");
            }
        }
        const resource_statistics s = statistics();
        if (s.live_allocations != 0) {
            char line[256];
            const int len = std::snprintf(line, sizeof line,
                                          "stream_ordered_pool destroyed with %zu blocks (%zu bytes) still "
                                          "allocated; their memory goes back to the upstream now",
                                          s.live_allocations, s.live_bytes);
            report_failure(std::string_view(line, len > 0 ? static_cast<std::size_t>(len) : 0U));
        }
        std::lock_guard lock(shared_mutex_);
        chunks_.for_each([&](std::uintptr_t base, std::size_t size) {
            upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(base), size, chunk_alignment);
        });
        streams_.for_each([&](shard& sh) { events_.release(std::move(sh.event)); });
    }

    // ---- the resource contract --------------------------------------------------------------

    /// Returns `bytes` bytes aligned to `alignment`, usable by work enqueued on `stream` after
    /// the call. O(1) for a size-class hit on this stream; see the class comment otherwise.
    /// Throws std::invalid_argument (bad alignment, stream of another device), capture_error,
    /// out_of_memory; the pool is unchanged after any of them.
    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (!is_pow2(alignment) || alignment > max_alignment) [[unlikely]] check_alignment(alignment, max_alignment);
        if (bytes == 0) return nullptr;
        if (platform_type::is_capturing(stream)) throw capture_error(platform_type::stream_key(stream), bytes);
        if (bytes > request_limit_) throw_out_of_memory(bytes, alignment, "the request exceeds the pool's limits");
        const detail::request r = detail::classify(bytes, alignment);
        shard* sh = shard_for(stream);
        if (r.small() && sh != nullptr) {
            if (void* p = pop_class(*sh, r)) return p;
        }
        void* p = allocate_slow(stream, sh, r);
        on_allocated_slow(sh, r);
        return p;
    }

    /// Gives `ptr` back on `stream`: reusable at once on `stream`, on other streams as the
    /// reuse_policy allows. `bytes` and `alignment` must be those of the allocation.
    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        const detail::request r = detail::classify(bytes, alignment);
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        bool capturing = true;
        try {
            capturing = platform_type::is_capturing(stream);
        } catch (...) {
        }
        if (capturing) {
            quarantine(address, r.size);
            on_deallocated_slow(r);
            return;
        }
        shard* sh = nullptr;
        try {
            sh = shard_for(stream);
        } catch (...) {
        }
        if (sh == nullptr) {
            give_back_synchronously(stream, address, r.size);
            on_deallocated_slow(r);
            return;
        }
        bool stored = false;
        {
            std::lock_guard lock(sh->mutex);
            try {
                if (r.small()) {
                    sh->classes.push(r.size_class, address);
                } else {
                    keep_recent(*sh, stream, {address, r.size, 0}); // its chunk is looked up when it leaves recent
                }
                stored = true;
            } catch (...) {
            }
            if (stored && sh->stored(r.size, options_.record_bytes)) [[unlikely]] cover(*sh, stream);
            sh->on_deallocated(r);
        }
        if (!stored) lose(r.size);
    }

    /// allocate on the default stream.
    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        return allocate(stream_type{}, bytes, alignment);
    }
    /// deallocate on the default stream.
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        deallocate(stream_type{}, ptr, bytes, alignment);
    }

    /// Counters of the whole pool. Exact when no call is in flight; O(streams) (each shard's
    /// lock is taken briefly to read its counters).
    [[nodiscard]] resource_statistics statistics() const {
        counters c = slow_.load();
        streams_.for_each([&](shard& sh) {
            std::lock_guard lock(sh.mutex);
            c += sh.counts;
        });
        return totals(c);
    }

    /// Everything statistics() says and where the free memory is (see pool_statistics).
    [[nodiscard]] pool_statistics detailed_statistics() const {
        pool_statistics p;
        counters c = slow_.load();
        streams_.for_each([&](shard& sh) {
            std::lock_guard lock(sh.mutex);
            c += sh.counts;
            p.per_stream.push_back({sh.key, sh.cached});
            p.stream_cached_bytes += sh.cached;
            p.largest_free_block = std::max(p.largest_free_block, sh.largest());
        });
        {
            std::lock_guard lock(shared_mutex_);
            for (const auto& set : shared_) {
                p.shared_free_bytes += set.bytes();
                p.largest_free_block = std::max(p.largest_free_block, set.largest());
            }
            p.chunks = chunks_.count();
            p.quarantined_bytes = quarantined_bytes_.load(std::memory_order_relaxed);
        }
        p.totals = totals(c);
        p.live_block_bytes = static_cast<std::size_t>(c.block_bytes);
        p.streams = streams_.size();
        p.fast_allocations = c.allocations - slow_.allocations();
        p.upstream_allocations = chunks_.added();
        p.upstream_deallocations = chunks_.removed();
        p.opportunistic_reuses = activity_.opportunistic_reuses.load(std::memory_order_relaxed);
        p.dependency_waits = activity_.dependency_waits.load(std::memory_order_relaxed);
        p.reclaims = activity_.reclaims.load(std::memory_order_relaxed);
        p.failures = activity_.failures.load(std::memory_order_relaxed);
        return p;
    }

    /// Waits for every stream's event (on the host), moves every cached block to the shared set
    /// (coalescing), and gives every wholly free chunk back to the upstream. Returns the bytes
    /// given back. Blocks while streams finish the work recorded before their frees.
    std::size_t trim() {
        reclaim();
        std::lock_guard lock(shared_mutex_);
        return release_free_chunks();
    }

    /// The device the pool's memory belongs to (the upstream's; -1 when it has none).
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] const pool_options& options() const noexcept { return options_; }
    [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
    [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }

    friend bool operator==(const stream_ordered_pool& a, const stream_ordered_pool& b) noexcept { return &a == &b; }
    CUSTODY_FORWARD_PROPERTIES(stream_ordered_pool, Upstream)

private:
    using block_kind = detail::block_kind;

    using counters = detail::counters;
    using shard = detail::shard<event_type>;

    /// The pool-wide counters with the call counts `c` summed over the shards.
    [[nodiscard]] resource_statistics totals(const counters& c) const noexcept {
        resource_statistics s;
        s.live_bytes = static_cast<std::size_t>(std::max<std::int64_t>(c.live_bytes, 0));
        s.peak_live_bytes = std::max(peak_.peak(), s.live_bytes);
        s.reserved_bytes = chunks_.reserved();
        s.peak_reserved_bytes = chunks_.peak_reserved();
        s.allocations = c.allocations;
        s.deallocations = c.deallocations;
        s.live_allocations = static_cast<std::size_t>(c.allocations - c.deallocations);
        return s;
    }

    // ---- construction helpers ----

    static pool_options validated(pool_options o) {
        if (o.max_streams == 0) throw std::invalid_argument("custody: pool_options::max_streams must be at least 1");
        if (o.growth_step == 0) o.growth_step = granule;
        if (o.record_interval == 0) o.record_interval = 1;
        o.growth_step = align_up(o.growth_step, granule);
        return o;
    }
    int upstream_device() const {
        if constexpr (device_bound_resource<Upstream>) {
            return upstream_.device();
        } else {
            return -1;
        }
    }
    int event_device() const { return device_ >= 0 ? device_ : platform_type::current_device(); }

    // ---- shards ----

    /// The stream's shard, made at its first use; nullptr when max_streams shards exist.
    /// Lock-free when the shard exists.
    shard* shard_for(stream_type stream) {
        const std::uintptr_t key = platform_type::stream_key(stream);
        if (shard* sh = streams_.find(key)) return sh;
        return streams_.find_or_create(key, [&] {
            if (device_ >= 0 && !(stream == stream_type{}) && platform_type::stream_device(stream) != device_) {
                throw std::invalid_argument("custody: stream of device " +
                                            std::to_string(platform_type::stream_device(stream)) +
                                            " used with a pool of device " + std::to_string(device_));
            }
            return std::make_unique<shard>(key, events_.acquire(), options_.record_interval);
        });
    }

    // ---- the fast path ----

    void* pop_class(shard& sh, const detail::request& r) {
        std::uintptr_t address = 0;
        std::size_t owed = 0;
        {
            std::lock_guard lock(sh.mutex);
            address = sh.classes.pop(r.size_class, r.alignment);
            if (address == 0) return nullptr;
            sh.cached -= r.size;
            owed = sh.on_allocated(r);
        }
        if (owed != 0) [[unlikely]] commit(owed);
        return reinterpret_cast<void*>(address);
    }

    /// Records the shard's event on its stream (its lock held), so that it covers every block the
    /// shard holds.
    void cover(shard& sh, stream_type stream) noexcept {
        record_noexcept(sh, stream);
        sh.on_recorded(options_.record_interval);
    }


    void record_noexcept(shard& sh, stream_type stream) noexcept {
        try {
            sh.event.record(stream);
        } catch (...) {
            // The event no longer covers this free: make the free complete before anyone can
            // take the block, so no other stream can see it early.
            try {
                platform_type::synchronize(stream);
            } catch (...) {
            }
            report_failure("stream_ordered_pool: recording a stream's event failed; synchronized the stream instead");
        }
    }

    // ---- the slow path ----

    void* allocate_slow(stream_type stream, shard* sh, const detail::request& r) {
        const std::size_t bytes = r.bytes, size = r.size, alignment = r.alignment;
        const bool small = r.small();
        const block_kind kind = r.kind;
        // 1. This stream's own recent large blocks (exact size), then its spans.
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            if (!small) {
                if (void* p = take_recent(*sh, size, alignment)) return p;
            }
            if (!sh->spans[kind].empty()) {
                const detail::free_block b = sh->spans[kind].take(size, alignment);
                if (b.size != 0) {
                    sh->cached -= b.size;
                    return reinterpret_cast<void*>(b.address);
                }
            }
        }
        // 2. The shared set.
        if (void* p = take_shared(sh, kind, size, alignment)) return p;
        // 3. Other streams' caches, as the policy allows.
        if (options_.reuse != reuse_policy::same_stream) {
            if (drain_completed(sh)) {
                if (void* p = take_shared(sh, kind, size, alignment)) return p;
            }
            if (options_.reuse == reuse_policy::follow_dependencies && sh != nullptr) {
                if (void* p = take_with_dependency(stream, *sh, r)) return p;
            }
        }
        // 3b. This stream's size-class lists, merged into its spans, when they hold more than 1/128
        //     of the reserve (a quarter of a growth chunk): memory cached for other sizes then
        //     serves this one before the pool grows (what keeps the reserve near the live bytes),
        //     and the lists refill by that much between two merges (what keeps merging rare). Only
        //     the small-kind spans serve here: the stream's large spans hold the rests of its large
        //     blocks' chunks (take_tail), and a long-lived small block there would keep the chunk
        //     from serving its large request again, making the large kind grow.
        if (small && sh != nullptr &&
            flush_classes(*sh, stream, std::max(size, chunks_.reserved() / 128))) {
            std::lock_guard lock(sh->mutex);
            const detail::free_block b = sh->spans[block_kind::small].take(size, alignment);
            if (b.size != 0) {
                sh->cached -= b.size;
                return reinterpret_cast<void*>(b.address);
            }
        }
        //     For a large request, the recent large blocks merge into the spans the same way.
        if (!small && sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            if (!sh->recent.empty()) {
                if (!sh->recent.all_covered()) cover(*sh, stream);
                merge_recent(*sh, sh->recent.size());
                const detail::free_block b = sh->spans[block_kind::large].take(size, alignment);
                if (b.size != 0) {
                    sh->cached -= b.size;
                    return reinterpret_cast<void*>(b.address);
                }
            }
        }
        // 4. Grow (by enough that an aligned block fits whatever the chunk's own alignment).
        const std::size_t need = size + (alignment > chunk_alignment ? alignment - chunk_alignment : 0);
        {
            std::unique_lock lock(shared_mutex_);
            if (grow(kind, need)) {
                const detail::free_block b = shared_[kind].take(size, alignment);
                if (b.size != 0) {
                    const detail::free_block tail = take_tail(sh, kind, b);
                    lock.unlock();
                    keep_tail(sh, tail);
                    return reinterpret_cast<void*>(b.address);
                }
            }
            // The pool may not grow: chunks of the other kind serve too (segregation is a preference).
            const detail::free_block b = shared_[other(kind)].take(size, alignment);
            if (b.size != 0) return reinterpret_cast<void*>(b.address);
        }
        //    ... and so do this stream's spans of the other kind, without waiting for anything.
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            if (!sh->recent.empty()) {
                if (!sh->recent.all_covered()) cover(*sh, stream);
                merge_recent(*sh, sh->recent.size());
            }
            const detail::free_block b = sh->spans[other(kind)].take(size, alignment);
            if (b.size != 0) {
                sh->cached -= b.size;
                return reinterpret_cast<void*>(b.address);
            }
        }
        // 5. Last resort: wait for every stream, coalesce everything, give free chunks back, retry once.
        activity_.count(activity_.reclaims);
        reclaim();
        {
            std::lock_guard lock(shared_mutex_);
            detail::free_block b = shared_[kind].take(size, alignment);
            if (b.size == 0) b = shared_[other(kind)].take(size, alignment);
            if (b.size == 0) {
                release_free_chunks();
                if (grow(kind, need)) b = shared_[kind].take(size, alignment);
            }
            if (b.size != 0) return reinterpret_cast<void*>(b.address);
        }
        activity_.count(activity_.failures);
        throw_out_of_memory(bytes, alignment, {});
    }

    void* take_shared(shard* sh, block_kind kind, std::size_t size, std::size_t alignment) {
        detail::free_block b, tail;
        {
            std::lock_guard lock(shared_mutex_);
            if (shared_[kind].empty()) return nullptr;
            b = shared_[kind].take(size, alignment);
            if (b.size == 0) return nullptr;
            tail = take_tail(sh, kind, b);
        }
        keep_tail(sh, tail);
        return reinterpret_cast<void*>(b.address);
    }

    /// For a large block `b` just cut from the shared set for stream `sh` (shared_mutex_ held): the
    /// free rest of its chunk right behind it, when too small to serve any large request alone,
    /// taken out for the stream to keep beside `b`. A 1.3 MiB block in a 2 MiB chunk otherwise
    /// leaves 0.7 MiB in the shared set while the block comes back to the stream's spans: the two
    /// never coalesce, and the next large request of another size needs a chunk of its own.
    detail::free_block take_tail(const shard* sh, block_kind kind, const detail::free_block& b) noexcept {
        if (kind != block_kind::large || sh == nullptr) return {};
        detail::free_block tail = shared_[block_kind::large].take_at(b.address + b.size, b.chunk, small_threshold + granule);
        tail.kind = block_kind::large;
        return tail;
    }

    /// Puts a tail from take_tail into the stream's large spans (back into the shared set when
    /// there is no host memory for it).
    void keep_tail(shard* sh, const detail::free_block& tail) noexcept {
        if (tail.size == 0) return;
        {
            std::lock_guard lock(sh->mutex);
            try {
                sh->spans[block_kind::large].insert(tail);
                sh->cached += tail.size;
                return;
            } catch (...) {
            }
        }
        std::lock_guard lock(shared_mutex_);
        try {
            shared_[block_kind::large].insert(tail);
        } catch (...) {
            lose(tail.size);
        }
    }

    /// Moves the covered blocks of other streams whose event has completed to the shared set.
    /// True when anything moved.
    bool drain_completed(const shard* self) {
        bool moved = false;
        streams_.for_each([&](shard& other) {
            if (&other == self) return;
            std::vector<detail::free_block> blocks;
            {
                std::lock_guard lock(other.mutex);
                if (other.cached == 0 || !other.event.ready()) return;
                blocks = take_blocks(other, true);
            }
            if (blocks.empty()) return;
            to_shared(std::move(blocks));
            activity_.count(activity_.opportunistic_reuses);
            moved = true;
        });
        return moved;
    }

    /// Follow dependencies: finds a fitting covered block in another stream's cache, makes
    /// `stream` wait on that stream's event (no host synchronization) and takes the block.
    void* take_with_dependency(stream_type stream, shard& self, const detail::request& r) {
        const bool small = r.small();
        const std::size_t size = r.size, alignment = r.alignment;
        void* result = nullptr;
        const std::size_t c = r.size_class;
        streams_.for_each([&](shard& other) {
            if (result != nullptr || &other == &self) return;
            std::lock_guard lock(other.mutex);
            if (other.cached == 0) return;
            if (small) {
                if (const std::uintptr_t a = other.classes.take_newest_covered(c, alignment)) {
                    platform_type::wait(stream, other.event);
                    result = reinterpret_cast<void*>(a);
                    other.cached -= size;
                }
            }
            const block_kind kind = r.kind;
            if (result == nullptr && !small && other.recent.covered() != 0) {
                merge_recent(other, other.recent.covered());
            }
            if (result == nullptr && other.spans[kind].fits(size, alignment)) {
                platform_type::wait(stream, other.event);
                const detail::free_block b = other.spans[kind].take(size, alignment);
                other.cached -= b.size;
                result = reinterpret_cast<void*>(b.address);
            }
            if (result != nullptr) activity_.count(activity_.dependency_waits);
        });
        return result;
    }

    /// Keeps a large block given back on this shard's stream among its recent blocks (its lock
    /// held); the oldest recent block moves to the spans when there is no room (after a record,
    /// when it is not yet covered). Throws bad_alloc (from the spans) with the shard unchanged.
    void keep_recent(shard& sh, stream_type stream, const detail::free_block& b) {
        if (sh.recent.full()) {
            if (sh.recent.covered() == 0) cover(sh, stream);
            const detail::free_block oldest = chunks_.locate(sh.recent.oldest());
            sh.spans[oldest.kind].insert(oldest);
            sh.recent.pop_oldest();
        }
        sh.recent.push(b);
    }

    /// Takes a recent block of exactly `size` bytes suitably aligned, newest first (lock held).
    void* take_recent(shard& sh, std::size_t size, std::size_t alignment) noexcept {
        const std::uintptr_t address = sh.recent.take_exact(size, alignment);
        if (address == 0) return nullptr;
        sh.cached -= size;
        return reinterpret_cast<void*>(address);
    }

    /// Moves the `count` oldest recent blocks (covered ones: count <= recent.covered()) into the
    /// spans, coalescing (lock held). A bad_alloc leaves the blocks not yet moved among the recent.
    void merge_recent(shard& sh, std::size_t count) noexcept {
        try {
            for (; count != 0; --count) {
                const detail::free_block b = chunks_.locate(sh.recent.oldest());
                sh.spans[b.kind].insert(b);
                sh.recent.pop_oldest();
            }
        } catch (...) {
        }
    }

    /// Moves a shard's size-class blocks into its spans, coalescing them, when they hold at least
    /// `threshold` bytes; records the event first when some are not covered (the spans hold only
    /// covered blocks). True when any moved.
    bool flush_classes(shard& sh, stream_type stream, std::size_t threshold) {
        std::lock_guard lock(sh.mutex);
        const std::size_t in_spans = sh.spans[block_kind::small].bytes() + sh.spans[block_kind::large].bytes();
        if (sh.cached - in_spans - sh.recent.bytes() < threshold) return false;
        const std::size_t count = sh.classes.count(false);
        if (count == 0) return false;
        // Sorted by address, blocks cut one after another from a span (a request's KV pages)
        // form runs that go into the tree as one block: one insert per run, not per block.
        std::vector<detail::free_block> blocks;
        blocks.reserve(count); // may throw: nothing has moved yet
        if (sh.dirty(options_.record_interval)) cover(sh, stream);
        sh.classes.take(false, [&](std::uintptr_t a, std::size_t size) { blocks.push_back({a, size, 0}); });
        sh.cached -= chunks_.insert_runs(blocks, sh.spans, [&](std::size_t size) { lose(size); });
        return true;
    }

    /// Takes a shard's blocks (its lock held) into a list: the covered ones, or all of them.
    /// Strong: throws bad_alloc before taking anything.
    std::vector<detail::free_block> take_blocks(shard& sh, bool covered_only) {
        std::vector<detail::free_block> blocks;
        const std::size_t recent = covered_only ? sh.recent.covered() : sh.recent.size();
        std::size_t count = sh.spans[block_kind::small].count() + sh.spans[block_kind::large].count() + recent;
        count += sh.classes.count(covered_only);
        blocks.reserve(count);
        // chunk: looked up later; the blocks left, if any, came after the last record
        sh.classes.take(covered_only, [&](std::uintptr_t a, std::size_t size) { blocks.push_back({a, size, 0}); });
        sh.recent.take_oldest(recent, [&](const detail::free_block& b) { blocks.push_back(b); });
        for (block_kind kind : detail::block_kinds) {
            sh.spans[kind].drain([&](detail::free_block b) {
                b.kind = kind;
                blocks.push_back(b);
            });
        }
        for (const auto& b : blocks) sh.cached -= b.size;
        if (!covered_only) {
            sh.to_record = options_.record_interval;
            sh.uncovered_bytes = 0;
        }
        return blocks;
    }

    /// Inserts blocks into the shared set, coalescing. A block that cannot be stored (no host
    /// memory for a node) is reported and counted lost.
    void to_shared(std::vector<detail::free_block> blocks) noexcept {
        std::lock_guard lock(shared_mutex_);
        chunks_.insert_runs(blocks, shared_, [&](std::size_t size) { lose(size); });
    }

    /// Moves every stream's cache to the shared set once its blocks are idle: a stream whose
    /// blocks are all covered is waited for through its event, the others through one
    /// synchronization of the device (their streams may be gone; the device has their work).
    void reclaim() {
        std::vector<std::vector<detail::free_block>> taken;
        taken.reserve(streams_.size()); // no allocation once blocks are out
        bool uncovered = false;
        streams_.for_each([&](shard& sh) {
            if (taken.size() == taken.capacity()) return; // a shard created during the reclaim
            std::lock_guard lock(sh.mutex);
            if (sh.cached == 0) return;
            if (!sh.dirty(options_.record_interval)) {
                sh.event.synchronize();
            } else {
                uncovered = true;
            }
            taken.push_back(take_blocks(sh, false));
        });
        if (uncovered) {
            try {
                synchronize_devices();
            } catch (...) {
                // Their work may still be running: they are never reused.
                for (const auto& blocks : taken) {
                    for (const auto& b : blocks) quarantine(b.address, b.size);
                }
                throw;
            }
        }
        for (auto& blocks : taken) to_shared(std::move(blocks));
    }

    /// Waits for all work on the pool's device (every device, for a pool of no device). Blocks
    /// taken from a shard before this call are idle after it.
    void synchronize_devices() const {
        if (device_ >= 0) {
            platform_type::synchronize_device(device_);
        } else {
            for (int d = 0; d < platform_type::device_count(); ++d) platform_type::synchronize_device(d);
        }
    }

    // ---- growth (shared_mutex_ held) ----

    /// Whether the pool may take `n` more bytes from its upstream now (queries the device's memory
    /// when options.memory_info is set).
    [[nodiscard]] bool within_limits(std::size_t n) const {
        std::optional<device_memory> device;
        if (options_.memory_info != nullptr) device = options_.memory_info(device_);
        return growth_.allows(n, chunks_.reserved(), device);
    }

    /// Takes a chunk of `kind` for a block of `size` bytes: the growth rule's preferred chunk, or
    /// exactly `size` when that much is refused.
    bool grow(block_kind kind, std::size_t size) {
        const std::size_t preferred = growth_.preferred_chunk(size, chunks_.reserved());
        if (preferred != size && grow_exactly(kind, preferred)) return true;
        return grow_exactly(kind, size);
    }

    bool grow_exactly(block_kind kind, std::size_t n) {
        if (!within_limits(n)) return false;
        void* p = custody::try_allocate(upstream_, stream_type{}, n, chunk_alignment);
        if (p == nullptr) return false;
        const auto base = reinterpret_cast<std::uintptr_t>(p);
        try {
            chunks_.add(base, n, kind);
            try {
                shared_[kind].insert({base, n, base, kind});
            } catch (...) {
                chunks_.remove(base);
                throw;
            }
        } catch (...) {
            upstream_.deallocate(stream_type{}, p, n, chunk_alignment);
            throw;
        }
        return true;
    }

    std::size_t release_free_chunks() noexcept {
        std::size_t released = 0;
        for (auto& set : shared_) {
            const auto whole = [&](std::uintptr_t address, std::size_t size) { return chunks_.is_whole(address, size); };
            set.take_whole_chunks(whole, [&](const detail::free_block& b) {
                chunks_.remove(b.address);
                upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(b.address), b.size, chunk_alignment);
                released += b.size;
            });
        }
        return released;
    }

    // ---- odd frees ----

    void quarantine(std::uintptr_t address, std::size_t size) noexcept {
        static_cast<void>(address);
        quarantined_bytes_.fetch_add(size, std::memory_order_relaxed);
    }

    /// For a stream without a shard: wait for it, then the block is idle and any stream may take it.
    void give_back_synchronously(stream_type stream, std::uintptr_t address, std::size_t size) noexcept {
        try {
            platform_type::synchronize(stream);
        } catch (...) {
            report_failure("stream_ordered_pool: synchronizing a stream to give a block back failed");
            quarantine(address, size);
            return;
        }
        std::lock_guard lock(shared_mutex_);
        try {
            const detail::free_block b = chunks_.locate({address, size, 0});
            shared_[b.kind].insert(b);
        } catch (...) {
            lose(size);
        }
    }

    void lose(std::size_t size) noexcept {
        quarantined_bytes_.fetch_add(size, std::memory_order_relaxed);
        report_failure("stream_ordered_pool: no host memory to record a free block; it stays unused until the pool ends");
    }

    // ---- counters ----

    /// Adds live bytes no credit covered to the peak counter (see peak_counter). Call with no
    /// shard lock held.
    void commit(std::size_t bytes) noexcept {
        peak_.commit(bytes, [&](detail::peak_counter::reclaimer& reclaim) {
            streams_.for_each([&](shard& sh) {
                if (!reclaim.wanted()) return;
                std::lock_guard lock(sh.mutex);
                reclaim.take(sh.credit);
            });
        });
    }
    void on_allocated_slow(shard* sh, const detail::request& r) noexcept {
        std::size_t owed = r.bytes;
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            owed = sh->charge(r.bytes);
        }
        slow_.allocated(r.size, sh != nullptr ? 0 : r.bytes);
        if (owed != 0) commit(owed);
    }
    /// A block given back without a shard (a capturing stream, or one past max_streams).
    void on_deallocated_slow(const detail::request& r) noexcept {
        slow_.deallocated(r.size, r.bytes);
        peak_.release(r.bytes);
    }

    [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::size_t alignment, std::string reason) const {
        const pool_statistics p = detailed_statistics();
        std::string d = reason.empty() ? std::string() : reason + "; ";
        d += "pool: live " + std::to_string(p.totals.live_bytes) + " B (" + std::to_string(p.live_block_bytes) +
             " B in blocks), reserved " + std::to_string(p.totals.reserved_bytes) + " B in " +
             std::to_string(p.chunks) + " chunks, largest free block " + std::to_string(p.largest_free_block) +
             " B, shared free " + std::to_string(p.shared_free_bytes) + " B, free per stream [";
        bool first = true;
        for (const auto& s : p.per_stream) {
            d += (first ? "" : ", ") + custody::detail::to_hex(s.stream_key) + ": " + std::to_string(s.bytes) + " B";
            first = false;
        }
        char ratio[96];
        std::snprintf(ratio, sizeof ratio, "], fragmentation %.3f (reserved/live), %.3f (1 - largest/free)",
                      p.totals.live_bytes == 0 ? 0.0
                                               : static_cast<double>(p.totals.reserved_bytes) /
                                                     static_cast<double>(p.totals.live_bytes),
                      p.external_fragmentation());
        d += ratio;
        throw out_of_memory(bytes, alignment, device_, p.totals, name, d);
    }

    // ---- fields ----
    // Lock order: a shard's mutex, then the chunk map's; shared_mutex_, then the chunk map's;
    // the peak counter's, then a shard's mutex. A shard's mutex and shared_mutex_ are never
    // held together, nor is the peak counter's taken while a shard's mutex is held.

    Upstream upstream_;
    pool_options options_;
    int device_;
    detail::event_pool<platform_type> events_;

    detail::stream_table<shard> streams_;             // a shard per stream met, at most max_streams
    detail::growth_rule growth_;
    std::size_t request_limit_;                       // larger requests fail at once (limits, budget)

    mutable std::mutex shared_mutex_;
    detail::per_kind<detail::free_set> shared_;         // [block_kind::small], [block_kind::large]; guarded by shared_mutex_
    detail::chunk_map chunks_;                        // what was taken from the upstream
    std::atomic<std::size_t> quarantined_bytes_{0};   // blocks never reused again (capture, lost)

    // chunks_.reserved() = live block bytes + per-stream cached + shared_[*].bytes() + quarantined_bytes_
    detail::peak_counter peak_;          // live bytes: the shards' counts.live_bytes + slow_'s
    detail::atomic_counters slow_;       // the slow path's allocations, the frees without a shard
    detail::activity_counters activity_;
};

} // namespace custody::pool
