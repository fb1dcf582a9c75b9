/// @file
/// `free_set`: the free blocks of one part of the pool, ordered by address (to coalesce neighbours)
/// and by size (to find the best fit).
#pragma once

#include <custody/core/align.hpp>
#include <custody/pool/detail/block_kind.hpp>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace custody::pool::detail {

/// A free range of pool memory inside one upstream chunk.
struct free_block {
    std::uintptr_t address = 0;
    std::size_t size = 0;
    std::uintptr_t chunk = 0; ///< base address of the upstream chunk it lies in
    block_kind kind = block_kind::small; ///< the kind of its chunk: which of the owner's sets it belongs to
};

/// A set of free blocks with best-fit search, splitting and coalescing.
///
/// Invariants (whole(a, n): the bytes of the whole units of unit_ inside [a, a + n); 0 for unit_ 0):
///   by_address_ and by_size_ hold the same blocks: (a, {n, c}) in by_address_ <=> (n, a) in by_size_
///   blocks do not overlap, and no two blocks of one chunk touch (they would have been merged)
///   bytes_ = sum of n over all blocks
///   whole_bytes_ = sum of whole(a, n) over all blocks
/// Thread safety: none; the owner (a shard or the pool's global part) guards it.
/// Complexity: take and insert are O(log n) in the number of free blocks.
/// Exception safety: take is strong (a bad_alloc from a node leaves the set as it was); insert
/// either stores the block or throws with the set unchanged.
class free_set {
public:
    [[nodiscard]] bool empty() const noexcept { return by_address_.empty(); }
    [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
    [[nodiscard]] std::size_t count() const noexcept { return by_address_.size(); }
    [[nodiscard]] std::size_t largest() const noexcept { return by_size_.empty() ? 0 : std::prev(by_size_.end())->first; }

    /// Counts, from now on, the whole units of `unit` bytes (a power of two; 0: none) that free
    /// blocks hold: what a pool that maps memory in granules could unmap. Precondition: empty().
    void count_whole(std::size_t unit) noexcept { unit_ = unit; }
    /// The bytes of the whole units inside the free blocks (see count_whole).
    [[nodiscard]] std::size_t whole_bytes() const noexcept { return whole_bytes_; }

    /// Adds a block, merging it with free neighbours of the same chunk.
    void insert(free_block b) {
        auto next = by_address_.lower_bound(b.address);
        if (next != by_address_.begin()) {
            auto prev = std::prev(next);
            if (prev->second.chunk == b.chunk && prev->first + prev->second.size == b.address) {
                // Grow prev over b (and over next if it touches too); no node is allocated.
                std::size_t merged = prev->second.size + b.size;
                whole_bytes_ -= whole(prev->first, prev->second.size);
                if (next != by_address_.end() && next->second.chunk == b.chunk && b.address + b.size == next->first) {
                    merged += next->second.size;
                    whole_bytes_ -= whole(next->first, next->second.size);
                    by_size_.erase({next->second.size, next->first});
                    by_address_.erase(next);
                }
                resize(prev, merged);
                whole_bytes_ += whole(prev->first, merged);
                bytes_ += b.size;
                return;
            }
        }
        if (next != by_address_.end() && next->second.chunk == b.chunk && b.address + b.size == next->first) {
            // b takes next's place: reuse both nodes under new keys.
            auto an = by_address_.extract(next);
            auto sn = by_size_.extract({an.mapped().size, an.key()});
            whole_bytes_ -= whole(an.key(), an.mapped().size);
            an.key() = b.address;
            an.mapped().size += b.size;
            whole_bytes_ += whole(an.key(), an.mapped().size);
            sn.value() = {an.mapped().size, b.address};
            by_address_.insert(std::move(an));
            by_size_.insert(std::move(sn));
            bytes_ += b.size;
            return;
        }
        auto [it, inserted] = by_address_.emplace(b.address, info{b.size, b.chunk});
        try {
            by_size_.emplace(b.size, b.address);
        } catch (...) {
            by_address_.erase(it);
            throw;
        }
        static_cast<void>(inserted);
        bytes_ += b.size;
        whole_bytes_ += whole(b.address, b.size);
    }

    /// True when take(size, alignment) would find a block.
    [[nodiscard]] bool fits(std::size_t size, std::size_t alignment) { return fit(size, alignment) != 0; }
    /// The size of the block take(size, alignment) would cut from; 0 when none fits.
    [[nodiscard]] std::size_t fit(std::size_t size, std::size_t alignment) {
        const auto it = find_fit(size, alignment);
        return it == by_size_.end() ? 0 : it->first;
    }

    /// Removes and returns the smallest block that can hold `size` bytes starting at a multiple of
    /// `alignment`, cut to exactly that range; what is left before and after stays free. Returns a
    /// block of size 0 when none fits.
    [[nodiscard]] free_block take(std::size_t size, std::size_t alignment) {
        const auto it = find_fit(size, alignment);
        if (it == by_size_.end()) return {};
        const std::uintptr_t at = align_up(it->second, alignment);
        return {at, size, cut(by_address_.find(it->second), it, at, size)};
    }

    /// Removes [address, address + size) from the free block that holds it whole (precondition),
    /// leaving what is before and after it free. Strong: a bad_alloc changes nothing.
    void take_range(std::uintptr_t address, std::size_t size) {
        const auto ait = std::prev(by_address_.upper_bound(address));
        static_cast<void>(cut(ait, by_size_.find({ait->second.size, ait->first}), address, size));
    }

    /// The bytes of the free block of chunk `chunk` that ends at `end`; 0 when there is none.
    [[nodiscard]] std::size_t bytes_ending_at(std::uintptr_t end, std::uintptr_t chunk) const noexcept {
        auto it = by_address_.lower_bound(end);
        if (it == by_address_.begin()) return 0;
        --it;
        return it->second.chunk == chunk && it->first + it->second.size == end ? it->second.size : 0;
    }
    /// The bytes of the free block of chunk `chunk` that starts at `address`; 0 when there is none.
    [[nodiscard]] std::size_t bytes_at(std::uintptr_t address, std::uintptr_t chunk) const noexcept {
        auto it = by_address_.find(address);
        return it != by_address_.end() && it->second.chunk == chunk ? it->second.size : 0;
    }

    /// Takes up to `limit` bytes (rounded up to units) of whole units of `unit` bytes out of the
    /// blocks, largest blocks first and each block's high end first (its start stays where it
    /// was), skipping the blocks for which `skip(free_block)` holds; passes each run taken to
    /// `f(address, bytes)`, which must not throw. Returns the bytes taken. A bad_alloc (planning, or
    /// a block split in two) stops it with what was taken so far.
    template <class Skip, class F>
    std::size_t take_whole(std::size_t unit, std::size_t limit, Skip&& skip, F&& f) noexcept {
        std::vector<std::pair<std::uintptr_t, std::size_t>> runs;
        try {
            std::size_t planned = 0;
            for (auto it = by_size_.rbegin(); it != by_size_.rend() && it->first >= unit && planned < limit; ++it) {
                const free_block b{it->second, it->first, by_address_.find(it->second)->second.chunk};
                const std::uintptr_t first = align_up(b.address, unit);
                const std::uintptr_t last = align_down(b.address + b.size, unit);
                if (last <= first || skip(b)) continue;
                const std::size_t n = std::min<std::size_t>(last - first, align_up(limit - planned, unit));
                runs.emplace_back(last - n, n);
                planned += n;
            }
        } catch (...) {
            return 0;
        }
        std::size_t taken = 0;
        for (const auto& [address, n] : runs) {
            try {
                take_range(address, n);
            } catch (...) {
                break;
            }
            f(address, n);
            taken += n;
        }
        return taken;
    }

    /// Removes and returns the block that starts at `address` in chunk `chunk` when it is smaller
    /// than `limit` bytes; a block of size 0 otherwise. O(log n); never allocates.
    [[nodiscard]] free_block take_at(std::uintptr_t address, std::uintptr_t chunk, std::size_t limit) noexcept {
        auto it = by_address_.find(address);
        if (it == by_address_.end() || it->second.chunk != chunk || it->second.size >= limit) return {};
        const free_block b{it->first, it->second.size, chunk};
        by_size_.erase({b.size, b.address});
        by_address_.erase(it);
        bytes_ -= b.size;
        whole_bytes_ -= whole(b.address, b.size);
        return b;
    }

    /// Removes and returns the block of chunk `chunk` that ends at `end`; a block of size 0 when
    /// there is none. O(log n); never allocates.
    [[nodiscard]] free_block take_ending_at(std::uintptr_t end, std::uintptr_t chunk) noexcept {
        auto it = by_address_.lower_bound(end);
        if (it == by_address_.begin()) return {};
        --it;
        if (it->second.chunk != chunk || it->first + it->second.size != end) return {};
        const free_block b{it->first, it->second.size, chunk};
        by_size_.erase({b.size, b.address});
        by_address_.erase(it);
        bytes_ -= b.size;
        whole_bytes_ -= whole(b.address, b.size);
        return b;
    }

    /// Removes every block for which `is_whole_chunk(address, size)` holds, passing each to
    /// `f(free_block)`.
    template <class Predicate, class F>
    void take_whole_chunks(Predicate&& is_whole_chunk, F&& f) {
        for (auto it = by_address_.begin(); it != by_address_.end();) {
            if (is_whole_chunk(it->first, it->second.size)) {
                const free_block b{it->first, it->second.size, it->second.chunk};
                by_size_.erase({b.size, b.address});
                it = by_address_.erase(it);
                bytes_ -= b.size;
                whole_bytes_ -= whole(b.address, b.size);
                f(b);
            } else {
                ++it;
            }
        }
    }

    /// Removes every block, passing each to `f(free_block)`.
    template <class F>
    void drain(F&& f) {
        for (const auto& [address, i] : by_address_) f(free_block{address, i.size, i.chunk});
        by_address_.clear();
        by_size_.clear();
        bytes_ = 0;
        whole_bytes_ = 0;
    }

    /// Calls `f(free_block)` for every block, in address order.
    template <class F>
    void for_each(F&& f) const {
        for (const auto& [address, i] : by_address_) f(free_block{address, i.size, i.chunk});
    }

private:
    struct info {
        std::size_t size;
        std::uintptr_t chunk;
    };
    using size_index = std::set<std::pair<std::size_t, std::uintptr_t>>;

    [[nodiscard]] std::size_t whole(std::uintptr_t address, std::size_t size) const noexcept {
        if (unit_ == 0) return 0;
        const std::uintptr_t first = align_up(address, unit_);
        const std::uintptr_t last = align_down(address + size, unit_);
        return last > first ? last - first : 0;
    }

    /// The smallest block that holds `size` bytes at `alignment`: one of the first few by size
    /// usually fits; past them, any block of size + alignment - 1 does, so the search stays
    /// logarithmic for any alignment.
    size_index::iterator find_fit(std::size_t size, std::size_t alignment) {
        const auto fits = [&](size_index::iterator it) { return align_up(it->second, alignment) - it->second + size <= it->first; };
        auto it = by_size_.lower_bound({size, 0});
        for (int tries = 0; it != by_size_.end() && tries < 8; ++it, ++tries) {
            if (fits(it)) return it;
        }
        if (it == by_size_.end()) return it;
        for (it = by_size_.lower_bound({size + alignment - 1, 0}); it != by_size_.end() && !fits(it); ++it) {
        }
        return it;
    }

    /// Cuts [address, address + size) out of the free block at `ait` (`sit`: its entry by size),
    /// leaving what is before and after it free; returns the block's chunk. Strong: the only step
    /// that allocates (a node for the piece after, when pieces stay on both sides) comes first.
    std::uintptr_t cut(std::map<std::uintptr_t, info>::iterator ait, size_index::iterator sit, std::uintptr_t address,
                       std::size_t size) {
        const std::uintptr_t start = ait->first;
        const std::size_t total = ait->second.size;
        const std::uintptr_t chunk = ait->second.chunk;
        const std::size_t front = address - start;
        const std::size_t back = total - front - size;
        if (front != 0 && back != 0) {
            auto [bit, ok] = by_address_.emplace(address + size, info{back, chunk});
            static_cast<void>(ok);
            try {
                by_size_.emplace(back, address + size);
            } catch (...) {
                by_address_.erase(bit);
                throw;
            }
        }
        auto an = by_address_.extract(ait);
        auto sn = by_size_.extract(sit);
        if (front != 0 || back != 0) {
            // Reuse the two nodes for the one remaining piece that has none yet.
            const std::uintptr_t rest = front != 0 ? start : address + size;
            const std::size_t rest_size = front != 0 ? front : back;
            an.key() = rest;
            an.mapped().size = rest_size;
            sn.value() = {rest_size, rest};
            by_address_.insert(std::move(an));
            by_size_.insert(std::move(sn));
        }
        bytes_ -= size;
        whole_bytes_ += whole(start, front) + whole(address + size, back) - whole(start, total);
        return chunk;
    }

    void resize(std::map<std::uintptr_t, info>::iterator it, std::size_t size) {
        auto sn = by_size_.extract({it->second.size, it->first});
        sn.value().first = size;
        it->second.size = size;
        by_size_.insert(std::move(sn));
    }

    std::map<std::uintptr_t, info> by_address_;
    size_index by_size_;
    std::size_t bytes_ = 0;
    std::size_t unit_ = 0;
    std::size_t whole_bytes_ = 0;
};

} // namespace custody::pool::detail
