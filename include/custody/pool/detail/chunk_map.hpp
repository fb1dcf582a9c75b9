/// @file
/// `chunk_map`: the chunks a pool took from its upstream, by base address, and the bytes they hold
/// (the pool's reserve).
#pragma once

#include <custody/core/detail/atomic_peak.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/free_set.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <vector>

namespace custody::pool::detail {

/// Where a block lies: its chunk's base and the kind of block the chunk serves.
struct chunk_ref {
    std::uintptr_t base = 0;
    std::size_t size = 0; ///< the chunk's size; 0 when no chunk holds the address
    block_kind kind = block_kind::large;
};

/// The pool's chunks. Blocks of the pool never cross a chunk's end, and coalescing never joins
/// two chunks (free_block::chunk keeps them apart).
///
/// Invariants:
///   chunks_ do not overlap
///   reserved_ = sum of the chunks' sizes <= peak_reserved_
///   kind_reserved_[k] = sum of the sizes of the chunks of kind k
///   added_ - removed_ = |chunks_|
/// Thread safety: thread-safe. Lookups take a shared lock, add and remove a unique one; the lock is
/// taken after a shard's lock or the shared set's mutex, never before.
/// Complexity: O(log chunks) per lookup.
class chunk_map {
public:
    /// Records a chunk taken from the upstream. Strong: a bad_alloc changes nothing.
    void add(std::uintptr_t base, std::size_t size, block_kind kind) {
        {
            std::unique_lock lock(mutex_);
            chunks_.emplace(base, info{size, kind});
        }
        added_.fetch_add(1, std::memory_order_relaxed);
        kind_reserved_[kind].fetch_add(size, std::memory_order_relaxed);
        const std::size_t reserved = reserved_.fetch_add(size, std::memory_order_relaxed) + size;
        custody::detail::raise_peak(peak_reserved_, reserved);
    }

    /// Forgets the chunk at `base` (given back to the upstream, or never kept).
    void remove(std::uintptr_t base) noexcept {
        std::size_t size = 0;
        block_kind kind = block_kind::large;
        {
            std::unique_lock lock(mutex_);
            auto it = chunks_.find(base);
            if (it == chunks_.end()) return;
            size = it->second.size;
            kind = it->second.kind;
            chunks_.erase(it);
        }
        removed_.fetch_add(1, std::memory_order_relaxed);
        kind_reserved_[kind].fetch_sub(size, std::memory_order_relaxed);
        reserved_.fetch_sub(size, std::memory_order_relaxed);
    }

    /// The chunk that holds `address`; a chunk_ref of size 0 when none does.
    [[nodiscard]] chunk_ref find(std::uintptr_t address) const noexcept {
        std::shared_lock lock(mutex_);
        return find_locked(address);
    }

    /// True when a chunk starts at `base` and is `size` bytes long: a free block that is a whole chunk.
    [[nodiscard]] bool is_whole(std::uintptr_t base, std::size_t size) const noexcept {
        std::shared_lock lock(mutex_);
        auto it = chunks_.find(base);
        return it != chunks_.end() && it->second.size == size;
    }

    /// `b` with its chunk and kind filled in (a block kept without them until it moves to a set).
    [[nodiscard]] free_block locate(free_block b) const noexcept {
        if (b.chunk == 0) {
            const chunk_ref where = find(b.address);
            b.chunk = where.base;
            b.kind = where.kind;
        }
        return b;
    }

    /// Inserts `blocks` (of this map's chunks) into `sets`, each into its chunk's kind, sorted by
    /// address so that each run of adjacent blocks of one chunk goes in as one block: one tree
    /// insert and one chunk lookup per run. A run that cannot be stored (no host memory for a
    /// node) is passed to `lost(size)`. Returns the bytes lost.
    template <class Lost>
    std::size_t insert_runs(std::vector<free_block>& blocks, per_kind<free_set>& sets, Lost&& lost) const noexcept {
        std::sort(blocks.begin(), blocks.end(), [](const auto& x, const auto& y) { return x.address < y.address; });
        std::shared_lock lock(mutex_);
        std::size_t lost_bytes = 0;
        chunk_ref where;
        for (std::size_t i = 0; i < blocks.size();) {
            free_block run = blocks[i++];
            if (run.address < where.base || run.address >= where.base + where.size) where = find_locked(run.address);
            const std::uintptr_t chunk_end = where.base + where.size;
            while (i < blocks.size() && blocks[i].address == run.address + run.size && blocks[i].address < chunk_end) {
                run.size += blocks[i++].size;
            }
            run.chunk = where.base;
            run.kind = where.kind;
            try {
                sets[where.kind].insert(run);
            } catch (...) {
                lost_bytes += run.size;
                lost(run.size);
            }
        }
        return lost_bytes;
    }

    /// Calls `f(base, size)` for every chunk, in address order.
    template <class F>
    void for_each(F&& f) const {
        std::shared_lock lock(mutex_);
        for (const auto& [base, i] : chunks_) f(base, i.size);
    }

    [[nodiscard]] std::size_t count() const {
        std::shared_lock lock(mutex_);
        return chunks_.size();
    }
    [[nodiscard]] std::size_t reserved() const noexcept { return reserved_.load(std::memory_order_relaxed); }
    /// The bytes of the chunks of `kind`.
    [[nodiscard]] std::size_t reserved(block_kind kind) const noexcept {
        return kind_reserved_[kind].load(std::memory_order_relaxed);
    }
    [[nodiscard]] std::size_t peak_reserved() const noexcept { return peak_reserved_.load(std::memory_order_relaxed); }
    [[nodiscard]] std::uint64_t added() const noexcept { return added_.load(std::memory_order_relaxed); }
    [[nodiscard]] std::uint64_t removed() const noexcept { return removed_.load(std::memory_order_relaxed); }

private:
    struct info {
        std::size_t size;
        block_kind kind;
    };

    [[nodiscard]] chunk_ref find_locked(std::uintptr_t address) const noexcept {
        auto it = chunks_.upper_bound(address);
        if (it == chunks_.begin()) return {};
        --it;
        if (address >= it->first + it->second.size) return {};
        return {it->first, it->second.size, it->second.kind};
    }

    mutable custody::detail::shared_mutex mutex_;
    std::map<std::uintptr_t, info> chunks_; ///< base -> chunk
    std::atomic<std::size_t> reserved_{0};
    per_kind<std::atomic<std::size_t>> kind_reserved_{}; ///< reserved_, by the chunks' kind
    std::atomic<std::size_t> peak_reserved_{0};
    std::atomic<std::uint64_t> added_{0};   ///< chunks taken from the upstream
    std::atomic<std::uint64_t> removed_{0}; ///< chunks given back
};

} // namespace custody::pool::detail
