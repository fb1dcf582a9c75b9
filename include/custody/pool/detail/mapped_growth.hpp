/// @file
/// `mapped_growth`: how a pool grows over an upstream that maps memory into one reserved address
/// range (resource::virtual_memory): granules mapped beside the free memory that needs them, and
/// wholly free granules unmapped, so that chunks have no boundaries and memory really goes back.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/statistics.hpp>
#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/chunk_map.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/growth.hpp>
#include <custody/pool/detail/mapped_space.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/pool_statistics.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace custody::pool::detail {

/// An upstream the pool can grow in by mapping: the one owner of a reserved range
/// (reserved_bytes(), granularity()), of which the pool claims a part (claim, unclaim) to map and
/// unmap granule-aligned pieces of itself (map_at, unmap_at; is_mapped tells a granule that would
/// not unmap), as resource::virtual_memory does. The rest of the range serves the upstream's own
/// allocate (the pool's capture-private chunks, direct calls).
template <class U>
concept mapping_upstream = stream_ordered_resource<U> && requires(U& u, const U& cu, void* p, std::size_t n) {
    { u.claim(n) } noexcept -> std::same_as<void*>;
    { u.unclaim(p) } noexcept;
    { u.map_at(p, n) } -> std::same_as<bool>;
    { u.unmap_at(p, n) } noexcept -> std::same_as<bool>;
    { cu.is_mapped(p) } -> std::same_as<bool>;
    { cu.reserved_bytes() } -> std::convertible_to<std::size_t>;
    { cu.granularity() } -> std::convertible_to<std::size_t>;
};

/// The address space a pool claims of its upstream's reservation of `reserved` bytes (granule
/// `granule`): the upper three quarters. The lower quarter is left to the upstream's own allocate,
/// which serves the pool's capture-private chunks (announced to CUDA's tools as heaps of their own,
/// apart from the pool's) and any direct call. With the default reservation, four times the
/// device's memory, the pool's part holds three times what the device can map.
[[nodiscard]] constexpr std::size_t arena_bytes(std::size_t reserved, std::size_t granule) noexcept {
    return align_down(reserved - reserved / 4, granule);
}

/// Claims the pool's arena (arena_bytes) of `upstream`; throws out_of_memory when its range has no
/// free part that large (the upstream handed it out already).
template <mapping_upstream Upstream>
[[nodiscard]] std::uintptr_t claim_arena(Upstream& upstream, int device) {
    const std::size_t bytes = arena_bytes(upstream.reserved_bytes(), upstream.granularity());
    void* p = bytes < 2 * upstream.granularity() ? nullptr : upstream.claim(bytes);
    if (p == nullptr) {
        throw out_of_memory(bytes, upstream.granularity(), device, resource_statistics{}, "stream_ordered_pool",
                            "the upstream's range has no free part for the pool to grow in (three quarters of it)");
    }
    return reinterpret_cast<std::uintptr_t>(p);
}

/// Growth by mapping, in the part of the upstream's range the pool claims (claim_arena) split into
/// one region per block kind (mapped_space). The free sets hold mapped free memory only; blocks of one region coalesce
/// whatever was mapped when (free_block::chunk is the region's base), so there are no chunks.
///
/// - **Growing** maps the fewest granules that make the block fit, beside the free memory they
///   join (mapped_space::place): at a region's mapped end, or in a hole unmapped earlier.
/// - **Mapping never adds to free memory that lies idle.** Before mapping g granules, up to g
///   granules that are wholly free in the sets (other than the ones the block joins) are unmapped
///   first: what the pool maps stays what its live blocks need, as if free memory could move.
/// - **Releasing**: the sets keep at most `release_threshold` bytes of wholly free granules; beyond
///   that they are unmapped as they come back (largest free blocks first), so that a step's churn
///   does not remap every step while memory goes back to the device. trim() and the last resort
///   before out_of_memory unmap all of them.
///
/// - **A granule that would not unmap** (the upstream keeps it, reported) stays mapped in the
///   bookkeeping too, withheld: in no free set, never mapped over, counted among the quarantined
///   bytes until the pool ends.
///
/// Invariant: reserved() = space().mapped() = the bytes the upstream mapped for the pool;
///   withheld_ = the bytes of the granules that would not unmap (mapped, in no free set).
/// Thread safety: none of its own; the shared store calls it under its lock. Stream semantics:
/// only memory in the shared sets (idle: no work uses it) is ever unmapped. Ownership: refers to
/// the upstream, which owns the range and outlives it.
template <mapping_upstream Upstream>
class mapped_growth {
public:
    using stream_type = typename Upstream::stream_type;
    static constexpr bool keeps_tails = false;
    static constexpr std::size_t chunk_alignment = granule;

