/// @file
/// `shared_store`: the pool's memory outside every stream: the chunks it took from its upstream,
/// how it grows, and the free spans any stream may use at once.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/chunk_map.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/growth.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/pool_statistics.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
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

/// The alignment a pool asks its chunks with: the upstream's largest (when it declares one), at
/// most a page, at least the granule.
template <class Upstream>
[[nodiscard]] constexpr std::size_t chunk_alignment_of() noexcept {
    if constexpr (requires { Upstream::max_alignment; }) {
        return std::clamp<std::size_t>(Upstream::max_alignment, granule, custody::max_alignment);
    } else {
        return granule;
    }
}

/// The device `upstream`'s memory belongs to; -1 when it has none.
template <class Upstream>
[[nodiscard]] int device_of(const Upstream& upstream) {
    if constexpr (device_bound_resource<Upstream>) {
        return upstream.device();
    } else {
        return -1;
    }
}

/// The chunks of a pool over `Upstream` and the free spans that belong to no stream: fresh chunks,
/// and streams' blocks once their work is known to have finished.
///
/// Invariants (under mutex_ for free_):
///   chunks().reserved() = the pool's live block bytes + the streams' cached bytes
///                         + free_[small].bytes() + free_[large].bytes() + quarantined_
///   free_[k] holds only blocks of chunks of kind k, and only idle ones (any stream may use them)
/// Thread safety: thread-safe; one mutex for the free spans (taken after a shard's lock is
/// released, never with it), then the chunk map's. Ownership: holds the chunks (given back by
/// release_free_chunks and release_all), not the upstream, which must outlive it. Announces each
/// chunk to CUDA's tools as a heap while it holds it (memory_annotations, the pool's).
/// Complexity: O(log n) per take or insert; growing costs one upstream call (and the memory query).
template <stream_ordered_resource Upstream>
class shared_store {
public:
    using stream_type = typename Upstream::stream_type;

    /// Over `upstream`, with validated `options`, for memory of `device` (-1: none); chunks are
    /// requested at `chunk_alignment` and announced through `annotations` (both outlive the store).
    shared_store(Upstream& upstream, const pool_options& options, int device, std::size_t chunk_alignment,
                 custody::detail::memory_annotations& annotations)
        : upstream_(upstream), growth_(options), memory_info_(options.memory_info), device_(device),
          chunk_alignment_(chunk_alignment), maximum_(options.maximum_size), annotations_(annotations) {}
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

    /// Takes a new chunk of `kind` for the request (the growth rule's size, or exactly what the
    /// request needs when that is refused) and cuts the block from the shared set. A block of size
    /// 0 when the pool may not grow or the upstream refuses.
    [[nodiscard]] taken_block grow_and_take(block_kind kind, std::size_t size, std::size_t alignment, bool with_tail) {
        std::lock_guard lock(mutex_);
        if (!grow(kind, need(size, alignment))) return {};
        return take_locked(kind, size, alignment, with_tail);
    }

    /// The last resort's retry, once every stream's cache came back: a block of `kind`, else of
    /// the other kind, else after giving every wholly free chunk back and growing once.
    [[nodiscard]] free_block take_or_regrow(block_kind kind, std::size_t size, std::size_t alignment) {
        std::lock_guard lock(mutex_);
        free_block b = free_[kind].take(size, alignment);
        if (b.size == 0) b = free_[other(kind)].take(size, alignment);
        if (b.size != 0) return b;
        release_free_chunks_locked();
        if (grow(kind, need(size, alignment))) b = free_[kind].take(size, alignment);
        return b;
    }

    /// Takes exactly `n` bytes from the upstream as one chunk of `kind` (the pool's initial size).
    /// False when the limits or the upstream refuse.
    [[nodiscard]] bool grow_exactly(block_kind kind, std::size_t n) {
        std::lock_guard lock(mutex_);
        return add_chunk(kind, n);
    }

