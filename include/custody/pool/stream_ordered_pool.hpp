/// @file
/// `stream_ordered_pool`: memory taken from an upstream resource and handed out in stream order,
/// in two layers with one seam (docs/pool.md draws them):
///   front     detail/stream_caches.hpp  a shard per stream (shard.hpp): hot and cold size-class
///                                       stacks (class_stacks.hpp), recent large blocks, own spans
///   seam      detail/covering.hpp       when a stream's blocks become others': events, retirement
///             detail/seam.hpp           a miss's ladder: other streams' blocks as the reuse policy
///                                       allows, working sets, the bound, the reclaim, unmapping
///   back end  detail/shared_store.hpp   the shared free set (free_set.hpp) over one mapped range
///                                       (mapped_growth.hpp) or chunks (chunked_growth.hpp)
///   capture   detail/capture_store.hpp  capture-private pools (the scope: capture_scope.hpp)
///   a call is classified once (detail/request.hpp); live bytes and their exact peak:
///   detail/live_counts.hpp; checked mode: detail/live_blocks.hpp, pool_misuse.hpp
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/discarding.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/platform.hpp>
#include <custody/pool/capture_error.hpp>
#include <custody/pool/capture_pool_id.hpp>
#include <custody/pool/detail/capture_store.hpp>
#include <custody/pool/detail/careful_way.hpp>
#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/covering.hpp>
#include <custody/pool/detail/growth.hpp>
#include <custody/pool/detail/live_blocks.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/seam.hpp>
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
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace custody::pool {

/// A stream-ordered pool over `Upstream` (held by value, constructed in place from the
/// constructor's trailing arguments; the pool keeps it alive and gives its memory back to it).
///
/// Sizes: blocks are multiples of 256 bytes; requests up to 1 MiB round to one of 144 size classes
/// (at most 6.25%) served from the stream's own stack in O(1); larger ones by the stream's recent
/// blocks of that size (O(1)) or best fit with coalescing (O(log n)).
/// Stream semantics: allocate(s, ...) returns memory usable by work enqueued on s after the call;
/// deallocate(s, p, ...) makes p reusable at once on s, and on another stream t only once s's
/// event covers it, as the reuse_policy allows (docs/pool.md, cross-stream reuse). The synchronous
/// pair acts on the default stream of the pool's device and its memory is usable at once by the
/// host. Streams must belong to the pool's device (std::invalid_argument otherwise).
/// Graph capture: allocations of a capture the pool is told of come from capture-private pools
/// (capture_scope.hpp; the hooks below); a capture it is not told of breaks no other stream.
/// Growth and limits: over an upstream that maps, granules are mapped into one range and unmapped
/// when wholly free (release_threshold); over any other, in chunks; never beyond maximum_size nor
/// the device budget. Exhaustion is out_of_memory after a last-resort reclaim, counted, with live
/// blocks and counters unchanged.
/// Thread safety: thread-safe; the common path takes only the calling stream's spin lock and
/// writes no cache line another stream's common path writes.
/// CUDA's tools: with pool_options::annotate and a tool attached, heaps and blocks are announced
/// through NVTX (docs/debug.md); nothing per call without a tool.
/// Ownership: owns its memory and events; blocks still out at destruction are reported and given
/// back. Neither copyable nor movable. Equality: identity.
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
          front_(options_, device_, store_.map_granule()), covering_(options_, front_, store_, activity_),
          seam_(options_, front_, covering_, store_, activity_),
          request_limit_(detail::growth_rule(options_).request_limit()),
          capture_store_(upstream_, device_, chunk_alignment, options_.growth_step, options_.check_capture,
                         [this](std::size_t n) { return store_.may_take(n + capture_store_.reserved_bytes()); },
                         annotations_, annotations_.on(), [this](bool quiet) { front_.enable_fast(quiet); }),
          careful_({options_, device_, annotations_, activity_, store_, front_, covering_, seam_, capture_store_,
                    request_limit_, &figures_of, this}) {
        if (options_.initial_size > 0 && !store_.grow_exactly(detail::block_kind::large, align_up(options_.initial_size, granule))) {
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
        covering_.wait_all();
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
    [[nodiscard]] resource_statistics statistics() const { return totals(front_.totals()); }

    /// Everything statistics() says and where the free memory is (see pool_statistics).
    [[nodiscard]] pool_statistics detailed_statistics() const {
        pool_statistics p;
        const counters c = front_.totals(&p);
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
        p.streams = front_.size();
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
        seam_.reclaim();
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
    using counters = detail::counters;
    using request = detail::request;

    /// The pool-wide counters with the call counts `c` summed over the shards.
    [[nodiscard]] resource_statistics totals(const counters& c) const {
        resource_statistics s = capture_store_.figures().totals();
        s.live_bytes += static_cast<std::size_t>(std::max<std::int64_t>(c.live_bytes, 0));
        s.peak_live_bytes = std::max(front_.peak(), s.live_bytes);
        s.reserved_bytes += store_.reserved();
        s.peak_reserved_bytes = std::max(store_.peak_reserved(), s.reserved_bytes);
        s.allocations += c.allocations;
        s.deallocations += c.deallocations;
        s.live_allocations += static_cast<std::size_t>(c.allocations - c.deallocations);
        return s;
    }

    // ---- the common path: the stream's own hot stack, nothing else to look at ----

    /// allocate, with the pool's device current when `stream` is the default stream: a size-class
    /// block of the stream's hot stack, else the careful way. While a capture concerns the pool (or
    /// it looks at every call) the index finds no stream's shard (see capture_store::update_attention).
    [[gnu::always_inline]] void* allocate_on(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (bytes - 1 < small_threshold && detail::fits_granule(alignment)) [[likely]] {
            void* p = nullptr;
            if (front_.pop_fast(front_.key_of(stream), bytes, alignment, p)) [[likely]] return p;
        }
        return allocate_careful(stream, bytes, alignment);
    }
    /// deallocate, with the pool's device current when `stream` is the default stream.
    [[gnu::always_inline]] void deallocate_on(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        if (ptr != nullptr && bytes - 1 < small_threshold && !capture_store_.owns(address)) [[likely]] {
            if (front_.push_fast(front_.key_of(stream), address, bytes, alignment)) [[likely]] return;
        }
        deallocate_careful(stream, ptr, bytes, alignment);
    }

    // ---- the careful way: checked mode, captures, validation, large blocks, the slow path ----

    static pool_statistics figures_of(const void* pool) { return static_cast<const stream_ordered_pool*>(pool)->detailed_statistics(); }

    [[gnu::noinline]] void* allocate_careful(stream_type stream, std::size_t bytes, std::size_t alignment) {
        return careful_.allocate(stream, bytes, alignment);
    }
    [[gnu::noinline]] void deallocate_careful(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        careful_.deallocate(stream, ptr, bytes, alignment);
    }
    /// A block for `bytes` at `alignment` on `stream` the careful way (see careful_way::take).
    void* take_block(stream_type stream, std::size_t bytes, std::size_t alignment) { return careful_.take(stream, bytes, alignment); }

    // ---- fields ----
    // Lock order: a shard's lock, then the chunk map's; the shared store's, then the chunk map's;
    // the peak counter's, then a shard's lock. Two shards' locks are never held together, nor a
    // shard's and the shared store's, nor is the peak counter's taken while a shard's lock is held.
    //   store_.reserved() = live block bytes + the shards' cached + shared free + quarantined

    Upstream upstream_;
    pool_options options_; // validated
    int device_;
    custody::detail::memory_annotations annotations_; // before the stores, which announce their chunks
    // options_.checked || annotations_.on(): the careful way looks at every call of such a pool. The
    // common path serves a checked one (its shards record, see stream_caches::pop_checked), never
    // one that announces blocks to CUDA's tools (its index is off).
    const bool watched_;
    detail::activity_counters activity_;
    detail::shared_store<Upstream> store_;      // the back end
    detail::stream_caches<Upstream> front_;     // the front
    detail::covering<Upstream> covering_;       // the seam: when a stream's blocks become others'
    detail::seam<Upstream> seam_;               // the seam: a miss's ladder
    std::atomic<std::size_t> request_limit_;    // larger requests fail at once (limits, budget)
    // After the fields it reads (upstream_, options_, device_, store_): capture-private pools.
    detail::capture_store<Upstream> capture_store_;
    detail::careful_way<Upstream> careful_; // last: it refers to every part above
};

} // namespace custody::pool
