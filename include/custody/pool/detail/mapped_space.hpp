/// @file
/// `mapped_space`: the pool's address range when it grows by mapping memory: one region per block
/// kind, which of their granules are mapped, and where the next granules go.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/detail/atomic_peak.hpp>
#include <custody/pool/detail/block_kind.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>

namespace custody::pool::detail {

/// A granule-aligned range of the address space: [address, address + bytes).
struct address_run {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
};

/// Bookkeeping of one range (the pool's claim of its upstream's reservation) split into two
/// regions, the lower quarter for size-class blocks and the upper three quarters for large ones (a
/// long-lived small block never pins a granule that large blocks need; a single large block may
/// take most of the range), and of the granules mapped in each. It maps nothing itself: the store
/// maps and unmaps, and tells it.
///
/// Invariants (g: the granule):
///   region(k) = [base_k, base_k + size_k), granule-aligned, the two disjoint
///   unmapped_[k]: disjoint, non-adjacent, granule-aligned runs inside region(k); every granule of
///     region(k) that no run holds is mapped
///   mapped_ = sum over k of (size_k - the bytes of unmapped_[k]) <= peak_mapped_
/// Thread safety: none for the runs (the store's lock guards them); mapped() and peak_mapped()
/// may be read from any thread. Complexity: place is O(r log f) for r unmapped runs and f free
/// blocks; mapped and unmapped are O(log r).
class mapped_space {
public:
    /// Over [base, base + bytes) (granule-aligned, at least two granules), granule `granule` (a
    /// power of two).
    mapped_space(std::uintptr_t base, std::size_t bytes, std::size_t granule) : granule_(granule) {
        const std::size_t quarter = std::max(granule, align_down(bytes / 4, granule));
        regions_[block_kind::small] = {base, quarter};
        regions_[block_kind::large] = {base + quarter, align_down(bytes - quarter, granule)};
        for (block_kind k : block_kinds) unmapped_[k].emplace(regions_[k].address, regions_[k].bytes);
    }

    [[nodiscard]] std::size_t granule() const noexcept { return granule_; }
    [[nodiscard]] address_run region(block_kind k) const noexcept { return regions_[k]; }
    [[nodiscard]] std::size_t mapped() const noexcept { return mapped_.load(std::memory_order_relaxed); }
    [[nodiscard]] std::size_t peak_mapped() const noexcept { return peak_mapped_.load(std::memory_order_relaxed); }
    [[nodiscard]] std::size_t mapped(block_kind k) const noexcept { return kind_mapped_[k]; }
    /// The most of the regions ever in use: per region, from its start to its highest mapped end.
    [[nodiscard]] std::size_t peak_span() const noexcept { return span_[block_kind::small] + span_[block_kind::large]; }
    /// The number of unmapped runs of `k` (holes, and the region's unmapped end).
    [[nodiscard]] std::size_t holes(block_kind k) const noexcept { return unmapped_[k].size(); }

    /// The granules to map for a block of `size` bytes at `alignment` (<= the granule) in region
    /// `k`: the fewest, given the free mapped memory beside each unmapped run (`free_before(a)`:
    /// the bytes of the free block of the region that ends at a, or 0; `free_after(a)`: of the one
    /// that starts at a). A run holds the block at its start, joined to the free block before it; or
    /// at its end, joined to the one after it; or, mapped whole, bridging the two. Ties go to the
    /// lowest address, so that memory stays packed at the region's start. Nothing when no run can
    /// hold the block.
    template <class Before, class After>
    [[nodiscard]] std::optional<address_run> place(block_kind k, std::size_t size, std::size_t alignment,
                                                   Before&& free_before, After&& free_after) const {
        std::optional<address_run> best;
        if (size > regions_[k].bytes || alignment > granule_) return best; // no run could hold it (nor overflow)
        const auto consider = [&](std::uintptr_t address, std::size_t bytes) {
            if (!best || bytes < best->bytes) best = address_run{address, bytes};
        };
        for (const auto& [start, length] : unmapped_[k]) {
            const std::uintptr_t end = start + length;
            const std::size_t before = free_before(start);
            const std::size_t after = free_after(end);
            const std::uintptr_t first = align_up(start - before, alignment); // the block's start, joined before
            if (first + size <= start || size <= after) continue; // a free block fits alone
            if (const std::size_t need = align_up(first + size - start, granule_); need <= length) {
                consider(start, need);
            }
            if (first + size > end + after) continue; // not even bridging holds it
            const std::uintptr_t last = align_down(end + after - size, alignment); // the block's start, joined after
            if (last >= start) {
                const std::uintptr_t from = align_down(last, granule_);
                consider(from, end - from);
            } else {
                consider(start, length); // bridging
            }
            if (best && best->bytes == granule_) break; // nothing maps less
        }
        return best;
    }