    /// Puts an idle block of this pool into the shared set; when there is no host memory for it,
    /// it is counted lost (see lose).
    void insert(free_block b) noexcept {
        b = chunks_.locate(b);
        std::lock_guard lock(mutex_);
        try {
            free_[b.kind].insert(b);
        } catch (...) {
            lose(b.size);
        }
    }
    /// Puts idle blocks into the shared set, coalescing (see chunk_map::insert_runs).
    void insert_runs(std::vector<free_block>& blocks) noexcept {
        std::lock_guard lock(mutex_);
        chunks_.insert_runs(blocks, free_, [&](std::size_t size) { lose(size); });
    }

    /// Gives every chunk that is wholly free back to the upstream, which then gives back what it
    /// retains (`Upstream::trim()`, when it has one: a driver pool keeps freed memory otherwise, out
    /// of reach of the rest of the device); returns the bytes given back to the upstream.
    std::size_t release_free_chunks() noexcept {
        std::lock_guard lock(mutex_);
        return release_free_chunks_locked();
    }

    /// Gives every chunk back to the upstream, free or not (the pool's end).
    void release_all() noexcept {
        std::lock_guard lock(mutex_);
        chunks_.for_each([&](std::uintptr_t base, std::size_t size) {
            annotations_.heap_returned(reinterpret_cast<void*>(base));
            upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(base), size, chunk_alignment_);
        });
    }

    /// A block never to be reused (given back during graph capture, or its stream failed): its
    /// bytes stay reserved until the pool ends.
    void quarantine(std::size_t size) noexcept { quarantined_.fetch_add(size, std::memory_order_relaxed); }
    /// A free block that no set could store for want of host memory: quarantined and reported.
    [[gnu::noinline]] void lose(std::size_t size) noexcept {
        quarantine(size);
        report_failure("stream_ordered_pool: no host memory to record a free block; it stays unused until the pool ends");
    }

    /// Adds the shared set's free bytes, its largest block, the chunks and the quarantine to `p`.
    void add_to(pool_statistics& p) const {
        std::lock_guard lock(mutex_);
        for (const auto& set : free_) {
            p.shared_free_bytes += set.bytes();
            p.largest_free_block = std::max(p.largest_free_block, set.largest());
        }
        p.chunks = chunks_.count();
        p.quarantined_bytes = quarantined_.load(std::memory_order_relaxed);
        p.upstream_allocations = chunks_.added();
        p.upstream_deallocations = chunks_.removed();
        p.upstream_retained_bytes = upstream_retained();
    }

    /// Bytes the upstream keeps for itself of what was given back to it (a driver pool's reserve
    /// beyond its live blocks), when it can tell (`Upstream::retained_bytes()`); else 0.
    [[nodiscard]] std::size_t upstream_retained() const noexcept {
        if constexpr (requires(const Upstream& u) { u.retained_bytes(); }) {
            return upstream_.retained_bytes();
        } else {
            return 0;
        }
    }

    [[nodiscard]] const chunk_map& chunks() const noexcept { return chunks_; }
    [[nodiscard]] std::size_t reserved() const noexcept { return chunks_.reserved(); }
    /// Whether `n` more bytes may be taken from the upstream now (the limits and the device budget).
    [[nodiscard]] bool may_take(std::size_t n) const { return within_limits(n); }
    /// From now on the chunks may hold at most `bytes` (in place of options.maximum_size).
    void set_maximum(std::size_t bytes) noexcept { maximum_.store(bytes, std::memory_order_relaxed); }

    /// The limits that stopped a request of `bytes`, for out_of_memory (growth_rule::describe_limits).
    [[nodiscard]] std::string describe_limits(std::size_t bytes) const {
        return growth_.describe_limits(bytes, chunks_.reserved(), device_memory_now(),
                                       maximum_.load(std::memory_order_relaxed));
    }

