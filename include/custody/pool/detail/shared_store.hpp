/// @file
/// `shared_store`: the pool's memory outside every stream: the free spans any stream may use at
/// once, the quarantine, and the growth (chunks or mapped granules) that feeds them.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/chunk_map.hpp>
#include <custody/pool/detail/chunked_growth.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/mapped_growth.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/pool_statistics.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace custody::pool::detail {

/// A block cut from the shared set, and the free rest of its chunk right behind it when that rest
/// is too small to serve any large request alone (size 0 otherwise), for the taking stream to keep
/// beside the block. A 1.3 MiB block in a 2 MiB chunk otherwise leaves 0.7 MiB in the shared set
/// while the block comes back to the stream's spans: the two never coalesce, and the next large
/// request of another size needs a chunk of its own.
struct taken_block {
    free_block block; ///< size 0: nothing fitted
    free_block tail;
};

/// How a pool over `Upstream` grows: by mapping granules where the upstream can map
/// (mapped_growth), in chunks otherwise (chunked_growth).
template <class Upstream>
struct growth_choice {
    using type = chunked_growth<Upstream>;
};
template <mapping_upstream Upstream>
struct growth_choice<Upstream> {
    using type = mapped_growth<Upstream>;
};
template <class Upstream>
using growth_of = typename growth_choice<Upstream>::type;

/// The free spans of a pool over `Upstream` that belong to no stream (fresh memory, and streams'
/// blocks once their work is known to have finished), and the growth that feeds them.
///
/// Invariants (under mutex_ for free_):
///   reserved() = the pool's live block bytes + the streams' cached bytes
///                + free_[small].bytes() + free_[large].bytes() + quarantined_
///   free_[k] holds only blocks of chunks (or the region) of kind k, and only idle ones (any stream
///   may use them)
/// Thread safety: thread-safe; one mutex for the free spans and the growth (taken after a shard's
/// lock is released, never with it), then the chunk map's. Ownership: the growth holds the memory
/// (given back by release_free_chunks and release_all), not the upstream, which must outlive it.
/// Announces the memory it takes to CUDA's tools as heaps (memory_annotations,
/// the pool's; see the growth types).
/// Complexity: O(log n) per take or insert; growing costs an upstream call or a few (and the
/// memory query).
template <stream_ordered_resource Upstream>
class shared_store {
public:
    using stream_type = typename Upstream::stream_type;
    using growth_type = growth_of<Upstream>;
    /// Whether the pool grows by mapping granules (mapped_growth).
    static constexpr bool maps = mapping_upstream<Upstream>;
    static constexpr std::size_t chunk_alignment = growth_type::chunk_alignment;

    /// Over `upstream`, with validated `options`, for memory of `device` (-1: none); the memory it
    /// takes is announced through `annotations` (which outlives the store).
    shared_store(Upstream& upstream, const pool_options& options, int device,
                 custody::detail::memory_annotations& annotations)
        : growth_(upstream, options, device, annotations), initial_(align_up(options.initial_size, granule)) {
        if constexpr (maps) growth_.prepare(free_);
    }
    shared_store(const shared_store&) = delete;
    shared_store& operator=(const shared_store&) = delete;

    /// Takes a block of `size` bytes at `alignment` from chunks of `kind`, with its chunk's tail
    /// when `with_tail` and the block is large. Strong: a bad_alloc changes nothing.
    [[nodiscard]] taken_block take(block_kind kind, std::size_t size, std::size_t alignment, bool with_tail) {
        std::lock_guard lock(mutex_);
        return take_locked(kind, size, alignment, with_tail);
    }

    /// The size of the free block take(kind, size, alignment, ...) would cut from; 0 when none fits.
    [[nodiscard]] std::size_t fit(block_kind kind, std::size_t size, std::size_t alignment) {
        std::lock_guard lock(mutex_);
        return free_[kind].empty() ? 0 : free_[kind].fit(size, alignment);
    }