    /// Records that `r` (inside unmapped runs of region `k`) is about to be mapped. Strong: a
    /// bad_alloc (splitting a run) changes nothing. Undo with unmapped(k, r).
    void mapping(block_kind k, address_run r) {
        auto& runs = unmapped_[k];
        auto it = std::prev(runs.upper_bound(r.address));
        const std::uintptr_t start = it->first;
        const std::uintptr_t end = it->first + it->second;
        if (r.address + r.bytes < end) runs.emplace(r.address + r.bytes, end - r.address - r.bytes); // may throw
        if (r.address == start) {
            runs.erase(it);
        } else {
            it->second = r.address - start;
        }
        add_mapped(k, static_cast<std::ptrdiff_t>(r.bytes));
        span_[k] = std::max(span_[k], r.address + r.bytes - regions_[k].address);
    }

    /// Records that `r` (mapped, inside region `k`) is unmapped now, joining the runs beside it.
    /// Strong: a bad_alloc (a run of its own) changes nothing; call it before unmapping.
    void unmapping(block_kind k, address_run r) {
        auto& runs = unmapped_[k];
        auto next = runs.lower_bound(r.address);
        const bool joins_next = next != runs.end() && next->first == r.address + r.bytes;
        if (next != runs.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second == r.address) {
                prev->second += r.bytes + (joins_next ? next->second : 0);
                if (joins_next) runs.erase(next);
                add_mapped(k, -static_cast<std::ptrdiff_t>(r.bytes));
                return;
            }
        }
        if (joins_next) {
            auto node = runs.extract(next);
            node.key() = r.address;
            node.mapped() += r.bytes;
            runs.insert(std::move(node));
        } else {
            runs.emplace(r.address, r.bytes); // may throw
        }
        add_mapped(k, -static_cast<std::ptrdiff_t>(r.bytes));
    }

    /// Calls `f(address_run)` for every mapped run of region `k`, in address order.
    template <class F>
    void for_each_mapped(block_kind k, F&& f) const {
        std::uintptr_t at = regions_[k].address;
        for (const auto& [start, length] : unmapped_[k]) {
            if (start > at) f(address_run{at, start - at});
            at = start + length;
        }
        const std::uintptr_t end = regions_[k].address + regions_[k].bytes;
        if (end > at) f(address_run{at, end - at});
    }

    /// The kind whose region holds `address`.
    [[nodiscard]] block_kind kind_of(std::uintptr_t address) const noexcept {
        return address >= regions_[block_kind::large].address ? block_kind::large : block_kind::small;
    }

private:
    void add_mapped(block_kind k, std::ptrdiff_t delta) noexcept {
        kind_mapped_[k] = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(kind_mapped_[k]) + delta);
        const std::size_t now = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(mapped_.load(std::memory_order_relaxed)) + delta);
        mapped_.store(now, std::memory_order_relaxed);
        custody::detail::raise_peak(peak_mapped_, now);
    }

    std::size_t granule_;
    per_kind<address_run> regions_{};
    per_kind<std::map<std::uintptr_t, std::size_t>> unmapped_{}; ///< start -> length
    per_kind<std::size_t> kind_mapped_{};
    per_kind<std::size_t> span_{}; ///< per region: the highest mapped end ever, from its start
    std::atomic<std::size_t> mapped_{0};
    std::atomic<std::size_t> peak_mapped_{0};
};

} // namespace custody::pool::detail
