/// @file
/// `stream_ordered_pool`: memory taken from an upstream resource and handed out in stream order,
/// in two layers with one seam (docs/pool.md draws them):
///   front     detail/stream_caches.hpp   a shard per stream (detail/shard.hpp): size-class stacks
///                                        (class_lists.hpp), recent large blocks, own spans, event
///   seam      detail/seam.hpp            the slow path's ladder and every rule that moves memory
///                                        between streams or to the back end: events, reuse
///                                        policy, working sets, the bound, the reclaim
///   back end  detail/shared_store.hpp    the shared free set (free_set.hpp) over one mapped range
///                                        (mapped_growth.hpp) or chunks (chunked_growth.hpp)
///   counts    detail/live_counts.hpp     live bytes and their exact peak (peak_counter.hpp)
///   capture   detail/capture_store.hpp   capture-private pools (the scope: capture_scope.hpp)
///   a call is classified once (detail/request.hpp); options and statistics: pool_options.hpp,
///   pool_statistics.hpp; checked mode: detail/live_blocks.hpp, pool_misuse.hpp
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
#include <custody/pool/detail/live_counts.hpp>
#include <custody/pool/detail/peak_counter.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/seam.hpp>
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
          streams_(options_, device_, store_, activity_, counts_.counter()), seam_(options_, streams_, store_, activity_),
          request_limit_(detail::growth_rule(options_).request_limit()),
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
        counters c = counts_.slow().load();
        streams_.for_each([&](shard& sh) {
            std::lock_guard lock(sh.mutex);
            c += sh.totals();
        });
        streams_.add_retired(c);
        return totals(c);
    }

    /// Everything statistics() says and where the free memory is (see pool_statistics).
    [[nodiscard]] pool_statistics detailed_statistics() const {
        pool_statistics p;
        counters c = counts_.slow().load();
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
        p.fast_allocations = c.allocations - counts_.slow().allocations();
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
    using block_kind = detail::block_kind;
    using counters = detail::counters;
    using shard = typename detail::stream_caches<Upstream>::shard;

    /// The pool-wide counters with the call counts `c` summed over the shards.
    [[nodiscard]] resource_statistics totals(const counters& c) const {
        resource_statistics s = capture_store_.figures().totals();
        s.live_bytes += static_cast<std::size_t>(std::max<std::int64_t>(c.live_bytes, 0));
        s.peak_live_bytes = std::max(counts_.peak(), s.live_bytes);
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
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        if (ptr != nullptr && bytes - 1 < capture_store_.fast_limit() && !capture_store_.owns(address)) [[likely]] {
            const std::uintptr_t key = streams_.key_of(stream);
            if (shard* sh = streams_.find(key)) [[likely]] {
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
            counts_.commit_and_unlock(sh, owed, each_shard());
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
        if (bytes > request_limit_.load(std::memory_order_relaxed)) [[unlikely]] {
            activity_.count(activity_.failures);
            throw_out_of_memory(bytes, alignment, "the request exceeds the pool's limits");
        }
        if (capture_store_.watching()) [[unlikely]] {
            try {
                if (void* p = capture_store_.allocate(stream, bytes, alignment)) return p;
            } catch (const out_of_memory&) { // a private pool that cannot grow: counted as every failure is
                activity_.count(activity_.failures);
                throw;
            }
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
        counts_.allocated_slow(sh, r, each_shard());
        if (sh != nullptr && r.small() && r.alignment <= granule) seam_.refill(*sh, r);
        return p;
    }

    void give_block(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        const detail::request r = detail::classify(bytes, alignment);
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        if (capture_store_.owns(address)) [[unlikely]] {
            capture_store_.deallocate(stream, address, bytes);
        } else if (capture_store_.watching() && capture_store_.capturing(stream)) [[unlikely]] {
            store_.quarantine(r.size);
            counts_.deallocated_slow(r);
        } else if (const std::uintptr_t key = streams_.key_of(stream); give_to_shard(stream, key, address, r)) {
        } else {
            streams_.give_back_synchronously(stream, address, r.size);
            counts_.deallocated_slow(r);
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
        if (owed != 0) [[unlikely]] counts_.commit(owed, each_shard());
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
        counts_.slow().allocated(r.size, 0);
        if (owed != 0) [[unlikely]] counts_.commit(owed, each_shard());
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
        give_own_or_block(stream, ptr, bytes, alignment);
    }

    /// take_own_or_block, and the block recorded among the live ones.
    [[gnu::noinline]] void* allocate_checked(stream_type stream, std::size_t bytes, std::size_t alignment) {
        return live_.recorded(detail::classify(bytes, alignment).size, bytes, alignment,
                              [&] { return take_own_or_block(stream, bytes, alignment); });
    }
    /// For a watched pool: the fast path's pop from the stream's own list when no capture is
    /// watched, else take_block.
    void* take_own_or_block(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (bytes - 1 < small_threshold && detail::fits_granule(alignment) && !capture_store_.watching()) {
            const std::uintptr_t key = streams_.key_of(stream);
            if (shard* sh = streams_.find(key)) {
                void* p = nullptr;
                if (pop_class(*sh, key, detail::class_of(bytes), bytes, p)) return p;
            }
        }
        return take_block(stream, bytes, alignment);
    }
    /// For a watched pool: the fast path's push onto the stream's own list when no capture is
    /// watched and the block is not private, else give_block.
    void give_own_or_block(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        if (bytes - 1 < small_threshold && !capture_store_.watching() && !capture_store_.owns(address)) {
            const std::uintptr_t key = streams_.key_of(stream);
            if (shard* sh = streams_.find(key)) {
                if (streams_.give_back_class(*sh, stream, key, address, detail::class_of(bytes), bytes)) return;
            }
        }
        give_block(stream, ptr, bytes, alignment);
    }
    /// Forgets the live block `ptr` when the call matches its allocation; else reports the misuse
    /// and returns false (the pool is left as it was).
    bool forget_live(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        misuse m{.address = reinterpret_cast<std::uintptr_t>(ptr), .bytes = bytes, .alignment = alignment};
        std::optional<misuse> found = live_.remove(m, [&](std::uintptr_t a) { return store_.chunks().find(a).size != 0; });
        if (!found) [[likely]] return true;
        found->stream_key = platform_type::stream_key(stream); // asked only for the report
        detail::live_blocks::report(*found, options_.on_misuse);
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
        if (void* p = seam_.take(stream, sh, r)) return p;
        const char* why = nullptr;
        if (void* p = seam_.take_after_reclaim(stream, sh, r, capture_store_.routing(), why)) return p;
        activity_.count(activity_.failures);
        throw_out_of_memory(r.bytes, r.alignment, why == nullptr ? std::string_view{} : std::string_view{why});
    }

    /// Calls f(shard&) for every shard (live_counts' passes over the streams).
    [[nodiscard]] auto each_shard() noexcept {
        return [this](auto&& f) { streams_.for_each(f); };
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
    detail::live_counts<shard> counts_; // live bytes = the shards' credit.live() + counts_.slow()'s
    detail::shared_store<Upstream> store_;
    detail::stream_caches<Upstream> streams_; // the front
    detail::seam<Upstream> seam_;             // between the streams, and between them and store_
    std::atomic<std::size_t> request_limit_; // larger requests fail at once (limits, budget)

    // store_.reserved() = live block bytes + the shards' cached + shared free + quarantined
    detail::live_blocks live_;     // checked mode only: the blocks handed out
    // After the fields it reads (upstream_, options_, device_, store_): capture-private pools.
    detail::capture_store<Upstream> capture_store_;
};

} // namespace custody::pool