    /// Over `upstream`, announcing its two regions to CUDA's tools as heaps through `annotations`
    /// at the first map (both outlive it): a block may span granules mapped at different times, and
    /// a tool wants each block inside one heap.
    mapped_growth(Upstream& upstream, const pool_options& options, int device,
                  custody::detail::memory_annotations& annotations)
        : upstream_(upstream), budget_(upstream, options, device), annotations_(annotations),
          space_(claim_arena(upstream, device), arena_bytes(upstream.reserved_bytes(), upstream.granularity()),
                 upstream.granularity()),
          keep_(options.release_threshold) {
        for (block_kind k : block_kinds) chunks_.add(space_.region(k).address, space_.region(k).bytes, k);
    }

    /// Makes the free sets count whole granules (what release and growth unmap).
    void prepare(per_kind<free_set>& sets) const noexcept {
        for (auto& set : sets) set.count_whole(space_.granule());
    }

    /// The regions (a block's chunk is its region).
    [[nodiscard]] const chunk_map& chunks() const noexcept { return chunks_; }
    [[nodiscard]] const mapped_space& space() const noexcept { return space_; }
    [[nodiscard]] std::size_t reserved() const noexcept { return space_.mapped(); }
    [[nodiscard]] std::size_t reserved(block_kind k) const noexcept { return space_.mapped(k); }
    [[nodiscard]] std::size_t peak_reserved() const noexcept { return space_.peak_mapped(); }
    [[nodiscard]] bool may_take(std::size_t n) const { return budget_.allows(n, space_.mapped()); }
    [[nodiscard]] const device_budget<Upstream>& budget() const noexcept { return budget_; }
    void set_maximum(std::size_t bytes) noexcept { budget_.set_maximum(bytes); }
    [[nodiscard]] std::size_t release_threshold() const noexcept { return keep_; }

    /// Maps granules into region `kind` so that a block of `size` at `alignment` fits in
    /// sets[kind], unmapping as many wholly free granules elsewhere first. False when the range has
    /// no room, the limits refuse or the device has no memory left.
    bool grow(per_kind<free_set>& sets, block_kind kind, std::size_t size, std::size_t alignment) {
        const std::uintptr_t region = space_.region(kind).address;
        const auto before = [&](std::uintptr_t a) { return sets[kind].bytes_ending_at(a, region); };
        const auto after = [&](std::uintptr_t a) { return sets[kind].bytes_at(a, region); };
        const std::optional<address_run> run = space_.place(kind, size, std::min(alignment, space_.granule()), before, after);
        if (!run) return false;
        unmap_whole(sets, run->bytes, *run);
        return may_take(run->bytes) && map(sets, kind, *run);
    }