    /// Takes the free blocks of `kind` that touch one of `blocks` (free blocks kept elsewhere, of
    /// this pool's chunks of `kind`) in the same chunk, before or after it, into `taken`. Strong:
    /// a bad_alloc (reserving `taken`) takes nothing.
    void take_neighbours(block_kind kind, const std::vector<free_block>& blocks, std::vector<free_block>& taken) {
        taken.reserve(taken.size() + 2 * blocks.size());
        std::lock_guard lock(mutex_);
        for (const free_block& b : blocks) {
            if (free_[kind].empty()) return;
            if (const free_block before = free_[kind].take_ending_at(b.address, b.chunk); before.size != 0) {
                taken.push_back(before);
            }
            if (const free_block after = free_[kind].take_at(b.address + b.size, b.chunk, SIZE_MAX); after.size != 0) {
                taken.push_back(after);
            }
        }
    }

    /// A block of `kind` from memory the pool takes now (a new chunk, or granules mapped), cut from
    /// the shared set, with its chunk's tail when `with_tail`. Which memory serves is decided here:
    /// - while the pool holds no more than its initial size, either kind's memory serves either
    ///   kind of request, before the pool grows: a working set known up front
    ///   (pool_options::initial_size) never makes it grow, whatever its sizes;
    /// - when the pool may not grow, the other kind's serves too (segregation is a preference).
    /// A block of size 0 when nothing serves.
    [[nodiscard]] taken_block grow_and_take(block_kind kind, std::size_t size, std::size_t alignment, bool with_tail) {
        std::lock_guard lock(mutex_);
        if (within_initial()) {
            if (const free_block b = free_[other(kind)].take(size, alignment); b.size != 0) return {b, {}};
        }
        if (growth_.grow(free_, kind, size, alignment)) return take_locked(kind, size, alignment, with_tail);
        return {free_[other(kind)].take(size, alignment), {}};
    }
    /// Whether the pool still holds no more than its initial size (then either kind serves).
    [[nodiscard]] bool within_initial() const noexcept { return initial_ != 0 && growth_.reserved() <= initial_; }

    /// The last resort's retry, once every stream's cache came back: a block of `kind`, else of
    /// the other kind, else after giving every wholly free chunk (granule) back and growing once.
    [[nodiscard]] free_block take_or_regrow(block_kind kind, std::size_t size, std::size_t alignment) {
        std::lock_guard lock(mutex_);
        free_block b = free_[kind].take(size, alignment);
        if (b.size == 0) b = free_[other(kind)].take(size, alignment);
        if (b.size != 0) return b;
        growth_.release(free_);
        if (growth_.grow(free_, kind, size, alignment)) b = free_[kind].take(size, alignment);
        return b;
    }

    /// For a pool that maps: what growing for a block would map beyond the wholly free granules
    /// the shared set holds (see mapped_growth::shortfall); 0 otherwise.
    [[nodiscard]] std::size_t shortfall(block_kind kind, std::size_t size, std::size_t alignment) const {
        if constexpr (maps) {
            std::lock_guard lock(mutex_);
            return growth_.shortfall(free_, kind, size, alignment);
        } else {
            return 0;
        }
    }
    /// For a pool that maps: unmaps `runs`, whole granules of idle memory taken out of streams'
    /// caches (see mapped_growth::unmap_idle).
    void unmap_idle(const std::vector<address_run>& runs) noexcept {
        if constexpr (maps) {
            std::lock_guard lock(mutex_);
            for (const address_run& r : runs) growth_.unmap_idle(free_, r);
        }
    }
    /// The unit a pool that maps unmaps in; 0 for one that grows in chunks.
    [[nodiscard]] std::size_t map_granule() const noexcept {
        if constexpr (maps) {
            return growth_.space().granule();
        } else {
            return 0;
        }
    }

    /// Takes exactly `n` bytes from the upstream for `kind` (the pool's initial size). False when
    /// the limits or the upstream refuse.
    [[nodiscard]] bool grow_exactly(block_kind kind, std::size_t n) {
        std::lock_guard lock(mutex_);
        return growth_.grow_exactly(free_, kind, n);
    }

