/// @file
/// `stream_ordered_pool`: a pool of memory taken from an upstream resource in chunks and handed out
/// in stream order, with O(1) size classes per stream, best fit with coalescing for large blocks,
/// safe cross-stream reuse, limits, and out-of-memory errors that say why.
///
/// Map of the types (docs/pool.md tells the whole design):
///   stream_ordered_pool<Upstream>   the resource: the fast path, the slow path's ladder,
///                                   cross-stream reuse and the reclaim (this file)
///     streams_   detail::stream_table     a shard per stream, found without a lock
///       shard    detail/shard.hpp         per stream: its lock, its event, its blocks, its counters
///         classes  detail/class_lists.hpp     size-class lists and the covered rule
///         recent   detail/recent_blocks.hpp   the last large blocks given back
///         spans    detail/free_set.hpp        coalesced free spans (best fit)
///     store_     detail/shared_store.hpp  free spans any stream may use, the chunks, growth
///       chunks     detail/chunk_map.hpp       what was taken from the upstream
///       growth     detail/growth.hpp          chunk sizes and limits
///     peak_      detail/peak_counter.hpp  the exact live peak with per-stream credits
///   detail::request (detail/request.hpp): a call classified once (size class, block kind)
///   Memory is segregated by kind: small chunks serve the size classes (<= 1 MiB), large chunks
///   the larger requests, so that long-lived small blocks never pin holes into the ranges large
///   requests need (the classic fragmentation of mixed lifetimes).
///   pool_options, reuse_policy      pool/pool_options.hpp
///   pool_statistics                 pool/pool_statistics.hpp
///   capture_error                   pool/capture_error.hpp
///   capture_store_                  capture-private pools (pool/detail/capture_store.hpp); the
///                                   scope API is pool/capture_scope.hpp
///   annotations_                    what CUDA's tools are told (core/detail/memory_annotations.hpp)
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/discarding.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/platform.hpp>
#include <custody/platform/capture.hpp>
#include <custody/pool/capture_error.hpp>
#include <custody/pool/capture_pool_id.hpp>
#include <custody/pool/detail/capture_store.hpp>
#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/growth.hpp>
#include <custody/pool/detail/live_blocks.hpp>
#include <custody/pool/detail/peak_counter.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/shard.hpp>
#include <custody/pool/detail/shared_store.hpp>
#include <custody/pool/detail/size_classes.hpp>
#include <custody/pool/detail/stream_caches.hpp>
#include <custody/pool/pool_misuse.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/pool_statistics.hpp>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace custody::pool {