    /// The bytes that growing for a block of `size` at `alignment` in region `kind` would map
    /// beyond the wholly free granules `sets` hold (which it unmaps first): what idle memory kept
    /// elsewhere (streams' caches) should give back before the pool maps more. 0 when no room.
    [[nodiscard]] std::size_t shortfall(const per_kind<free_set>& sets, block_kind kind, std::size_t size,
                                        std::size_t alignment) const {
        const std::uintptr_t region = space_.region(kind).address;
        const auto before = [&](std::uintptr_t a) { return sets[kind].bytes_ending_at(a, region); };
        const auto after = [&](std::uintptr_t a) { return sets[kind].bytes_at(a, region); };
        const std::optional<address_run> run = space_.place(kind, size, std::min(alignment, space_.granule()), before, after);
        if (!run) return 0;
        // The free blocks the new one joins are not given back for it.
        const std::size_t joined = before(run->address) + after(run->address + run->bytes);
        std::size_t whole = sets[block_kind::small].whole_bytes() + sets[block_kind::large].whole_bytes();
        whole -= std::min(whole, joined);
        return run->bytes > whole ? run->bytes - whole : 0;
    }

    /// Unmaps `r`, whole granules of idle memory taken out of a stream's cache; when there is no
    /// host memory for the bookkeeping, `r` goes into `sets` instead (it is idle).
    void unmap_idle(per_kind<free_set>& sets, address_run r) noexcept {
        const block_kind k = space_.kind_of(r.address);
        try {
            space_.unmapping(k, r);
        } catch (...) {
            try {
                sets[k].insert({r.address, r.bytes, space_.region(k).address, k});
            } catch (...) {
                report_failure("stream_ordered_pool: no host memory to keep a free granule; it stays unused");
            }
            return;
        }
        unmap_now(reinterpret_cast<void*>(r.address), r.bytes);
    }

    /// Maps `n` bytes (rounded up to granules) at the start of region `kind` (the pool's initial
    /// size).
    bool grow_exactly(per_kind<free_set>& sets, block_kind kind, std::size_t n) {
        const address_run run{space_.region(kind).address, align_up(n, space_.granule())};
        return run.bytes <= space_.region(kind).bytes && may_take(run.bytes) && map(sets, kind, run);
    }

    /// Unmaps the wholly free granules of `sets` beyond `keep` bytes of them, largest free blocks
    /// first; returns the bytes unmapped.
    std::size_t release(per_kind<free_set>& sets, std::size_t keep = 0) noexcept {
        const std::size_t whole = sets[block_kind::small].whole_bytes() + sets[block_kind::large].whole_bytes();
        if (whole <= keep) return 0;
        return unmap_whole(sets, whole - keep, address_run{});
    }

    /// After blocks came back into `sets`: unmaps what exceeds the release threshold.
    void on_returned(per_kind<free_set>& sets) noexcept {
        if (sets[block_kind::small].whole_bytes() + sets[block_kind::large].whole_bytes() > keep_) release(sets, keep_);
    }

    /// Unmaps everything mapped, free or not (the pool's end).
    void release_all() noexcept {
        if (announced_) {
            for (block_kind k : block_kinds) annotations_.heap_returned(reinterpret_cast<void*>(space_.region(k).address));
        }
        bool all = true;
        for (block_kind k : block_kinds) {
            std::vector<address_run> runs;
            try {
                space_.for_each_mapped(k, [&](address_run r) { runs.push_back(r); });
            } catch (...) {
                return; // the upstream unmaps what is left when it ends
            }
            for (const address_run& r : runs) {
                try {
                    space_.unmapping(k, r);
                } catch (...) {
                }
                all = upstream_.unmap_at(reinterpret_cast<void*>(r.address), r.bytes) && all;
            }
        }
        if (all) upstream_.unclaim(reinterpret_cast<void*>(space_.region(block_kind::small).address));
    }