private:
    /// The device's memory now (options.memory_info), what the upstream retains counted as free;
    /// nothing when the pool cannot ask.
    [[nodiscard]] std::optional<device_memory> device_memory_now() const {
        std::optional<device_memory> device;
        if (memory_info_ != nullptr) device = memory_info_(device_);
        if (device) device->free = std::min(device->total, device->free + upstream_retained());
        return device;
    }

    /// What a chunk must hold for a block of `size` at `alignment`, whatever the chunk's own
    /// alignment.
    [[nodiscard]] std::size_t need(std::size_t size, std::size_t alignment) const noexcept {
        return size + (alignment > chunk_alignment_ ? alignment - chunk_alignment_ : 0);
    }

    taken_block take_locked(block_kind kind, std::size_t size, std::size_t alignment, bool with_tail) {
        taken_block t;
        if (free_[kind].empty()) return t;
        t.block = free_[kind].take(size, alignment);
        if (t.block.size != 0 && with_tail && kind == block_kind::large) {
            t.tail = free_[kind].take_at(t.block.address + t.block.size, t.block.chunk, small_threshold + granule);
            t.tail.kind = block_kind::large;
        }
        return t;
    }

    /// Whether the pool may take `n` more bytes now (queries the device's memory when
    /// options.memory_info is set). What the upstream retains counts as free: the next chunk comes
    /// from it first.
    [[nodiscard]] bool within_limits(std::size_t n) const {
        return growth_.allows(n, chunks_.reserved(), device_memory_now(), maximum_.load(std::memory_order_relaxed));
    }

    /// The upstream's trim(), when it has one; a failure is reported (the chunks are back all the same).
    void trim_upstream() noexcept {
        if constexpr (requires(Upstream& u) { u.trim(); }) {
            try {
                upstream_.trim();
            } catch (...) {
                report_failure("stream_ordered_pool: the upstream could not give back the memory it retains");
            }
        }
    }

    /// Takes a chunk of `kind` for a block needing `size` bytes (mutex_ held). Its size follows
    /// the reserve of its own kind: small chunks sized by a reserve made of large ones would hold
    /// a few small blocks each in hundreds of megabytes.
    bool grow(block_kind kind, std::size_t size) {
        const std::size_t preferred = growth_.preferred_chunk(size, chunks_.reserved(kind));
        if (preferred != size && add_chunk(kind, preferred)) return true;
        return add_chunk(kind, size);
    }

    /// Takes exactly `n` bytes as a chunk of `kind` into the shared set (mutex_ held). Strong.
    bool add_chunk(block_kind kind, std::size_t n) {
        if (!within_limits(n)) return false;
        void* p = custody::try_allocate(upstream_, stream_type{}, n, chunk_alignment_);
        if (p == nullptr) return false;
        const auto base = reinterpret_cast<std::uintptr_t>(p);
        try {
            chunks_.add(base, n, kind);
            try {
                free_[kind].insert({base, n, base, kind});
            } catch (...) {
                chunks_.remove(base);
                throw;
            }
        } catch (...) {
            upstream_.deallocate(stream_type{}, p, n, chunk_alignment_);
            throw;
        }
        annotations_.heap_taken(p, n, "custody stream_ordered_pool");
        return true;
    }

    std::size_t release_free_chunks_locked() noexcept {
        std::size_t released = 0;
        for (auto& set : free_) {
            const auto whole = [&](std::uintptr_t address, std::size_t size) { return chunks_.is_whole(address, size); };
            set.take_whole_chunks(whole, [&](const free_block& b) {
                chunks_.remove(b.address);
                annotations_.heap_returned(reinterpret_cast<void*>(b.address));
                upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(b.address), b.size, chunk_alignment_);
                released += b.size;
            });
        }
        trim_upstream();
        return released;
    }

    Upstream& upstream_;
    growth_rule growth_;
    memory_info_function memory_info_;
    int device_;
    std::size_t chunk_alignment_;
    std::atomic<std::size_t> maximum_; ///< options.maximum_size until set_maximum
    custody::detail::memory_annotations& annotations_;
    mutable std::mutex mutex_;
    per_kind<free_set> free_; ///< guarded by mutex_
    chunk_map chunks_;
    std::atomic<std::size_t> quarantined_{0}; ///< bytes never reused again (capture, lost)
};

} // namespace custody::pool::detail