/// A stream-ordered pool over `Upstream` (held by value, constructed in place from the
/// constructor's trailing arguments; the pool keeps it alive and gives every chunk back to it).
///
/// **Sizes.** Every block is a multiple of 256 bytes. Requests up to 1 MiB are rounded up to one of
/// 144 size classes (at most 6.25% above the request) and served from the calling stream's list
/// for that class in O(1); larger requests are rounded up to 256 bytes and served from the
/// stream's four most recent large blocks when one has exactly that size (O(1)), else by the
/// tighter of two best fits, the stream's own large spans and the shared free set, splitting the
/// block and coalescing free neighbours when blocks come back (O(log n)). Size-class blocks are carved (best
/// fit) from chunks of their own, apart from large blocks. See pool/detail/size_classes.hpp.
///
/// **Stream semantics.** allocate(s, ...) returns memory usable by work enqueued on s after the
/// call. deallocate(s, p, ...) puts p in s's cache, so p is reused at once by later allocations
/// on s (they are ordered after the work that used p). Another stream t gets p only once s's
/// event, recorded on s after the free (every pool_options::record_interval frees or
/// record_bytes bytes given back on s, or when s's blocks move into its spans), covers it, and
/// then as the reuse_policy allows: once that
/// event has completed (opportunistic), or after making t wait on it (follow_dependencies), or,
/// under same_stream, only by the last-resort reclaim, which waits on the host (for the event,
/// or for the whole device when blocks are not yet covered). The synchronous pair acts on the
/// default stream of the pool's device, which it makes current for the call, and its memory is
/// usable at once by the host (a block taken behind another stream's event waits for it on the host). The common path makes no driver call but the platform's identity and capture
/// queries.
/// Streams must belong to the pool's device (std::invalid_argument otherwise).
///
/// **Graph capture.** While a graph is captured with the pool's knowledge (a capture_scope, or
/// begin_allocate_to_pool .. end_allocate_to_pool), allocations on the captured streams come from a
/// capture-private pool named by a capture_pool_id (pool/detail/capture_store.hpp): their addresses
/// stay reserved for the graph's replays and never serve ordinary allocations; release_pool gives
/// the memory back once no graph holds it. Meanwhile the pool records no event on a capturing
/// stream, synchronizes nothing and takes memory under a relaxed capture mode, so captures stay
/// valid. An allocation on a capturing stream that no capture claims throws capture_error; a block
/// of the ordinary pool given back on a capturing stream is quarantined (never reused: a replay may
/// use it). While no capture is open the pool asks the platform nothing (pool_options::check_capture
/// says otherwise). The common path then costs two atomic loads more.
///
/// **Growth and limits.** Chunks come from the upstream through custody::try_allocate on the
/// default stream: pool_options::initial_size at construction, then chunks of
/// max(growth_step, reserved / growth_divisor) (reserved: of the chunks of the request's kind;
/// whole 2 MiB pages once above 2 MiB; for a large request, a whole number of blocks of its size),
/// never beyond maximum_size nor the device budget (device_headroom). A large block cut from a chunk keeps the
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
/// **CUDA's tools.** With pool_options::annotate (the default) and a tool named to NVTX when the
/// pool is built (compute-sanitizer, Nsight Systems), each chunk is announced as a heap and each block as a
/// region from the moment it is handed out until it is given back (a block cached for reuse is
/// not live); a capture-private chunk is one region end to end, as its graphs touch it at every
/// replay. Without a tool: nothing per call (the branch the fast path takes for checked mode
/// covers both).
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
    static constexpr std::size_t chunk_alignment = detail::shared_store<Upstream>::chunk_alignment;

    /// Builds the pool with `options` over an upstream constructed from `upstream_args`.
    /// Throws out_of_memory if options.initial_size cannot be taken, std::invalid_argument for
    /// options that cannot work (max_streams == 0), and what the platform throws creating events.
    template <class... Args>
    explicit stream_ordered_pool(pool_options options, Args&&... upstream_args)
        : upstream_(std::forward<Args>(upstream_args)...), options_(detail::validated(options, upstream_)),
          device_(detail::device_of(upstream_)), annotations_(options_.annotate),
          watched_(options_.checked || annotations_.on()), store_(upstream_, options_, device_, annotations_),
          streams_(options_, device_, store_, activity_, peak_), request_limit_(detail::growth_rule(options_).request_limit()),
          capture_store_(upstream_, device_, chunk_alignment, options_.growth_step, options_.check_capture,
                         [this](std::size_t n) { return store_.may_take(n + capture_store_.reserved_bytes()); },
                         annotations_, watched_) {
        if (options_.initial_size > 0 && !store_.grow_exactly(block_kind::large, align_up(options_.initial_size, granule))) {
            const std::string limits = store_.describe_limits(options_.initial_size);
            throw out_of_memory(options_.initial_size, chunk_alignment, device_, statistics(), name,
                                "the pool's initial size could not be taken from its upstream" +
                                    (limits.empty() ? "" : "; " + limits));
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
        streams_.wait_all();
        detail::report_leaks(statistics());
        store_.release_all();
    }

    // ---- the resource contract --------------------------------------------------------------

    /// Returns `bytes` bytes aligned to `alignment`, usable by work enqueued on `stream` after
    /// the call. O(1) for a size-class hit on this stream; see the class comment otherwise.
    /// Throws std::invalid_argument (bad alignment, stream of another device), capture_error,
    /// out_of_memory; the pool is unchanged after any of them.
    [[gnu::always_inline]] [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (stream == stream_type{}) [[unlikely]] return allocate_sync(bytes, alignment);
        return allocate_on(stream, bytes, alignment);
    }

    /// Gives `ptr` back on `stream`: reusable at once on `stream`, on other streams as the
    /// reuse_policy allows. `bytes` and `alignment` must be those of the allocation. A block given
    /// back on a capturing stream is quarantined; on a stream without a shard (another device's,
    /// or past max_streams), it goes to the shared set once the stream has finished its work.
    [[gnu::always_inline]] void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (stream == stream_type{}) [[unlikely]] return deallocate_sync(ptr, bytes, alignment);
        deallocate_on(stream, ptr, bytes, alignment);
    }

    /// allocate on the default stream of the pool's device (made current for the call): usable
    /// at once by the host and by work on any stream.
    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        const basic_device_guard<platform_type> guard(device_);
        return allocate_on(stream_type{}, bytes, alignment);
    }
    /// deallocate on the default stream of the pool's device (made current for the call).
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        const basic_device_guard<platform_type> guard(device_, std::nothrow);
        deallocate_on(stream_type{}, ptr, bytes, alignment);
    }

    /// Counters of the whole pool. Exact when no call is in flight; O(streams) (each shard's
    /// lock is taken briefly to read its counters).
    [[nodiscard]] resource_statistics statistics() const {
        counters c = slow_.load();
        streams_.for_each([&](shard& sh) {
            std::lock_guard lock(sh.mutex);
            c += sh.counts;
        });
        streams_.add_retired(c);
        return totals(c);
    }

    /// Everything statistics() says and where the free memory is (see pool_statistics).
    [[nodiscard]] pool_statistics detailed_statistics() const {
        pool_statistics p;
        counters c = slow_.load();
        streams_.add_to(p, c);
        streams_.add_retired(c);
        store_.add_to(p);
        const detail::capture_figures f = capture_store_.figures();
        p.capture_reserved_bytes = f.reserved_bytes;
        p.capture_live_block_bytes = f.live_block_bytes;
        p.capture_free_bytes = f.free_bytes + f.lost_bytes;
        p.capture_pools = f.pools;
        p.upstream_allocations += f.upstream_allocations;
        p.upstream_deallocations += f.upstream_deallocations;
        p.totals = totals(c);
        p.live_block_bytes = static_cast<std::size_t>(c.block_bytes);
        p.streams = streams_.size();
        p.fast_allocations = c.allocations - slow_.allocations();
        activity_.add_to(p);
        return p;
    }

    /// Waits for every stream's event (on the host), moves every cached block to the shared set
    /// (coalescing), and gives every wholly free chunk back to the upstream. Returns the bytes
    /// given back. Blocks while streams finish the work recorded before their frees.
    /// While a graph capture is open in the pool it waits for nothing and returns 0. Also gives
    /// back the free memory of released capture pools (docs/pool.md).
    std::size_t trim() {
        if (capture_store_.routing()) return 0;
        streams_.reclaim();
        const std::size_t released = store_.release_free_chunks();
        return released + capture_store_.collect_released();
    }

    // ---- graph capture: the hooks (PyTorch's beginAllocateToPool, endAllocateToPool, releasePool);
    //      pool/capture_scope.hpp builds the C++ scope on them. See docs/pool.md. ----

    /// A capture pool id that no other call returns ({0, n}).
    [[nodiscard]] capture_pool_id make_capture_pool_id() noexcept { return capture_store_.make_id(); }

    /// From now until end_allocate_to_pool(id), allocations on `capturing` (a stream that is being,
    /// or is about to be, captured) and on the streams forked into its capture come from private
    /// pool `id`: made if new, shared if it exists (its graphs must never run concurrently with
    /// this one). Each call holds the pool once more (release_pool drops a hold). Throws
    /// std::invalid_argument when `id` is being allocated to already or was released. Strong.
    void begin_allocate_to_pool(capture_pool_id id, stream_type capturing) {
        capture_store_.begin_route(id, {}, capturing);
    }
    /// The same for the streams `filter` accepts (PyTorch passes one that compares the stream's
    /// capture id with its graph's). The filter is called only while some capture is open in the
    /// pool, under the pool's capture lock, for allocations on streams no route claims otherwise.
    void begin_allocate_to_pool(capture_pool_id id, std::function<bool(stream_type)> filter) {
        capture_store_.begin_route(id, std::move(filter), std::nullopt);
    }
    /// Ends the routing to `id`, after the capture has ended: its blocks given back during the
    /// capture now serve any later capture into `id`. Throws std::invalid_argument when `id` is
    /// not being allocated to.
    void end_allocate_to_pool(capture_pool_id id) { capture_store_.end_route(id); }
    /// Drops one hold on private pool `id` (one per begin_allocate_to_pool; a graph keeps it while
    /// it may be replayed). With none left, the pool's memory goes back to the upstream, after a
    /// device synchronization, as soon as it is free and no capture is open in this pool; blocks
    /// still out return it when given back. Throws std::invalid_argument when `id` holds nothing.
    void release_pool(capture_pool_id id) { capture_store_.release(id); }
    /// A graph capture is routed into the capture-private pools now (begin_allocate_to_pool ..
    /// end_allocate_to_pool): the layers above must not query, synchronize or record events
    /// meanwhile (core/detail/layers.hpp). One atomic load.
    [[nodiscard]] bool capture_underway() const noexcept { return capture_store_.routing(); }

    /// From now on the pool holds at most `bytes` (in place of pool_options::maximum_size, which
    /// options() still reports): it grows no further beyond them, and a request above them fails
    /// at once. What it holds beyond them already stays until trimmed. PyTorch's
    /// set_per_process_memory_fraction, for a pool that serves it. Thread-safe.
    void set_maximum_size(std::size_t bytes) noexcept {
        store_.set_maximum(bytes);
        request_limit_.store(detail::growth_rule(options_).request_limit(bytes), std::memory_order_relaxed);
    }

    /// The device the pool's memory belongs to (the upstream's; -1 when it has none).
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] const pool_options& options() const noexcept { return options_; }
    [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
    [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }

    friend bool operator==(const stream_ordered_pool& a, const stream_ordered_pool& b) noexcept { return &a == &b; }
    CUSTODY_FORWARD_PROPERTIES(stream_ordered_pool, Upstream)
    CUSTODY_FORWARD_DISCARDING(Upstream, upstream_)

private:
    using block_kind = detail::block_kind;
    using counters = detail::counters;
    using shard = typename detail::stream_caches<Upstream>::shard;

    /// The pool-wide counters with the call counts `c` summed over the shards.
    [[nodiscard]] resource_statistics totals(const counters& c) const {
        resource_statistics s = capture_store_.figures().totals();
        s.live_bytes += static_cast<std::size_t>(std::max<std::int64_t>(c.live_bytes, 0));
        s.peak_live_bytes = std::max(peak_.peak(), s.live_bytes);
        s.reserved_bytes += store_.reserved();
        s.peak_reserved_bytes = std::max(store_.peak_reserved(), s.reserved_bytes);
        s.allocations += c.allocations;
        s.deallocations += c.deallocations;
        s.live_allocations += static_cast<std::size_t>(c.allocations - c.deallocations);
        return s;
    }

    // ---- the fast path: a size-class block of the stream's own lists, nothing else to look at ----

    /// allocate, with the pool's device current when `stream` is the default stream. The fast path
    /// reads the request's class, the capture state, the stream's shard and its list under its
    /// lock; everything else goes the careful way.
    [[gnu::always_inline]] void* allocate_on(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (bytes - 1 < capture_store_.fast_limit() && detail::fits_granule(alignment)) [[likely]] {
            const std::uintptr_t key = streams_.key_of(stream);
            if (shard* sh = streams_.find(key)) [[likely]] {
                void* p = nullptr;
                if (pop_class(*sh, key, detail::class_of(bytes), bytes, p)) [[likely]] return p;
            }
        }
        return allocate_careful(stream, bytes, alignment);
    }
    /// deallocate, with the pool's device current when `stream` is the default stream.
    [[gnu::always_inline]] void deallocate_on(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr != nullptr && bytes - 1 < capture_store_.fast_limit()) [[likely]] {
            const std::uintptr_t key = streams_.key_of(stream);
            if (shard* sh = streams_.find(key)) [[likely]] {
                const auto address = reinterpret_cast<std::uintptr_t>(ptr);
                if (streams_.give_back_class(*sh, stream, key, address, detail::class_of(bytes), bytes)) [[likely]] return;
            }
        }
        deallocate_careful(stream, ptr, bytes, alignment);
    }

    /// The newest block of class `c` in the stream's list, for `bytes`, into `p`; false when the
    /// shard no longer serves the stream or the list is empty. (The lock is taken by hand: nothing
    /// in between throws, and a lock_guard is not always inlined.)
    [[gnu::always_inline]] bool pop_class(shard& sh, std::uintptr_t key, std::size_t c, std::size_t bytes, void*& p) noexcept {
        sh.mutex.lock();
        std::uintptr_t address = 0;
        if (!sh.serves(key) || !sh.classes.try_pop(c, address)) [[unlikely]] {
            sh.mutex.unlock();
            return false;
        }
        const std::size_t owed = sh.on_popped(detail::class_size(c), bytes);
        if (owed != 0) [[unlikely]] {
            commit_and_unlock(sh, owed);
        } else {
            sh.mutex.unlock();
        }
        p = reinterpret_cast<void*>(address);
        return true;
    }

    // ---- the careful way: checked mode, captures, validation, large blocks, the slow path ----

    [[gnu::noinline]] void* allocate_careful(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (watched()) [[unlikely]] return allocate_watched(stream, bytes, alignment);
        return take_block(stream, bytes, alignment);
    }
    [[gnu::noinline]] void deallocate_careful(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        if (watched()) [[unlikely]] return deallocate_watched(stream, ptr, bytes, alignment);
        give_block(stream, ptr, bytes, alignment);
    }
    /// Whether calls take the watched path: checked mode, or CUDA's tools told of each block. The
    /// fast path never sees such a pool (its capture flag is 0: see capture_store::fast_limit).
    [[nodiscard]] bool watched() const noexcept { return watched_; }

    void* take_block(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (!is_pow2(alignment) || alignment > max_alignment) [[unlikely]] check_alignment(alignment, max_alignment);
        if (bytes == 0) return nullptr;
        if (bytes > request_limit_.load(std::memory_order_relaxed)) throw_out_of_memory(bytes, alignment, "the request exceeds the pool's limits");
        if (capture_store_.watching()) [[unlikely]] {
            if (void* p = capture_store_.allocate(stream, bytes, alignment)) return p;
        }
        const detail::request r = detail::classify(bytes, alignment);
        const std::uintptr_t key = streams_.key_of(stream);
        shard* sh = streams_.shard_for(stream, key);
        if (sh != nullptr) {
            if (void* p = r.small() ? pop_class(*sh, key, r) : pop_recent(*sh, key, r)) return p;
        }
        const typename detail::stream_caches<Upstream>::pinned pin(sh, key); // nullptr: no longer the stream's
        sh = pin.get();
        void* p = allocate_slow(stream, sh, r);
        on_allocated_slow(sh, r);
        if (sh != nullptr && r.small() && r.alignment <= granule) refill(*sh, r);
        return p;
    }

    /// A stream that went the slow way for a size asks for it again soon (a decode step's
    /// activations, a request's KV pages): a few more blocks of that size go to its class list at
    /// once, cut from free memory as one run (one tree operation), from its own spans or else the
    /// shared set, so that its next allocations take the fast path. Up to refill_bytes of them
    /// (halving while no run fits); never by growing the pool. They count as given back now (not
    /// covered until the stream records again). Nothing happens on a bad_alloc. The caller holds
    /// the shard against retirement.
    [[gnu::noinline]] void refill(shard& sh, detail::request r) noexcept {
        constexpr std::size_t refill_bytes = std::size_t{1} << 20;
        const std::size_t most = std::min<std::size_t>(32, refill_bytes / r.size);
        if (most == 0) return;
        {
            std::lock_guard lock(sh.mutex);
            if (!reserve_class(sh, r, most)) return;
            for (std::size_t n = most; n != 0; n /= 2) {
                if (const std::uintptr_t run = sh.take_span(block_kind::small, n * r.size, granule)) {
                    return keep_run(sh, r, run, n);
                }
            }
        }
        for (std::size_t n = most; n != 0; n /= 2) {
            const std::uintptr_t run = store_.take(block_kind::small, n * r.size, granule, false).block.address;
            if (run == 0) continue;
            {
                std::lock_guard lock(sh.mutex);
                if (reserve_class(sh, r, n)) return keep_run(sh, r, run, n); // room, unless another thread took it
            }
            store_.insert({run, n * r.size, 0});
            return;
        }
    }
    /// Room for `n` more blocks in the class list of `r` (the shard's lock held); false on a bad_alloc.
    static bool reserve_class(shard& sh, detail::request r, std::size_t n) noexcept {
        try {
            sh.classes.reserve(r.size_class, n);
            return true;
        } catch (const std::bad_alloc&) {
            return false;
        }
    }
    /// The `n` blocks of `r`'s size in the run at `run` into the stream's class list (its lock
    /// held, room made), lowest address on top.
    static void keep_run(shard& sh, detail::request r, std::uintptr_t run, std::size_t n) noexcept {
        for (std::size_t i = n; i-- > 0;) static_cast<void>(sh.classes.push_within_capacity(r.size_class, run + i * r.size));
        sh.cached += n * r.size;
    }

    void give_block(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        const detail::request r = detail::classify(bytes, alignment);
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        if (capture_store_.owns(address)) [[unlikely]] {
            capture_store_.deallocate(stream, address, bytes);
        } else if (capture_store_.watching() && capture_store_.capturing(stream)) [[unlikely]] {
            store_.quarantine(r.size);
            on_deallocated_slow(r);
        } else if (const std::uintptr_t key = streams_.key_of(stream); give_to_shard(stream, key, address, r)) {
        } else {
            streams_.give_back_synchronously(stream, address, r.size);
            on_deallocated_slow(r);
        }
    }

    /// The stream's shard keeps the block (see stream_caches::give_back); false when the stream has
    /// none (another device's, or every shard serves an active stream).
    [[gnu::always_inline]] bool give_to_shard(stream_type stream, std::uintptr_t key, std::uintptr_t address,
                                              detail::request r) noexcept {
        for (;;) {
            shard* sh = streams_.shard_for_free(stream, key);
            if (sh == nullptr) return false;
            if (streams_.give_back(*sh, stream, key, address, r)) [[likely]] return true;
        }
    }

    void* pop_class(shard& sh, std::uintptr_t key, detail::request r) {
        std::uintptr_t address = 0;
        std::size_t owed = 0;
        {
            std::lock_guard lock(sh.mutex);
            if (!sh.serves(key)) [[unlikely]] return nullptr; // retired since it was found
            address = sh.classes.pop(r.size_class, r.alignment);
            if (address == 0) return nullptr;
            sh.cached -= r.size;
            owed = sh.on_allocated(r);
        }
        if (owed != 0) [[unlikely]] commit(owed);
        return reinterpret_cast<void*>(address);
    }

    /// A recent large block of this stream of exactly the request's size, in O(1). Counted with
    /// the slow path's allocations (not a size-class hit).
    void* pop_recent(shard& sh, std::uintptr_t key, detail::request r) {
        std::uintptr_t address = 0;
        std::size_t owed = 0;
        {
            std::lock_guard lock(sh.mutex);
            if (!sh.serves(key)) [[unlikely]] return nullptr; // retired since it was found
            address = sh.take_recent(r.size, r.alignment);
            if (address == 0) return nullptr;
            owed = sh.charge(r.bytes);
        }
        slow_.allocated(r.size, 0);
        if (owed != 0) [[unlikely]] commit(owed);
        return reinterpret_cast<void*>(address);
    }

    // ---- the watched path: checked mode, CUDA's tools ----

    /// allocate_on, checked when the pool is, the block announced to CUDA's tools once it is this
    /// call's alone.
    [[gnu::noinline, gnu::cold]] void* allocate_watched(stream_type stream, std::size_t bytes, std::size_t alignment) {
        void* p = options_.checked ? allocate_checked(stream, bytes, alignment) : take_block(stream, bytes, alignment);
        annotations_.handed_out(p, bytes);
        return p;
    }
    /// deallocate_on, checked when the pool is, the block withdrawn from CUDA's tools while it is
    /// still this call's alone.
    [[gnu::noinline, gnu::cold]] void deallocate_watched(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (options_.checked && !forget_live(stream, ptr, bytes, alignment)) return;
        annotations_.coming_back(ptr);
        give_block(stream, ptr, bytes, alignment);
    }

    /// take_block, and the block recorded among the live ones.
    [[gnu::noinline]] void* allocate_checked(stream_type stream, std::size_t bytes, std::size_t alignment) {
        return live_.recorded(detail::classify(bytes, alignment).size, bytes, alignment,
                              [&] { return take_block(stream, bytes, alignment); });
    }
    /// Forgets the live block `ptr` when the call matches its allocation; else reports the misuse
    /// and returns false (the pool is left as it was).
    [[gnu::noinline]] bool forget_live(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        const misuse m{.address = reinterpret_cast<std::uintptr_t>(ptr), .bytes = bytes, .alignment = alignment,
                       .stream_key = platform_type::stream_key(stream)};
        if (live_.forget(m, [&](std::uintptr_t a) { return store_.chunks().find(a).size != 0; }, options_.on_misuse)) {
            return true;
        }
        activity_.count(activity_.misuses);
        return false;
    }

    // ---- the slow path: a ladder of steps, each costlier or more disruptive than the last ----

    /// Out of line, so that the fast path stays small and keeps the request in registers.
    [[gnu::noinline]] void* allocate_slow(stream_type stream, shard* sh, detail::request r) {
        // While a capture is open in the pool, its potentially unsafe calls (growth, event queries)
        // must not break it: they touch nothing the capture holds.
        std::optional<basic_capture_mode_guard<platform_type>> relaxed;
        if (capture_store_.routing()) [[unlikely]] relaxed.emplace(capture_mode::relaxed);
        if (void* p = take_cached(sh, r)) return p;
        if (void* p = take_consolidated(stream, sh, r)) return p;
        if (void* p = take_from_other_streams(stream, sh, r)) return p;
        if (void* p = grow_and_take(stream, sh, r)) return p;
        return take_after_reclaim(stream, sh, r);
    }

    /// The tighter of two fits, this stream's spans of the request's kind and the shared set (its
    /// recent large blocks were tried first): searched in a fixed order, a loose fit in the first
    /// place would cut up a block that a later request needed whole while an exact one waited in
    /// the second. The spans win a tie (their memory is this stream's already).
    void* take_cached(shard* sh, detail::request r) {
        std::size_t own = 0;
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            if (!sh->spans[r.kind].empty()) own = sh->spans[r.kind].fit(r.size, r.alignment);
        }
        if (own != r.size) { // an exact fit cannot be beaten
            const std::size_t shared = store_.fit(r.kind, r.size, r.alignment);
            if (shared != 0 && (own == 0 || shared < own)) {
                if (void* p = take_shared(sh, r)) return p;
            }
        }
        if (sh != nullptr) {
            if (const std::uintptr_t a = streams_.take_span(*sh, r.kind, r)) return reinterpret_cast<void*>(a);
        }
        return take_shared(sh, r);
    }

    /// The shared set; a large block brings the small rest of its chunk to the stream's spans.
    void* take_shared(shard* sh, detail::request r) {
        return streams_.kept(sh, store_.take(r.kind, r.size, r.alignment, sh != nullptr));
    }

    /// This stream's own cache consolidated (see stream_caches::take_consolidated): merging its
    /// size-class lists when they hold more than 1/128 of the reserve (a quarter of a growth chunk).
    void* take_consolidated(stream_type stream, shard* sh, detail::request r) {
        if (sh == nullptr) return nullptr;
        const std::size_t threshold = std::max(r.size, store_.reserved() / 128);
        return reinterpret_cast<void*>(streams_.take_consolidated(*sh, stream, r, threshold, store_.within_initial()));
    }

    /// Other streams' free memory, as the reuse policy allows, before the pool grows (the table in
    /// docs/pool.md): the covered blocks of streams whose event has completed move to the shared set
    /// (opportunistic, follow_dependencies); under follow_dependencies this stream then adopts the
    /// others' covered blocks behind a stream wait; under the other two, when the others hold at
    /// least max(the request, reserve / 8) in covered blocks, the pool waits on the host for the
    /// one holding the most rather than grow, so that it stays bounded whatever the streams do.
    void* take_from_other_streams(stream_type stream, shard* sh, detail::request r) {
        const reuse_policy policy = options_.reuse;
        if (policy != reuse_policy::same_stream && streams_.drain_completed(sh, detail::which_blocks::covered)) {
            if (void* p = take_shared(sh, r)) return p;
        }
        if (policy == reuse_policy::follow_dependencies && sh != nullptr) {
            if (!streams_.adopt_covered(stream, *sh)) return nullptr;
            return reinterpret_cast<void*>(streams_.take_span(*sh, r.kind, r));
        }
        if (!streams_.release_largest(sh, std::max(r.size, store_.reserved() / 8))) return nullptr;
        return take_shared(sh, r);
    }

    /// New memory of the request's kind (see shared_store::grow_and_take). Over an upstream that
    /// maps, this stream's idle spans join the shared set first (the new granules go beside them)
    /// and other streams' idle granules are unmapped as many as the new ones need.
    void* grow_and_take(stream_type stream, shard* sh, detail::request r) {
        if constexpr (detail::shared_store<Upstream>::maps) {
            if (sh != nullptr) streams_.release_own_idle(stream, *sh);
            streams_.unmap_idle(sh, store_.shortfall(r.kind, r.size, r.alignment));
        }
        return streams_.kept(sh, store_.grow_and_take(r.kind, r.size, r.alignment, sh != nullptr));
    }

    /// The last resort: this stream's memory of the other kind, without waiting; then waits for
    /// every stream, coalesces everything, gives free chunks back and retries once; then throws
    /// out_of_memory.
    void* take_after_reclaim(stream_type stream, shard* sh, detail::request r) {
        if (sh != nullptr) {
            if (void* p = reinterpret_cast<void*>(streams_.take_consolidated(*sh, stream, r, SIZE_MAX, true))) return p;
        }
        if (capture_store_.routing()) { // waiting would break the open capture
            activity_.count(activity_.failures);
            throw_out_of_memory(r.bytes, r.alignment, "a graph capture is open in the pool, which does not wait for streams then");
        }
        activity_.count(activity_.reclaims);
        streams_.reclaim();
        const detail::free_block b = store_.take_or_regrow(r.kind, r.size, r.alignment);
        if (b.size != 0) return reinterpret_cast<void*>(b.address);
        activity_.count(activity_.failures);
        throw_out_of_memory(r.bytes, r.alignment, {});
    }

    // ---- counters ----

    /// Commits `owed` live bytes of the stream of `sh` (its lock held; released here) that its
    /// credit did not cover, to the peak counter (see peak_counter). Below the peak, one
    /// compare-and-swap, with some slack kept as the stream's credit so that its next allocations
    /// need none (a stream that allocates what another gives back: a request's KV pages after
    /// another stream gave the last request's back). Past the peak, first the credit of the stream
    /// that committed last, when its lock is free (streams taking turns in one thread give back on
    /// one what the next allocates), then a pass over the streams.
    [[gnu::noinline]] void commit_and_unlock(shard& sh, std::size_t owed) noexcept {
        if (const auto extra = peak_.try_commit(owed)) {
            sh.credit.grant(*extra);
            sh.mutex.unlock();
            return;
        }
        shard* last = last_committer_.load(std::memory_order_relaxed);
        if (last != &sh) {
            if (last != nullptr && last->mutex.try_lock()) { // never waits with a shard lock held
                owed -= last->credit.give(owed);
                last->mutex.unlock();
            }
            last_committer_.store(&sh, std::memory_order_relaxed);
        }
        sh.mutex.unlock();
        if (owed != 0) commit(owed);
    }
    /// Adds live bytes no credit covered to the peak counter (see peak_counter). Call with no
    /// shard lock held.
    [[gnu::noinline]] void commit(std::size_t bytes) noexcept {
        peak_.commit(bytes, [&](detail::peak_counter::reclaimer& reclaim) {
            streams_.for_each([&](shard& sh) {
                if (!reclaim.wanted()) return;
                std::lock_guard lock(sh.mutex);
                reclaim.take(sh.credit);
            });
        });
    }
    [[gnu::noinline]] void on_allocated_slow(shard* sh, detail::request r) noexcept {
        std::size_t owed = r.bytes;
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            owed = sh->charge(r.bytes);
        }
        slow_.allocated(r.size, sh != nullptr ? 0 : r.bytes);
        if (owed != 0) commit(owed);
    }
    /// A block given back without a shard (a capturing stream, or one past max_streams).
    [[gnu::noinline]] void on_deallocated_slow(detail::request r) noexcept {
        slow_.deallocated(r.size, r.bytes);
        peak_.release(r.bytes);
    }

    [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::size_t alignment, std::string_view reason) const {
        const pool_statistics p = detailed_statistics();
        std::string d(reason);
        for (const std::string& part : {store_.describe_limits(bytes), p.describe()}) {
            if (!part.empty()) d += (d.empty() ? "" : "; ") + part;
        }
        throw out_of_memory(bytes, alignment, device_, p.totals, name, d);
    }

    // ---- fields ----
    // Lock order: a shard's lock, then the chunk map's; the shared store's, then the chunk map's;
    // the peak counter's, then a shard's lock. A shard's lock and the shared store's are never
    // held together, nor is the peak counter's taken while a shard's lock is held.

    Upstream upstream_;
    pool_options options_; // validated
    int device_;
    custody::detail::memory_annotations annotations_; // before the stores, which announce their chunks
    const bool watched_; // options_.checked || annotations_.on(): see watched()
    detail::activity_counters activity_;
    detail::shared_store<Upstream> store_;
    detail::stream_caches<Upstream> streams_;
    std::atomic<std::size_t> request_limit_; // larger requests fail at once (limits, budget)

    // store_.reserved() = live block bytes + the shards' cached + shared free + quarantined
    detail::peak_counter peak_;    // live bytes: the shards' counts.live_bytes + slow_'s
    /// The shard that committed to peak_ last past the peak (a hint: see commit_and_unlock).
    std::atomic<shard*> last_committer_{nullptr};
    detail::atomic_counters slow_; // the slow path's allocations, the frees without a shard
    detail::live_blocks live_;     // checked mode only: the blocks handed out
    // After the fields it reads (upstream_, options_, device_, store_): capture-private pools.
    detail::capture_store<Upstream> capture_store_;
};

} // namespace custody::pool