    /// The address range, the granule and the map and unmap calls, into `p`.
    void add_to(pool_statistics& p) const {
        p.chunks = 0;
        p.upstream_allocations = map_calls_;
        p.upstream_deallocations = unmap_calls_;
        p.upstream_retained_bytes = budget_.upstream_retained();
        p.address_space_bytes = space_.region(block_kind::small).bytes + space_.region(block_kind::large).bytes;
        p.peak_address_span_bytes = space_.peak_span();
        p.map_granule = space_.granule();
        p.quarantined_bytes += withheld_;
    }

private:
    /// Maps `run` (inside an unmapped run of region `kind`) into sets[kind]. Strong: on any failure
    /// nothing stays mapped.
    bool map(per_kind<free_set>& sets, block_kind kind, address_run run) {
        void* p = reinterpret_cast<void*>(run.address);
        if (!upstream_.map_at(p, run.bytes)) return false;
        ++map_calls_;
        if (!announced_) announce();
        try {
            space_.mapping(kind, run);
        } catch (...) {
            unmap_now(p, run.bytes);
            throw;
        }
        try {
            sets[kind].insert({run.address, run.bytes, space_.region(kind).address, kind});
        } catch (...) {
            try {
                space_.unmapping(kind, run); // joins the run it was cut from: no node is needed
            } catch (...) {
            }
            unmap_now(p, run.bytes);
            throw;
        }
        return true;
    }

    /// Unmaps up to `limit` bytes of wholly free granules of `sets`, in neither of the free blocks
    /// that touch `keep_beside` (the run about to be mapped, whose neighbours the new block joins);
    /// returns the bytes unmapped.
    std::size_t unmap_whole(per_kind<free_set>& sets, std::size_t limit, address_run keep_beside) noexcept {
        std::size_t done = 0;
        const auto beside = [&](const free_block& b) {
            return keep_beside.bytes != 0 &&
                   (b.address + b.size == keep_beside.address || b.address == keep_beside.address + keep_beside.bytes);
        };
        for (block_kind k : {block_kind::large, block_kind::small}) {
            if (done >= limit || sets[k].whole_bytes() == 0) continue;
            done += sets[k].take_whole(space_.granule(), limit - done, beside, [&](std::uintptr_t a, std::size_t n) {
                unmap_idle(sets, address_run{a, n});
            });
        }
        return done;
    }

    /// Tells CUDA's tools that the two regions are the pool's heaps: after the first map, so that
    /// the runtime is up (blocks are only ever cut from mapped granules); withdrawn at the end.
    void announce() noexcept {
        announced_ = true;
        for (block_kind k : block_kinds) {
            annotations_.heap_taken(reinterpret_cast<void*>(space_.region(k).address), space_.region(k).bytes,
                                    "custody stream_ordered_pool");
        }
    }

    /// Unmaps `bytes` at `p` (already recorded as unmapped in space_). A granule that would not
    /// unmap is withheld: recorded as mapped again, in no free set (withheld_, reported with the
    /// quarantine), so that no growth maps over it.
    void unmap_now(void* p, std::size_t bytes) noexcept {
        ++unmap_calls_;
        if (upstream_.unmap_at(p, bytes)) return;
        report_failure("stream_ordered_pool: a granule could not be unmapped; the upstream keeps it, and the pool "
                       "never uses it again");
        const auto base = reinterpret_cast<std::uintptr_t>(p);
        for (std::uintptr_t g = base; g < base + bytes; g += space_.granule()) {
            bool kept = true;
            try {
                kept = upstream_.is_mapped(reinterpret_cast<void*>(g));
            } catch (...) {
            }
            if (!kept) continue;
            try {
                space_.mapping(space_.kind_of(g), address_run{g, space_.granule()});
                withheld_ += space_.granule();
            } catch (...) { // no host memory to record it: it stays out of the bookkeeping
            }
        }
    }

    Upstream& upstream_;
    device_budget<Upstream> budget_;
    custody::detail::memory_annotations& annotations_;
    bool announced_ = false; ///< the regions are heaps (from the first map on)
    mapped_space space_;
    chunk_map chunks_; ///< the two regions
    std::size_t keep_; ///< release_threshold
    std::uint64_t map_calls_ = 0;
    std::uint64_t unmap_calls_ = 0;
    std::size_t withheld_ = 0; ///< granules that would not unmap: mapped, never used again
};

} // namespace custody::pool::detail
