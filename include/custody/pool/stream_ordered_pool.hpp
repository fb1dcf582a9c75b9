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
#include <custody/core/failure_callback.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/platform.hpp>
#include <custody/pool/capture_error.hpp>
#include <custody/pool/detail/event_pool.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/size_classes.hpp>
#include <custody/pool/detail/spin_mutex.hpp>
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
/// counted per stream, and the exact peak is kept with per-stream credits (see charge()). The
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
    static constexpr std::size_t chunk_rounding = std::size_t{2} << 20;
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
          table_size_(std::bit_ceil(options_.max_streams * 2)),
          table_(std::make_unique<std::atomic<shard*>[]>(table_size_)),
          shards_(std::make_unique<std::atomic<shard*>[]>(options_.max_streams)),
          request_limit_(compute_request_limit()) {
        if (options_.initial_size > 0) {
            std::lock_guard lock(shared_mutex_);
            if (!grow_exactly(large_kind, align_up(options_.initial_size, granule))) {
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
        const std::size_t n = shard_count_.load(std::memory_order_acquire);
        bool uncovered = false;
        for (std::size_t i = 0; i < n; ++i) {
            shard& sh = *shards_[i].load(std::memory_order_acquire);
            uncovered = uncovered || dirty(sh);
            run_exit_tolerant<platform_type>("stream_ordered_pool: waiting for a stream's event at destruction",
                                             [&] { sh.event.synchronize(); });
        }
        if (uncovered) {
            run_exit_tolerant<platform_type>("stream_ordered_pool: synchronizing the device at destruction",
                                             [&] { synchronize_devices(); });
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
        for (const auto& [base, info] : chunks_) {
            upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(base), info.size, chunk_alignment);
        }
        for (std::size_t i = 0; i < n; ++i) {
            std::unique_ptr<shard> owned(shards_[i].load(std::memory_order_relaxed));
            events_.release(std::move(owned->event));
        }
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
        shard* sh = shard_for(stream);
        std::size_t size = 0;
        if (bytes <= small_threshold) {
            const std::size_t c = detail::class_of(bytes);
            size = detail::class_size(c);
            if (sh != nullptr) {
                if (void* p = pop_class(*sh, c, size, alignment, bytes)) return p;
            }
        } else {
            size = align_up(bytes, granule);
        }
        void* p = allocate_slow(stream, sh, bytes, size, alignment);
        on_allocated_slow(sh, bytes, size);
        return p;
    }

    /// Gives `ptr` back on `stream`: reusable at once on `stream`, on other streams as the
    /// reuse_policy allows. `bytes` and `alignment` must be those of the allocation.
    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        static_cast<void>(alignment);
        if (ptr == nullptr) return;
        const bool small = bytes <= small_threshold;
        const std::size_t c = small ? detail::class_of(bytes) : 0;
        const std::size_t size = small ? detail::class_size(c) : align_up(bytes, granule);
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        bool capturing = true;
        try {
            capturing = platform_type::is_capturing(stream);
        } catch (...) {
        }
        if (capturing) {
            quarantine(address, size);
            on_deallocated_slow(bytes, size);
            return;
        }
        shard* sh = nullptr;
        try {
            sh = shard_for(stream);
        } catch (...) {
        }
        if (sh == nullptr) {
            give_back_synchronously(stream, address, size);
            on_deallocated_slow(bytes, size);
            return;
        }
        bool stored = false;
        {
            std::lock_guard lock(sh->mutex);
            try {
                if (small) {
                    class_list& cl = sh->classes[c];
                    if (cl.epoch != sh->epoch) { // the first block since the last record: all before it are covered
                        cl.covered = static_cast<std::uint32_t>(cl.blocks.size());
                        cl.epoch = sh->epoch;
                    }
                    cl.blocks.push_back(address);
                } else {
                    keep_recent(*sh, stream, {address, size, 0, 0}); // its chunk is looked up when it leaves recent[]
                }
                stored = true;
                sh->cached += size;
            } catch (...) {
            }
            if (stored) {
                sh->uncovered_bytes += size;
                if (--sh->to_record == 0 || sh->uncovered_bytes >= options_.record_bytes) [[unlikely]] cover(*sh, stream);
            }
            ++sh->counts.deallocations;
            sh->counts.block_bytes -= static_cast<std::int64_t>(size);
            discharge(*sh, bytes);
        }
        if (!stored) lose(size);
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
        counters c = slow_counts();
        for_each_shard([&](shard& sh) {
            std::lock_guard lock(sh.mutex);
            c += sh.counts;
        });
        return totals(c);
    }

    /// Everything statistics() says and where the free memory is (see pool_statistics).
    [[nodiscard]] pool_statistics detailed_statistics() const {
        pool_statistics p;
        counters c = slow_counts();
        for_each_shard([&](shard& sh) {
            std::lock_guard lock(sh.mutex);
            c += sh.counts;
            p.per_stream.push_back({sh.key, sh.cached});
            p.stream_cached_bytes += sh.cached;
            for (const auto& set : sh.spans) p.largest_free_block = std::max(p.largest_free_block, set.largest());
            for (std::size_t i = 0; i < sh.recent_count; ++i) {
                p.largest_free_block = std::max(p.largest_free_block, sh.recent[i].size);
            }
            for (std::size_t k = detail::class_count; k-- > 0;) {
                if (!sh.classes[k].blocks.empty()) {
                    p.largest_free_block = std::max(p.largest_free_block, detail::class_size(k));
                    break;
                }
            }
        });
        {
            std::lock_guard lock(shared_mutex_);
            for (const auto& set : shared_) {
                p.shared_free_bytes += set.bytes();
                p.largest_free_block = std::max(p.largest_free_block, set.largest());
            }
            p.chunks = chunks_.size();
            p.quarantined_bytes = quarantined_bytes_.load(std::memory_order_relaxed);
        }
        p.totals = totals(c);
        p.live_block_bytes = static_cast<std::size_t>(c.block_bytes);
        p.streams = shard_count_.load(std::memory_order_acquire);
        p.fast_allocations = c.allocations - slow_allocations_.load(std::memory_order_relaxed);
        p.upstream_allocations = upstream_allocations_.load(std::memory_order_relaxed);
        p.upstream_deallocations = upstream_deallocations_.load(std::memory_order_relaxed);
        p.opportunistic_reuses = opportunistic_reuses_.load(std::memory_order_relaxed);
        p.dependency_waits = dependency_waits_.load(std::memory_order_relaxed);
        p.reclaims = reclaims_.load(std::memory_order_relaxed);
        p.failures = failures_.load(std::memory_order_relaxed);
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
    /// Which chunks a block comes from: size-class blocks and larger ones never share a chunk.
    static constexpr unsigned small_kind = 0;
    static constexpr unsigned large_kind = 1;

    /// An upstream chunk: its size and which kind of block it serves.
    struct chunk_info {
        std::size_t size;
        unsigned kind;
    };
    /// Where a block lies: its chunk's base and kind.
    struct chunk_ref {
        std::uintptr_t base = 0;
        unsigned kind = large_kind;
    };

    /// Counters kept per shard under its lock (and once more, atomically, for the calls served
    /// without a shard). A block given back on another stream than its own makes a shard's byte
    /// counts negative; their sums over the shards are the pool's.
    struct counters {
        std::uint64_t allocations = 0;
        std::uint64_t deallocations = 0;
        std::int64_t block_bytes = 0; ///< rounded bytes handed out minus given back
        std::int64_t live_bytes = 0;  ///< requested bytes handed out minus given back
        counters& operator+=(const counters& o) noexcept {
            allocations += o.allocations;
            deallocations += o.deallocations;
            block_bytes += o.block_bytes;
            live_bytes += o.live_bytes;
            return *this;
        }
    };

    /// One size class's free blocks in a shard, newest last. While `epoch` is the shard's, the
    /// first `covered` of them were given back before the shard's event was last recorded (the
    /// others after); once the shard records again (its epoch moves on), all of them were. So a
    /// record costs O(1), and a free or an allocation touches one cache line half for the class.
    struct alignas(32) class_list {
        std::vector<std::uintptr_t> blocks;
        std::uint32_t covered = 0; ///< meaningful while epoch == the shard's epoch
        std::uint32_t epoch = 0;
    };

    /// What the pool knows about one stream. Cache-line aligned so that two streams' locks never
    /// share a line.
    ///
    /// Invariants (under mutex):
    ///   cached = sum over c of |classes[c]| * class_size(c) + spans[0].bytes() + spans[1].bytes()
    ///            + sum of recent[0, recent_count).size
    ///   every block in classes[], spans[] and recent[] was given back on this stream (or was idle
    ///   when taken: the rest of a large block's chunk, kept beside it by keep_tail)
    ///   covered blocks: classes[c].blocks[0, classes[c].covered), recent[0, recent_covered), and all of spans[];
    ///   `event` was recorded on this stream after they were given back, so once it completes they
    ///   are idle. Only covered blocks leave the shard for another stream (except after the reclaim
    ///   synchronized the device). to_record == record_interval => every block is covered.
    ///   credit <= peak live - live (summed over the shards: see committed_)
    struct alignas(64) shard {
        shard(std::uintptr_t k, event_type e, std::size_t record_interval)
            : key(k), event(std::move(e)), to_record(record_interval) {}
        const std::uintptr_t key;
        mutable detail::spin_mutex mutex;
        event_type event;
        std::size_t cached = 0;
        counters counts;
        /// Live bytes this stream may add without touching the pool-wide count: bytes given back
        /// on it that are still counted in committed_ (see charge()).
        std::size_t credit = 0;
        std::size_t to_record;     ///< frees left before the next record: 1..record_interval
        std::size_t uncovered_bytes = 0; ///< bytes given back since the last record (< record_bytes)
        std::uint32_t epoch = 0;   ///< records so far (wrapping: see cover())
        std::array<class_list, detail::class_count> classes; ///< classes[c]: free blocks of class_size(c)
        /// spans[small_kind]: class blocks merged (flush_classes); spans[large_kind]: blocks above small_threshold
        std::array<detail::free_set, 2> spans;
        /// The large blocks given back most recently, oldest first, not yet merged into spans: a
        /// large block freed and asked for again at the same size (an MLP activation from one
        /// layer to the next) comes back in O(1), without touching the trees.
        std::array<detail::free_block, 4> recent{};
        std::size_t recent_count = 0; ///< recent_count <= recent.size()
        std::size_t recent_covered = 0; ///< recent_covered <= recent_count
    };

    /// The pool-wide counters with the call counts `c` summed over the shards.
    [[nodiscard]] resource_statistics totals(const counters& c) const noexcept {
        resource_statistics s;
        s.live_bytes = static_cast<std::size_t>(std::max<std::int64_t>(c.live_bytes, 0));
        s.peak_live_bytes = std::max(peak_live_bytes_.load(std::memory_order_relaxed), s.live_bytes);
        s.reserved_bytes = reserved_bytes_.load(std::memory_order_relaxed);
        s.peak_reserved_bytes = peak_reserved_bytes_.load(std::memory_order_relaxed);
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

    [[nodiscard]] std::size_t slot_of(std::uintptr_t key) const noexcept {
        return static_cast<std::size_t>((static_cast<std::uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> 32) &
               (table_size_ - 1);
    }

    /// The stream's shard, created at its first use; nullptr when max_streams shards exist.
    /// Lock-free when the shard exists (a probe of an open-addressing table that only grows).
    shard* shard_for(stream_type stream) {
        const std::uintptr_t key = platform_type::stream_key(stream);
        for (std::size_t i = slot_of(key), probes = 0; probes < table_size_; i = (i + 1) & (table_size_ - 1), ++probes) {
            shard* sh = table_[i].load(std::memory_order_acquire);
            if (sh == nullptr) break;
            if (sh->key == key) return sh;
        }
        return create_shard(stream, key);
    }

    shard* create_shard(stream_type stream, std::uintptr_t key) {
        std::lock_guard lock(registry_mutex_);
        std::size_t i = slot_of(key);
        for (;; i = (i + 1) & (table_size_ - 1)) {
            shard* sh = table_[i].load(std::memory_order_acquire);
            if (sh == nullptr) break;
            if (sh->key == key) return sh;
        }
        const std::size_t n = shard_count_.load(std::memory_order_relaxed);
        if (n == options_.max_streams) return nullptr;
        if (device_ >= 0 && !(stream == stream_type{}) && platform_type::stream_device(stream) != device_) {
            throw std::invalid_argument("custody: stream of device " +
                                        std::to_string(platform_type::stream_device(stream)) +
                                        " used with a pool of device " + std::to_string(device_));
        }
        auto sh = std::make_unique<shard>(key, events_.acquire(), options_.record_interval);
        shard* raw = sh.release();
        shards_[n].store(raw, std::memory_order_release);
        shard_count_.store(n + 1, std::memory_order_release);
        table_[i].store(raw, std::memory_order_release);
        return raw;
    }

    template <class F>
    void for_each_shard(F&& f) const {
        const std::size_t n = shard_count_.load(std::memory_order_acquire);
        for (std::size_t i = 0; i < n; ++i) f(*shards_[i].load(std::memory_order_acquire));
    }

    // ---- the fast path ----

    void* pop_class(shard& sh, std::size_t c, std::size_t size, std::size_t alignment, std::size_t bytes) {
        std::uintptr_t address = 0;
        std::size_t owed = 0;
        {
            std::lock_guard lock(sh.mutex);
            auto& list = sh.classes[c].blocks;
            if (list.empty() || (alignment > granule && (list.back() & (alignment - 1)) != 0)) return nullptr;
            address = list.back();
            list.pop_back();
            if (sh.classes[c].covered > list.size()) sh.classes[c].covered = static_cast<std::uint32_t>(list.size());
            sh.cached -= size;
            ++sh.counts.allocations;
            sh.counts.block_bytes += static_cast<std::int64_t>(size);
            owed = charge(sh, bytes);
        }
        if (owed != 0) [[unlikely]] commit(owed);
        return reinterpret_cast<void*>(address);
    }

    /// Records the shard's event on its stream (its lock held), so that it covers every block the
    /// shard holds.
    void cover(shard& sh, stream_type stream) noexcept {
        record_noexcept(sh, stream);
        if (++sh.epoch == 0) { // wrapped: no class may keep an epoch equal to the new one
            for (auto& cl : sh.classes) cl.epoch = 0;
            sh.epoch = 1;
        }
        sh.recent_covered = sh.recent_count;
        sh.to_record = options_.record_interval;
        sh.uncovered_bytes = 0;
    }

    /// How many of class c's blocks in `sh` are covered (its lock held).
    static std::size_t covered_blocks(const shard& sh, std::size_t c) noexcept {
        const class_list& cl = sh.classes[c];
        return cl.epoch == sh.epoch ? std::min<std::size_t>(cl.covered, cl.blocks.size()) : cl.blocks.size();
    }
    /// Some block was given back since the last record (its lock held).
    bool dirty(const shard& sh) const noexcept { return sh.to_record != options_.record_interval; }

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

    void* allocate_slow(stream_type stream, shard* sh, std::size_t bytes, std::size_t size, std::size_t alignment) {
        const bool small = bytes <= small_threshold;
        const unsigned kind = small ? small_kind : large_kind;
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
                if (void* p = take_with_dependency(stream, *sh, small, bytes, size, alignment)) return p;
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
            flush_classes(*sh, stream, std::max(size, reserved_bytes_.load(std::memory_order_relaxed) / 128))) {
            std::lock_guard lock(sh->mutex);
            const detail::free_block b = sh->spans[small_kind].take(size, alignment);
            if (b.size != 0) {
                sh->cached -= b.size;
                return reinterpret_cast<void*>(b.address);
            }
        }
        //     For a large request, the recent large blocks merge into the spans the same way.
        if (!small && sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            if (sh->recent_count != 0) {
                if (sh->recent_covered < sh->recent_count) cover(*sh, stream);
                merge_recent(*sh, sh->recent_count);
                const detail::free_block b = sh->spans[large_kind].take(size, alignment);
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
            const detail::free_block b = shared_[1 - kind].take(size, alignment);
            if (b.size != 0) return reinterpret_cast<void*>(b.address);
        }
        //    ... and so do this stream's spans of the other kind, without waiting for anything.
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            if (sh->recent_count != 0) {
                if (sh->recent_covered < sh->recent_count) cover(*sh, stream);
                merge_recent(*sh, sh->recent_count);
            }
            const detail::free_block b = sh->spans[1 - kind].take(size, alignment);
            if (b.size != 0) {
                sh->cached -= b.size;
                return reinterpret_cast<void*>(b.address);
            }
        }
        // 5. Last resort: wait for every stream, coalesce everything, give free chunks back, retry once.
        reclaims_.fetch_add(1, std::memory_order_relaxed);
        reclaim();
        {
            std::lock_guard lock(shared_mutex_);
            detail::free_block b = shared_[kind].take(size, alignment);
            if (b.size == 0) b = shared_[1 - kind].take(size, alignment);
            if (b.size == 0) {
                release_free_chunks();
                if (grow(kind, need)) b = shared_[kind].take(size, alignment);
            }
            if (b.size != 0) return reinterpret_cast<void*>(b.address);
        }
        failures_.fetch_add(1, std::memory_order_relaxed);
        throw_out_of_memory(bytes, alignment, {});
    }

    void* take_shared(shard* sh, unsigned kind, std::size_t size, std::size_t alignment) {
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
    detail::free_block take_tail(const shard* sh, unsigned kind, const detail::free_block& b) noexcept {
        if (kind != large_kind || sh == nullptr) return {};
        detail::free_block tail = shared_[large_kind].take_at(b.address + b.size, b.chunk, small_threshold + granule);
        tail.kind = large_kind;
        return tail;
    }

    /// Puts a tail from take_tail into the stream's large spans (back into the shared set when
    /// there is no host memory for it).
    void keep_tail(shard* sh, const detail::free_block& tail) noexcept {
        if (tail.size == 0) return;
        {
            std::lock_guard lock(sh->mutex);
            try {
                sh->spans[large_kind].insert(tail);
                sh->cached += tail.size;
                return;
            } catch (...) {
            }
        }
        std::lock_guard lock(shared_mutex_);
        try {
            shared_[large_kind].insert(tail);
        } catch (...) {
            lose(tail.size);
        }
    }

    /// Moves the covered blocks of other streams whose event has completed to the shared set.
    /// True when anything moved.
    bool drain_completed(const shard* self) {
        bool moved = false;
        for_each_shard([&](shard& other) {
            if (&other == self) return;
            std::vector<detail::free_block> blocks;
            {
                std::lock_guard lock(other.mutex);
                if (other.cached == 0 || !other.event.ready()) return;
                blocks = take_blocks(other, true);
            }
            if (blocks.empty()) return;
            to_shared(std::move(blocks));
            opportunistic_reuses_.fetch_add(1, std::memory_order_relaxed);
            moved = true;
        });
        return moved;
    }

    /// Follow dependencies: finds a fitting covered block in another stream's cache, makes
    /// `stream` wait on that stream's event (no host synchronization) and takes the block.
    void* take_with_dependency(stream_type stream, shard& self, bool small, std::size_t bytes, std::size_t size,
                               std::size_t alignment) {
        void* result = nullptr;
        const std::size_t c = small ? detail::class_of(bytes) : 0;
        const std::size_t n = shard_count_.load(std::memory_order_acquire);
        for (std::size_t i = 0; i < n && result == nullptr; ++i) {
            shard& other = *shards_[i].load(std::memory_order_acquire);
            if (&other == &self) continue;
            std::lock_guard lock(other.mutex);
            if (other.cached == 0) continue;
            const std::size_t covered = small ? covered_blocks(other, c) : 0;
            if (covered != 0) {
                auto& list = other.classes[c].blocks;
                const auto k = static_cast<std::ptrdiff_t>(covered - 1); // the newest covered block
                if (alignment <= granule || (list[static_cast<std::size_t>(k)] & (alignment - 1)) == 0) {
                    platform_type::wait(stream, other.event);
                    result = reinterpret_cast<void*>(list[static_cast<std::size_t>(k)]);
                    list.erase(list.begin() + k);
                    if (other.classes[c].epoch == other.epoch) --other.classes[c].covered;
                    other.cached -= size;
                }
            }
            const unsigned kind = small ? small_kind : large_kind;
            if (result == nullptr && !small && other.recent_covered != 0) {
                merge_recent(other, other.recent_covered);
            }
            if (result == nullptr && other.spans[kind].fits(size, alignment)) {
                platform_type::wait(stream, other.event);
                const detail::free_block b = other.spans[kind].take(size, alignment);
                other.cached -= b.size;
                result = reinterpret_cast<void*>(b.address);
            }
            if (result != nullptr) dependency_waits_.fetch_add(1, std::memory_order_relaxed);
        }
        return result;
    }

    /// Keeps a large block given back on this shard's stream among its recent blocks (its lock
    /// held); the oldest recent block moves to the spans when there is no room (after a record,
    /// when it is not yet covered). Throws bad_alloc (from the spans) with the shard unchanged.
    void keep_recent(shard& sh, stream_type stream, const detail::free_block& b) {
        if (sh.recent_count == sh.recent.size()) {
            if (sh.recent_covered == 0) cover(sh, stream);
            const detail::free_block oldest = located(sh.recent[0]);
            sh.spans[oldest.kind].insert(oldest);
            std::move(sh.recent.begin() + 1, sh.recent.end(), sh.recent.begin());
            --sh.recent_count;
            --sh.recent_covered;
        }
        sh.recent[sh.recent_count++] = b;
    }

    /// `b` with its chunk and kind filled in (a recent block carries none until it leaves recent[]).
    detail::free_block located(detail::free_block b) const noexcept {
        if (b.chunk == 0) {
            const chunk_ref where = chunk_of(b.address);
            b.chunk = where.base;
            b.kind = where.kind;
        }
        return b;
    }

    /// Takes a recent block of exactly `size` bytes suitably aligned, newest first (lock held).
    void* take_recent(shard& sh, std::size_t size, std::size_t alignment) noexcept {
        for (std::size_t i = sh.recent_count; i-- > 0;) {
            const detail::free_block& b = sh.recent[i];
            if (b.size == size && (b.address & (alignment - 1)) == 0) {
                const std::uintptr_t address = b.address;
                std::move(sh.recent.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                          sh.recent.begin() + static_cast<std::ptrdiff_t>(sh.recent_count),
                          sh.recent.begin() + static_cast<std::ptrdiff_t>(i));
                --sh.recent_count;
                if (i < sh.recent_covered) --sh.recent_covered;
                sh.cached -= size;
                return reinterpret_cast<void*>(address);
            }
        }
        return nullptr;
    }

    /// Moves the `count` oldest recent blocks (covered ones: count <= recent_covered) into the
    /// spans, coalescing (lock held). A bad_alloc leaves the blocks not yet moved among the recent.
    void merge_recent(shard& sh, std::size_t count) noexcept {
        try {
            for (; count != 0; --count) {
                const detail::free_block b = located(sh.recent[0]);
                sh.spans[b.kind].insert(b);
                std::move(sh.recent.begin() + 1, sh.recent.begin() + static_cast<std::ptrdiff_t>(sh.recent_count),
                          sh.recent.begin());
                --sh.recent_count;
                --sh.recent_covered;
            }
        } catch (...) {
        }
    }

    /// Moves a shard's size-class blocks into its spans, coalescing them, when they hold at least
    /// `threshold` bytes; records the event first when some are not covered (the spans hold only
    /// covered blocks). True when any moved.
    bool flush_classes(shard& sh, stream_type stream, std::size_t threshold) {
        std::lock_guard lock(sh.mutex);
        std::size_t recent = 0;
        for (std::size_t i = 0; i < sh.recent_count; ++i) recent += sh.recent[i].size;
        if (sh.cached - sh.spans[small_kind].bytes() - sh.spans[large_kind].bytes() - recent < threshold) return false;
        std::size_t count = 0;
        for (const auto& cl : sh.classes) count += cl.blocks.size();
        if (count == 0) return false;
        // Sorted by address, blocks cut one after another from a span (a request's KV pages)
        // form runs that go into the tree as one block: one insert per run, not per block.
        std::vector<detail::free_block> blocks;
        blocks.reserve(count); // may throw: nothing has moved yet
        if (dirty(sh)) cover(sh, stream);
        for (std::size_t c = 0; c < detail::class_count; ++c) {
            for (std::uintptr_t a : sh.classes[c].blocks) blocks.push_back({a, detail::class_size(c), 0, 0});
            sh.classes[c].blocks.clear();
            sh.classes[c].covered = 0;
        }
        std::shared_lock chunks_lock(chunks_mutex_);
        sh.cached -= insert_runs(blocks, sh.spans);
        return true;
    }

    /// Inserts `blocks` into `sets` (each into its chunk's kind), sorted by address so that each
    /// run of adjacent blocks of one chunk goes in as one block: one tree insert and one chunk
    /// lookup per run. The caller holds a lock that keeps chunks_ stable. Returns the bytes that
    /// could not be stored (no host memory for a node): they are counted lost.
    std::size_t insert_runs(std::vector<detail::free_block>& blocks, std::array<detail::free_set, 2>& sets) noexcept {
        std::sort(blocks.begin(), blocks.end(), [](const auto& x, const auto& y) { return x.address < y.address; });
        std::size_t lost = 0;
        std::uintptr_t chunk_end = 0;
        chunk_ref where;
        for (std::size_t i = 0; i < blocks.size();) {
            detail::free_block run = blocks[i++];
            if (run.address >= chunk_end || run.address < where.base) {
                auto it = std::prev(chunks_.upper_bound(run.address));
                where = {it->first, it->second.kind};
                chunk_end = it->first + it->second.size;
            }
            while (i < blocks.size() && blocks[i].address == run.address + run.size && blocks[i].address < chunk_end) {
                run.size += blocks[i++].size;
            }
            run.chunk = where.base;
            try {
                sets[where.kind].insert(run);
            } catch (...) {
                lost += run.size;
                lose(run.size);
            }
        }
        return lost;
    }

    /// Takes a shard's blocks (its lock held) into a list: the covered ones, or all of them.
    /// Strong: throws bad_alloc before taking anything.
    std::vector<detail::free_block> take_blocks(shard& sh, bool covered_only) {
        std::vector<detail::free_block> blocks;
        const std::size_t recent = covered_only ? sh.recent_covered : sh.recent_count;
        std::size_t count = sh.spans[small_kind].count() + sh.spans[large_kind].count() + recent;
        for (std::size_t c = 0; c < detail::class_count; ++c) {
            count += covered_only ? covered_blocks(sh, c) : sh.classes[c].blocks.size();
        }
        blocks.reserve(count);
        for (std::size_t c = 0; c < detail::class_count; ++c) {
            auto& list = sh.classes[c].blocks;
            const std::size_t k = covered_only ? covered_blocks(sh, c) : list.size();
            for (std::size_t i = 0; i < k; ++i) blocks.push_back({list[i], detail::class_size(c), 0, 0}); // chunk: looked up later
            list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(k));
            sh.classes[c].covered = 0; // those left, if any, came after the last record
            sh.classes[c].epoch = sh.epoch;
        }
        for (std::size_t i = 0; i < recent; ++i) blocks.push_back(sh.recent[i]);
        std::move(sh.recent.begin() + static_cast<std::ptrdiff_t>(recent),
                  sh.recent.begin() + static_cast<std::ptrdiff_t>(sh.recent_count), sh.recent.begin());
        sh.recent_count -= recent;
        sh.recent_covered = 0;
        for (unsigned kind : {small_kind, large_kind}) {
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
        insert_runs(blocks, shared_);
    }

    /// Moves every stream's cache to the shared set once its blocks are idle: a stream whose
    /// blocks are all covered is waited for through its event, the others through one
    /// synchronization of the device (their streams may be gone; the device has their work).
    void reclaim() {
        std::vector<std::vector<detail::free_block>> taken;
        taken.reserve(shard_count_.load(std::memory_order_acquire)); // no allocation once blocks are out
        bool uncovered = false;
        for_each_shard([&](shard& sh) {
            if (taken.size() == taken.capacity()) return; // a shard created during the reclaim
            std::lock_guard lock(sh.mutex);
            if (sh.cached == 0) return;
            if (!dirty(sh)) {
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

    [[nodiscard]] bool within_limits(std::size_t n) const {
        const std::size_t reserved = reserved_bytes_.load(std::memory_order_relaxed);
        if (n > options_.maximum_size || reserved > options_.maximum_size - n) return false;
        if (options_.memory_info != nullptr) {
            if (const auto info = options_.memory_info(device_)) {
                return info->free >= n && info->free - n >= options_.device_headroom;
            }
        }
        if (options_.device_capacity != 0) {
            const std::size_t budget =
                options_.device_capacity > options_.device_headroom ? options_.device_capacity - options_.device_headroom : 0;
            return reserved <= budget && n <= budget - reserved;
        }
        return true;
    }

    /// Takes a chunk of `kind` for a request of `size` bytes: max(growth_step, reserved /
    /// growth_divisor), the latter rounded down to whole 2 MiB pages once above 2 MiB (the GPU
    /// allocates whole pages: a page begun is a page taken), or `size` rounded up to 2 MiB when
    /// larger; falls back to exactly `size` when that much is refused.
    bool grow(unsigned kind, std::size_t size) {
        std::size_t preferred = options_.growth_step;
        if (options_.growth_divisor != 0) {
            const std::size_t share = reserved_bytes_.load(std::memory_order_relaxed) / options_.growth_divisor;
            preferred = std::max(preferred, share >= chunk_rounding ? share - share % chunk_rounding : align_up(share, granule));
        }
        if (size > preferred) preferred = align_up(size, chunk_rounding);
        if (preferred != size && grow_exactly(kind, preferred)) return true;
        return grow_exactly(kind, size);
    }

    bool grow_exactly(unsigned kind, std::size_t n) {
        if (!within_limits(n)) return false;
        void* p = custody::try_allocate(upstream_, stream_type{}, n, chunk_alignment);
        if (p == nullptr) return false;
        const auto base = reinterpret_cast<std::uintptr_t>(p);
        try {
            {
                std::unique_lock chunks_lock(chunks_mutex_);
                chunks_.emplace(base, chunk_info{n, kind});
            }
            try {
                shared_[kind].insert({base, n, base});
            } catch (...) {
                std::unique_lock chunks_lock(chunks_mutex_);
                chunks_.erase(base);
                throw;
            }
        } catch (...) {
            upstream_.deallocate(stream_type{}, p, n, chunk_alignment);
            throw;
        }
        upstream_allocations_.fetch_add(1, std::memory_order_relaxed);
        const std::size_t reserved = reserved_bytes_.fetch_add(n, std::memory_order_relaxed) + n;
        custody::detail::raise_peak(peak_reserved_bytes_, reserved);
        return true;
    }

    std::size_t release_free_chunks() noexcept {
        std::size_t released = 0;
        for (auto& set : shared_) {
            const auto whole = [&](std::uintptr_t address, std::size_t size) {
                auto c = chunks_.find(address);
                return c != chunks_.end() && c->second.size == size;
            };
            set.take_whole_chunks(whole, [&](const detail::free_block& b) {
                {
                    std::unique_lock chunks_lock(chunks_mutex_);
                    chunks_.erase(b.address);
                }
                upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(b.address), b.size, chunk_alignment);
                reserved_bytes_.fetch_sub(b.size, std::memory_order_relaxed);
                upstream_deallocations_.fetch_add(1, std::memory_order_relaxed);
                released += b.size;
            });
        }
        return released;
    }

    // ---- chunks ----

    /// The base of the chunk holding `address` (a block of this pool).
    chunk_ref chunk_of(std::uintptr_t address) const noexcept {
        std::shared_lock lock(chunks_mutex_);
        return chunk_of_locked(address);
    }
    chunk_ref chunk_of_locked(std::uintptr_t address) const noexcept {
        auto it = chunks_.upper_bound(address);
        if (it == chunks_.begin()) return {};
        --it;
        return {it->first, it->second.kind};
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
            const chunk_ref where = chunk_of_locked(address);
            shared_[where.kind].insert({address, size, where.base});
        } catch (...) {
            lose(size);
        }
    }

    void lose(std::size_t size) noexcept {
        quarantined_bytes_.fetch_add(size, std::memory_order_relaxed);
        report_failure("stream_ordered_pool: no host memory to record a free block; it stays unused until the pool ends");
    }

    // ---- counters ----

    // Live bytes and their exact peak, without a pool-wide write on the common path.
    //
    // Each shard counts the live bytes of its stream and holds a credit: bytes given back on it
    // that stay counted in committed_. committed_ = live + every shard's credit, and committed_ <=
    // the peak. An allocation that the calling shard's credit covers therefore cannot make a new
    // peak: it only moves bytes from credit to live, under the lock the shard already holds. One
    // that is not covered adds the rest to committed_, and while the sum stays at or below the
    // peak nothing else is needed. Only above the peak are the other shards' credits taken back
    // (each under its lock), which makes committed_ the live bytes exactly, and the peak is
    // raised to it. In a steady state (a decode loop) live memory stays below the peak reached
    // in the first steps, so threads on different streams share no cache line; as the pool warms
    // up, each new peak costs a pass over the shards.

    /// Adds `bytes` to a shard's live bytes (its lock held); returns what its credit did not cover.
    static std::size_t charge(shard& sh, std::size_t bytes) noexcept {
        sh.counts.live_bytes += static_cast<std::int64_t>(bytes);
        if (sh.credit >= bytes) {
            sh.credit -= bytes;
            return 0;
        }
        const std::size_t owed = bytes - sh.credit;
        sh.credit = 0;
        return owed;
    }
    /// Takes `bytes` off a shard's live bytes and keeps them as its credit (its lock held).
    static void discharge(shard& sh, std::size_t bytes) noexcept {
        sh.counts.live_bytes -= static_cast<std::int64_t>(bytes);
        sh.credit += bytes;
    }
    /// Adds live bytes no credit covered to committed_, raising the peak exactly when they make
    /// one. Call with no shard lock held.
    void commit(std::size_t bytes) noexcept {
        std::size_t seen = committed_.load(std::memory_order_relaxed);
        while (seen + bytes <= peak_live_bytes_.load(std::memory_order_relaxed)) {
            if (committed_.compare_exchange_weak(seen, seen + bytes, std::memory_order_relaxed)) return;
        }
        std::lock_guard peak_lock(peak_mutex_);
        std::size_t now = committed_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
        const std::size_t n = shard_count_.load(std::memory_order_acquire);
        for (std::size_t i = 0; i < n && now > peak_live_bytes_.load(std::memory_order_relaxed); ++i) {
            shard& sh = *shards_[i].load(std::memory_order_acquire);
            std::lock_guard lock(sh.mutex);
            now = committed_.fetch_sub(sh.credit, std::memory_order_relaxed) - sh.credit;
            sh.credit = 0;
        }
        custody::detail::raise_peak(peak_live_bytes_, now);
    }
    void on_allocated_slow(shard* sh, std::size_t bytes, std::size_t size) noexcept {
        slow_allocations_.fetch_add(1, std::memory_order_relaxed);
        slow_block_bytes_.fetch_add(static_cast<std::int64_t>(size), std::memory_order_relaxed);
        std::size_t owed = bytes;
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            owed = charge(*sh, bytes);
        } else {
            slow_live_bytes_.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
        }
        if (owed != 0) commit(owed);
    }
    /// A block given back without a shard (a capturing stream, or one past max_streams).
    void on_deallocated_slow(std::size_t bytes, std::size_t size) noexcept {
        slow_deallocations_.fetch_add(1, std::memory_order_relaxed);
        slow_block_bytes_.fetch_sub(static_cast<std::int64_t>(size), std::memory_order_relaxed);
        slow_live_bytes_.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
        committed_.fetch_sub(bytes, std::memory_order_relaxed);
    }
    counters slow_counts() const noexcept {
        counters c;
        c.allocations = slow_allocations_.load(std::memory_order_relaxed);
        c.deallocations = slow_deallocations_.load(std::memory_order_relaxed);
        c.block_bytes = slow_block_bytes_.load(std::memory_order_relaxed);
        c.live_bytes = slow_live_bytes_.load(std::memory_order_relaxed);
        return c;
    }

    [[nodiscard]] std::size_t compute_request_limit() const noexcept {
        std::size_t limit = std::min(options_.maximum_size, SIZE_MAX / 2);
        if (options_.device_capacity != 0) {
            limit = std::min(limit, options_.device_capacity > options_.device_headroom
                                        ? options_.device_capacity - options_.device_headroom
                                        : std::size_t{0});
        }
        return limit;
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
    // Lock order: a shard's mutex, then chunks_mutex_ (shared); shared_mutex_, then chunks_mutex_
    // (unique); peak_mutex_, then a shard's mutex. A shard's mutex and shared_mutex_ are never
    // held together, nor is peak_mutex_ taken while a shard's mutex is held.

    Upstream upstream_;
    pool_options options_;
    int device_;
    detail::event_pool<platform_type> events_;

    std::size_t table_size_;                          // power of two >= 2 * max_streams
    std::unique_ptr<std::atomic<shard*>[]> table_;    // open addressing by stream key; slots only fill
    std::unique_ptr<std::atomic<shard*>[]> shards_;   // shards_[0, shard_count_): every shard, in order met
    std::atomic<std::size_t> shard_count_{0};         // shard_count_ <= max_streams
    std::mutex registry_mutex_;                       // serializes shard creation
    std::size_t request_limit_;                       // larger requests fail at once (limits, budget)

    mutable std::mutex shared_mutex_;
    std::array<detail::free_set, 2> shared_;         // [small_kind], [large_kind]; guarded by shared_mutex_
    std::map<std::uintptr_t, chunk_info> chunks_;     // base -> chunk; written under both locks below
    mutable std::shared_mutex chunks_mutex_;
    std::atomic<std::size_t> quarantined_bytes_{0};   // blocks never reused again (capture, lost)

    // reserved_bytes_ = sum of chunks_ sizes
    //                 = live block bytes + per-stream cached + shared_[*].bytes() + quarantined_bytes_
    // committed_ = live bytes + sum of the shards' credits <= peak_live_bytes_ (see charge()); the
    // live bytes are the shards' counts.live_bytes plus slow_live_bytes_.
    alignas(64) std::atomic<std::size_t> committed_{0};
    std::atomic<std::size_t> peak_live_bytes_{0};
    detail::spin_mutex peak_mutex_; // serializes raising the peak; taken before a shard's lock
    alignas(64) std::atomic<std::size_t> reserved_bytes_{0};
    std::atomic<std::size_t> peak_reserved_bytes_{0};
    std::atomic<std::uint64_t> slow_allocations_{0};
    std::atomic<std::uint64_t> slow_deallocations_{0};
    std::atomic<std::int64_t> slow_block_bytes_{0};
    std::atomic<std::int64_t> slow_live_bytes_{0};
    std::atomic<std::uint64_t> upstream_allocations_{0};
    std::atomic<std::uint64_t> upstream_deallocations_{0};
    std::atomic<std::uint64_t> opportunistic_reuses_{0};
    std::atomic<std::uint64_t> dependency_waits_{0};
    std::atomic<std::uint64_t> reclaims_{0};
    std::atomic<std::uint64_t> failures_{0};
};

} // namespace custody::pool
