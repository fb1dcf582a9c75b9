/// @file
/// `pool_statistics`: a stream_ordered_pool's counters beyond the resource_statistics every
/// resource reports: where its free memory sits, how it reused memory across streams, how
/// fragmented it is.
#pragma once

#include <custody/core/detail/format.hpp>
#include <custody/core/statistics.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace custody::pool {

/// The free bytes cached for one stream (blocks given back on it and not yet reusable elsewhere).
struct stream_free_bytes {
    std::uintptr_t stream_key = 0; ///< Platform::stream_key of the stream
    std::size_t bytes = 0;
    friend bool operator==(const stream_free_bytes&, const stream_free_bytes&) = default;
};

/// A snapshot of a pool. A plain value.
///
/// Accounting identity, exact whenever no call is in flight:
///   totals.reserved_bytes = live_block_bytes + stream_cached_bytes + shared_free_bytes
///                           + quarantined_bytes + capture_reserved_bytes
///   capture_reserved_bytes = capture_live_block_bytes + capture_free_bytes
/// where live_block_bytes >= totals.live_bytes (blocks are rounded up, see docs/pool.md).
struct pool_statistics {
    resource_statistics totals; ///< what statistics() returns
    std::size_t live_block_bytes = 0;    ///< bytes of the blocks handed out, after rounding
    std::size_t stream_cached_bytes = 0; ///< free bytes cached per stream, summed
    std::size_t shared_free_bytes = 0;   ///< free bytes usable by any stream at once
    std::size_t quarantined_bytes = 0;   ///< given back during graph capture: never reused (docs/pool.md)
    std::size_t capture_reserved_bytes = 0;   ///< held by capture-private pools (docs/pool.md)
    std::size_t capture_live_block_bytes = 0; ///< their blocks handed out, rounded
    std::size_t capture_free_bytes = 0;       ///< free in them: reusable by their later captures only
    std::size_t capture_pools = 0;            ///< capture-private pools alive
    std::size_t largest_free_block = 0;  ///< over the shared set and every stream's large blocks
    std::size_t chunks = 0;              ///< upstream chunks held (0 when the pool maps granules)
    /// When the pool grows by mapping (docs/pool.md): the address space it reserved and the granule
    /// it maps; upstream_allocations and upstream_deallocations then count map and unmap calls.
    std::size_t address_space_bytes = 0;
    std::size_t peak_address_span_bytes = 0; ///< the most of it in use: per region, its start to its highest mapped end
    std::size_t map_granule = 0;
    std::size_t streams = 0;             ///< streams with a shard
    std::uint64_t fast_allocations = 0;     ///< served from the stream's own size-class list (the O(1) path)
    std::uint64_t upstream_allocations = 0;
    std::uint64_t upstream_deallocations = 0;
    /// What the upstream keeps of what was given back to it (cuda_async: its driver pool's reserve
    /// beyond live blocks; trim() gives it back to the device); 0 when it cannot tell.
    std::size_t upstream_retained_bytes = 0;
    std::uint64_t opportunistic_reuses = 0; ///< streams' caches moved to the shared set after their event completed
    std::uint64_t dependency_waits = 0;     ///< times a stream was made to wait on another's event
    std::uint64_t host_waits = 0;           ///< host waits for another stream's event instead of growing (docs/pool.md)
    std::uint64_t retired_streams = 0;      ///< shards of quiet streams retired and given to new streams
    std::uint64_t reclaims = 0;             ///< last-resort reclaims (host waits) before a failure
    std::uint64_t failures = 0;             ///< out_of_memory thrown
    std::uint64_t misuses = 0;              ///< deallocates a checked pool refused (pool_options::checked)
    std::vector<stream_free_bytes> per_stream; ///< one entry per shard, in the order streams were met

    /// Peak reserved over peak live bytes: what the pool costs over what its users ever held at
    /// once (1.0 is perfect; 0 when nothing was ever live).
    [[nodiscard]] double fragmentation() const noexcept {
        return totals.peak_live_bytes == 0 ? 0.0
                                           : static_cast<double>(totals.peak_reserved_bytes) /
                                                 static_cast<double>(totals.peak_live_bytes);
    }
    /// 1 - largest free block / free bytes: 0 when the free memory is one block, near 1 when it
    /// is scattered in crumbs.
    [[nodiscard]] double external_fragmentation() const noexcept {
        const std::size_t free = stream_cached_bytes + shared_free_bytes;
        return free == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free_block) / static_cast<double>(free);
    }

    /// One line on where the memory is, as out_of_memory messages carry it: live bytes (requested
    /// and rounded), reserved bytes and chunks, the largest free block, shared free bytes, free
    /// bytes per stream, and reserved/live and external fragmentation.
    [[nodiscard]] std::string describe() const {
        std::string d = "pool: live " + std::to_string(totals.live_bytes) + " B (" + std::to_string(live_block_bytes) +
                        " B in blocks), reserved " + std::to_string(totals.reserved_bytes) + " B in " +
                        std::to_string(chunks) + " chunks, largest free block " + std::to_string(largest_free_block) +
                        " B, shared free " + std::to_string(shared_free_bytes) + " B, free per stream [";
        for (std::size_t i = 0; i < per_stream.size(); ++i) {
            d += (i == 0 ? "" : ", ") + custody::detail::to_hex(per_stream[i].stream_key) + ": " +
                 std::to_string(per_stream[i].bytes) + " B";
        }
        char ratio[96];
        const double reserved_per_live = totals.live_bytes == 0 ? 0.0
                                                                : static_cast<double>(totals.reserved_bytes) /
                                                                      static_cast<double>(totals.live_bytes);
        std::snprintf(ratio, sizeof ratio, "], fragmentation %.3f (reserved/live), %.3f (1 - largest/free)",
                      reserved_per_live, external_fragmentation());
        return d + ratio;
    }
};

} // namespace custody::pool
