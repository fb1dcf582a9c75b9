/// @file
/// The pool's call and byte counters: `counters`, kept per stream under its lock, and
/// `atomic_counters`, the same for calls served without a stream's shard; `activity_counters`, the
/// pool's rare events; and the leak report at the pool's end.
#pragma once

#include <custody/core/failure_callback.hpp>
#include <custody/core/statistics.hpp>
#include <custody/pool/pool_statistics.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string_view>

namespace custody::pool::detail {

/// Counts of one stream's calls. A block given back on another stream than its own makes a
/// stream's byte counts negative; their sums over the streams are the pool's.
/// Thread safety: none; the stream's shard lock guards it.
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

/// The counters of the calls that the slow path served (allocations) or that had no shard
/// (deallocations, and live bytes of allocations without one), kept with atomics.
///
/// Invariant: the pool's allocations = slow allocations + the shards' allocations (the fast path
/// counts in the shard; the slow path here), and the same for the other counts.
/// Thread safety: thread-safe (relaxed atomics: exact whenever no call is in flight).
class atomic_counters {
public:
    /// An allocation served by the slow path: a block of `size`; `live_bytes` requested bytes that
    /// no shard counts (0 when the stream has a shard).
    void allocated(std::size_t size, std::size_t live_bytes) noexcept {
        allocations_.fetch_add(1, std::memory_order_relaxed);
        block_bytes_.fetch_add(static_cast<std::int64_t>(size), std::memory_order_relaxed);
        if (live_bytes != 0) live_bytes_.fetch_add(static_cast<std::int64_t>(live_bytes), std::memory_order_relaxed);
    }
    /// A block of `size` bytes (`bytes` requested) given back without a shard.
    void deallocated(std::size_t size, std::size_t bytes) noexcept {
        deallocations_.fetch_add(1, std::memory_order_relaxed);
        block_bytes_.fetch_sub(static_cast<std::int64_t>(size), std::memory_order_relaxed);
        live_bytes_.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
    }
    [[nodiscard]] counters load() const noexcept {
        counters c;
        c.allocations = allocations_.load(std::memory_order_relaxed);
        c.deallocations = deallocations_.load(std::memory_order_relaxed);
        c.block_bytes = block_bytes_.load(std::memory_order_relaxed);
        c.live_bytes = live_bytes_.load(std::memory_order_relaxed);
        return c;
    }
    [[nodiscard]] std::uint64_t allocations() const noexcept { return allocations_.load(std::memory_order_relaxed); }

private:
    std::atomic<std::uint64_t> allocations_{0};
    std::atomic<std::uint64_t> deallocations_{0};
    std::atomic<std::int64_t> block_bytes_{0};
    std::atomic<std::int64_t> live_bytes_{0};
};

/// How often the pool took its slower roads: cross-stream reuse, host waits, failures.
/// Thread safety: thread-safe (relaxed atomics).
struct activity_counters {
    std::atomic<std::uint64_t> opportunistic_reuses{0}; ///< streams' caches moved after their event completed
    std::atomic<std::uint64_t> dependency_waits{0};     ///< a stream made to wait on another's event
    std::atomic<std::uint64_t> host_waits{0};           ///< host waits for another stream's event before growing
    std::atomic<std::uint64_t> retired{0};              ///< shards of quiet streams given to new ones
    std::atomic<std::uint64_t> reclaims{0};             ///< last-resort reclaims before a failure
    std::atomic<std::uint64_t> failures{0};             ///< out_of_memory thrown
    std::atomic<std::uint64_t> misuses{0};              ///< deallocates a checked pool refused

    static void count(std::atomic<std::uint64_t>& c) noexcept { c.fetch_add(1, std::memory_order_relaxed); }

    /// Copies the counts into `p`.
    void add_to(pool_statistics& p) const noexcept {
        p.opportunistic_reuses = opportunistic_reuses.load(std::memory_order_relaxed);
        p.dependency_waits = dependency_waits.load(std::memory_order_relaxed);
        p.host_waits = host_waits.load(std::memory_order_relaxed);
        p.retired_streams = retired.load(std::memory_order_relaxed);
        p.reclaims = reclaims.load(std::memory_order_relaxed);
        p.failures = failures.load(std::memory_order_relaxed);
        p.misuses = misuses.load(std::memory_order_relaxed);
    }
};

/// Reports, through custody::report_failure, the blocks still allocated when a pool ends (`s`: its
/// statistics then); nothing when there are none.
inline void report_leaks(const resource_statistics& s) noexcept {
    if (s.live_allocations == 0) return;
    char line[256];
    const int len = std::snprintf(line, sizeof line,
                                  "stream_ordered_pool destroyed with %zu blocks (%zu bytes) still "
                                  "allocated; their memory goes back to the upstream now",
                                  s.live_allocations, s.live_bytes);
    report_failure(std::string_view(line, len > 0 ? static_cast<std::size_t>(len) : 0U));
}

} // namespace custody::pool::detail
