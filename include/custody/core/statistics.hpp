/// @file
/// The statistics every resource reports, and a thread-safe counter that keeps them exact.
#pragma once

#include <custody/core/detail/atomic_peak.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace custody {

/// A snapshot of a resource's counters. A plain value: reading it never blocks the resource.
///
/// Invariants for a resource that owns its memory:
///   live_bytes       = sum of bytes of blocks handed out and not yet given back
///   live_allocations = allocations - deallocations
///   peak_live_bytes  = max over time of live_bytes
///   reserved_bytes   >= live_bytes (what the resource holds from its upstream; for a leaf
///                       resource reserved_bytes == live_bytes)
struct resource_statistics {
    std::size_t live_bytes = 0;
    std::size_t peak_live_bytes = 0;
    std::size_t reserved_bytes = 0;
    std::size_t peak_reserved_bytes = 0;
    std::size_t live_allocations = 0;
    std::uint64_t allocations = 0;   ///< successful non-empty allocations, ever
    std::uint64_t deallocations = 0; ///< non-null deallocations, ever

    friend bool operator==(const resource_statistics&, const resource_statistics&) = default;
};

/// Lock-free counters behind resource_statistics, for leaf resources whose reserved memory equals
/// their live memory. Thread-safe. The peak is exact: it is raised with a compare-exchange loop.
///
/// The live figures never go below zero: a deallocation larger than what is live here (a block an
/// equal resource handed out and this one was given back) lowers them to zero, no further. While
/// every block comes back to the counter that counted it, the figures are exact.
class statistics_counter {
public:
    /// Records an allocation of `bytes` (non-zero) that the upstream just satisfied; or `count`
    /// allocations of `bytes` and `reserved` bytes in all, at once.
    void on_allocate(std::size_t bytes, std::size_t reserved, std::size_t count = 1) noexcept {
        const std::size_t live = live_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
        detail::raise_peak(peak_live_bytes_, live);
        const std::size_t res = reserved_bytes_.fetch_add(reserved, std::memory_order_relaxed) + reserved;
        detail::raise_peak(peak_reserved_bytes_, res);
        live_allocations_.fetch_add(count, std::memory_order_relaxed);
        allocations_.fetch_add(count, std::memory_order_relaxed);
    }

    /// Records that a block of `bytes` (and `reserved` held for it) was given back; or `count`
    /// blocks of `bytes` and `reserved` bytes in all.
    void on_deallocate(std::size_t bytes, std::size_t reserved, std::size_t count = 1) noexcept {
        lower(live_bytes_, bytes);
        lower(reserved_bytes_, reserved);
        lower(live_allocations_, count);
        deallocations_.fetch_add(count, std::memory_order_relaxed);
    }

    [[nodiscard]] resource_statistics snapshot() const noexcept {
        resource_statistics s;
        s.live_bytes = live_bytes_.load(std::memory_order_relaxed);
        s.peak_live_bytes = peak_live_bytes_.load(std::memory_order_relaxed);
        s.reserved_bytes = reserved_bytes_.load(std::memory_order_relaxed);
        s.peak_reserved_bytes = peak_reserved_bytes_.load(std::memory_order_relaxed);
        s.live_allocations = live_allocations_.load(std::memory_order_relaxed);
        s.allocations = allocations_.load(std::memory_order_relaxed);
        s.deallocations = deallocations_.load(std::memory_order_relaxed);
        return s;
    }

private:
    /// counter := max(0, counter - n), atomically.
    static void lower(std::atomic<std::size_t>& counter, std::size_t n) noexcept {
        std::size_t seen = counter.load(std::memory_order_relaxed);
        while (!counter.compare_exchange_weak(seen, seen - (n < seen ? n : seen), std::memory_order_relaxed)) {
        }
    }

    std::atomic<std::size_t> live_bytes_{0};
    std::atomic<std::size_t> peak_live_bytes_{0};
    std::atomic<std::size_t> reserved_bytes_{0};
    std::atomic<std::size_t> peak_reserved_bytes_{0};
    std::atomic<std::size_t> live_allocations_{0};
    std::atomic<std::uint64_t> allocations_{0};
    std::atomic<std::uint64_t> deallocations_{0};
};

} // namespace custody