    /// Puts an idle block of this pool into the shared set; when there is no host memory for it,
    /// it is counted lost (see lose).
    void insert(free_block b) noexcept {
        b = chunks().locate(b);
        std::lock_guard lock(mutex_);
        try {
            free_[b.kind].insert(b);
        } catch (...) {
            lose(b.size);
        }
        if constexpr (maps) growth_.on_returned(free_);
    }
    /// Puts idle blocks into the shared set, coalescing (see chunk_map::insert_runs).
    void insert_runs(std::vector<free_block>& blocks) noexcept {
        std::lock_guard lock(mutex_);
        chunks().insert_runs(blocks, free_, [&](std::size_t size) { lose(size); });
        if constexpr (maps) growth_.on_returned(free_);
    }

    /// Gives every chunk (granule) that is wholly free back to the upstream, which then gives back
    /// what it retains (`Upstream::trim()`, when it has one: a driver pool keeps freed memory
    /// otherwise, out of reach of the rest of the device); returns the bytes given back.
    std::size_t release_free_chunks() noexcept {
        std::lock_guard lock(mutex_);
        return growth_.release(free_);
    }

    /// Gives every chunk back to the upstream, free or not (the pool's end).
    void release_all() noexcept {
        std::lock_guard lock(mutex_);
        growth_.release_all();
    }

    /// A block never to be reused (given back during graph capture, or its stream failed): its
    /// bytes stay reserved until the pool ends.
    void quarantine(std::size_t size) noexcept { quarantined_.fetch_add(size, std::memory_order_relaxed); }
    /// A free block that no set could store for want of host memory: quarantined and reported.
    [[gnu::noinline]] void lose(std::size_t size) noexcept {
        quarantine(size);
        report_failure("stream_ordered_pool: no host memory to record a free block; it stays unused until the pool ends");
    }

    /// Adds the shared set's free bytes, its largest block, the quarantine and the growth's
    /// figures (chunks or address space, upstream calls) to `p`.
    void add_to(pool_statistics& p) const {
        std::lock_guard lock(mutex_);
        for (const auto& set : free_) {
            p.shared_free_bytes += set.bytes();
            p.largest_free_block = std::max(p.largest_free_block, set.largest());
        }
        p.quarantined_bytes = quarantined_.load(std::memory_order_relaxed);
        growth_.add_to(p);
    }

    /// The chunks (or the regions) blocks are cut from.
    [[nodiscard]] const chunk_map& chunks() const noexcept { return growth_.chunks(); }
    /// The bytes held from the upstream: its chunks, or the granules mapped.
    [[nodiscard]] std::size_t reserved() const noexcept { return growth_.reserved(); }
    [[nodiscard]] std::size_t peak_reserved() const noexcept { return growth_.peak_reserved(); }
    /// Whether `n` more bytes may be taken from the upstream now (the limits and the device budget).
    [[nodiscard]] bool may_take(std::size_t n) const { return growth_.may_take(n); }
    /// From now on the pool may hold at most `bytes` (in place of options.maximum_size).
    void set_maximum(std::size_t bytes) noexcept { growth_.set_maximum(bytes); }

    /// The limits that stopped a request of `bytes`, for out_of_memory (growth_rule::describe_limits).
    [[nodiscard]] std::string describe_limits(std::size_t bytes) const {
        return growth_.budget().describe_limits(bytes, growth_.reserved());
    }

private:
    taken_block take_locked(block_kind kind, std::size_t size, std::size_t alignment, bool with_tail) {
        taken_block t;
        if (free_[kind].empty()) return t;
        t.block = free_[kind].take(size, alignment);
        if (growth_type::keeps_tails && t.block.size != 0 && with_tail && kind == block_kind::large) {
            t.tail = free_[kind].take_at(t.block.address + t.block.size, t.block.chunk, small_threshold + granule);
            t.tail.kind = block_kind::large;
        }
        return t;
    }

    mutable custody::detail::mutex mutex_;
    growth_type growth_;      ///< guarded by mutex_ (its counters may be read without it)
    std::size_t initial_;     ///< pool_options::initial_size, rounded
    per_kind<free_set> free_; ///< guarded by mutex_
    std::atomic<std::size_t> quarantined_{0}; ///< bytes never reused again (capture, lost)
};

} // namespace custody::pool::detail
