/// @file
/// Replaying a device_program through one allocator: the untimed measuring pass (reserved bytes
/// after every operation), the timed repetitions (the loop alone), and the figures they give.
#pragma once

#include "program.hpp"
#include "progress.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace custody::replay {

/// Sampled series over the operations: at point j, the largest live and reserved bytes seen in
/// the operations up to op[j] since the previous point.
struct timeline {
    std::vector<std::uint64_t> op;
    std::vector<std::uint64_t> live;
    std::vector<std::uint64_t> reserved;
};

/// What a pool that grows by mapping did with its address range (pool_statistics' figures after
/// the measuring pass).
struct mapping_figures {
    std::uint64_t address_space = 0;   ///< the address space it reserved
    std::uint64_t peak_span = 0;       ///< the most of it ever in use (from each region's start to its highest mapped end)
    std::uint64_t granule = 0;         ///< the unit it maps
    std::uint64_t map_calls = 0;       ///< over the measuring pass
    std::uint64_t unmap_calls = 0;
    std::uint64_t live_at_end = 0;     ///< the trace's live bytes at its end, in blocks (rounded)
    std::uint64_t mapped_after_trim = 0; ///< what trim() left mapped after the trace
};

/// What the measuring pass saw of one allocator on one device.
struct measurement {
    std::uint64_t peak_reserved = 0;
    /// Reserved and live bytes after each operation, averaged over the operations: what the
    /// allocator held over the trace, beside what was live (a pool that gives memory back as it
    /// comes free keeps the first close to the second, whatever its peak).
    double mean_reserved = 0;
    double mean_live = 0;
    std::uint64_t reserved_at_peak = 0;               ///< after the op where the trace's live bytes peak
    std::optional<std::uint64_t> largest_free_at_peak; ///< when the allocator can tell
    std::optional<std::uint64_t> observed_peak_live;   ///< the allocator's own count, when it keeps one
    std::optional<std::size_t> first_over_capacity;    ///< first op after which reserved > capacity
    std::uint64_t failed_allocations = 0;
    std::optional<std::size_t> first_failure;
    std::string failure_message;
    std::optional<mapping_figures> mapping; ///< for a pool that grows by mapping
    replay::timeline timeline;
};

struct run_options {
    std::uint64_t capacity = std::uint64_t{80} << 30;
    std::size_t timeline_points = 2000;
};

/// One allocator replaying one device's program, behind a virtual call per replay (never per op).
class driver {
public:
    virtual ~driver() = default;
    /// The measuring pass: one replay from a fresh allocator, sampled after every operation.
    virtual measurement measure(const device_program& p, const run_options& options, progress& bar) = 0;
    /// One timed replay from a fresh allocator; the seconds its loop took.
    virtual double timed(const device_program& p) = 0;
};

/// What an allocator offers the replay (each concrete adaptor below provides it):
///   void* allocate(std::uint16_t stream, std::uint64_t bytes, std::size_t alignment) noexcept;  // nullptr: failed
///   void  deallocate(std::uint16_t stream, void* p, std::uint64_t bytes, std::size_t alignment) noexcept;
///   std::uint64_t reserved() const;                      // bytes it holds now
///   std::optional<std::uint64_t> largest_free() const;   // its largest free block, if known
///   std::optional<std::uint64_t> peak_live() const;      // its own count of peak live bytes, if kept
///   void settle();                                       // waits for outstanding work (not timed)
///   const std::string& failure() const;                  // why the last allocate failed
/// and may offer `std::optional<mapping_figures> mapping()`, called after the measuring pass and its
/// settle (it may trim).
template <class A>
concept replay_allocator = requires(A& a, const A& ca, std::uint16_t s, std::uint64_t n, std::size_t al, void* p) {
    { a.allocate(s, n, al) } noexcept -> std::same_as<void*>;
    { a.deallocate(s, p, n, al) } noexcept;
    { ca.reserved() } -> std::convertible_to<std::uint64_t>;
    { ca.largest_free() } -> std::same_as<std::optional<std::uint64_t>>;
    { ca.peak_live() } -> std::same_as<std::optional<std::uint64_t>>;
    a.settle();
    { ca.failure() } -> std::convertible_to<std::string>;
};

namespace detail {

/// Operations [first, last) of `p` on `a`: the whole timed loop.
template <class A>
inline void run_ops(A& a, const device_program& p, void** slots, std::size_t first, std::size_t last) noexcept {
    const op* ops = p.ops.data();
    for (std::size_t i = first; i < last; ++i) {
        const op& o = ops[i];
        const std::size_t alignment = std::size_t{1} << o.alignment_log2;
        if (o.kind == op_kind::allocate) {
            slots[o.slot] = a.allocate(o.stream, o.bytes, alignment);
        } else if (void* q = slots[o.slot]) {
            a.deallocate(o.stream, q, o.bytes, alignment);
        }
    }
}

/// Gives back what the trace leaves live, so the allocator ends empty.
template <class A>
inline void release_live(A& a, const device_program& p, std::vector<void*>& slots) noexcept {
    for (const live_block& b : p.live_at_end) {
        if (void* q = slots[b.slot]) a.deallocate(b.stream, q, b.bytes, std::size_t{1} << b.alignment_log2);
        slots[b.slot] = nullptr;
    }
}

} // namespace detail

/// The driver of adaptor `A`, built fresh for every replay by `make()` (a callable returning
/// std::unique_ptr<A>; construction and destruction are not timed).
template <replay_allocator A, class Make>
class driver_for final : public driver {
public:
    explicit driver_for(Make make) : make_(std::move(make)) {}

    measurement measure(const device_program& p, const run_options& options, progress& bar) override {
        measurement m;
        std::unique_ptr<A> a = make_();
        std::vector<void*> slots(p.slots, nullptr);
        const std::size_t n = p.ops.size();
        const std::size_t bucket = std::max<std::size_t>(1, (n + options.timeline_points - 1) / std::max<std::size_t>(1, options.timeline_points));
        std::uint64_t live = 0, bucket_live = 0, bucket_reserved = 0;
        long double reserved_sum = 0, live_sum = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const op& o = p.ops[i];
            const std::size_t alignment = std::size_t{1} << o.alignment_log2;
            if (o.kind == op_kind::allocate) {
                void* q = a->allocate(o.stream, o.bytes, alignment);
                slots[o.slot] = q;
                if (q != nullptr) {
                    live += o.bytes;
                } else {
                    if (m.failed_allocations++ == 0) {
                        m.first_failure = i;
                        m.failure_message = a->failure();
                    }
                }
            } else if (void* q = slots[o.slot]) {
                a->deallocate(o.stream, q, o.bytes, alignment);
                live -= o.bytes;
            }
            const std::uint64_t reserved = a->reserved();
            m.peak_reserved = std::max(m.peak_reserved, reserved);
            reserved_sum += static_cast<long double>(reserved);
            live_sum += static_cast<long double>(live);
            if (i == p.peak_live_op) {
                m.reserved_at_peak = reserved;
                m.largest_free_at_peak = a->largest_free();
            }
            if (!m.first_over_capacity && reserved > options.capacity) m.first_over_capacity = i;
            bucket_live = std::max(bucket_live, live);
            bucket_reserved = std::max(bucket_reserved, reserved);
            if ((i + 1) % bucket == 0 || i + 1 == n) {
                m.timeline.op.push_back(i);
                m.timeline.live.push_back(bucket_live);
                m.timeline.reserved.push_back(bucket_reserved);
                bucket_live = bucket_reserved = 0;
            }
            if ((i & 0xFFFF) == 0xFFFF) bar.advance(0x10000);
        }
        bar.advance(n & 0xFFFF);
        if (n != 0) {
            m.mean_reserved = static_cast<double>(reserved_sum / static_cast<long double>(n));
            m.mean_live = static_cast<double>(live_sum / static_cast<long double>(n));
        }
        a->settle();
        m.observed_peak_live = a->peak_live();
        if constexpr (requires { a->mapping(); }) m.mapping = a->mapping();
        detail::release_live(*a, p, slots);
        return m;
    }

    double timed(const device_program& p) override {
        std::unique_ptr<A> a = make_();
        slots_.assign(p.slots, nullptr);
        const auto t0 = std::chrono::steady_clock::now();
        detail::run_ops(*a, p, slots_.data(), 0, p.ops.size());
        const auto t1 = std::chrono::steady_clock::now();
        a->settle();
        detail::release_live(*a, p, slots_);
        return std::chrono::duration<double>(t1 - t0).count();
    }

private:
    Make make_;
    std::vector<void*> slots_;
};

template <class A, class Make>
std::unique_ptr<driver> make_driver(Make make) {
    return std::make_unique<driver_for<A, Make>>(std::move(make));
}

/// The median of `v` (the mean of the middle two for an even count); 0 for none.
[[nodiscard]] inline double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const std::size_t m = v.size() / 2;
    return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2.0;
}

} // namespace custody::replay
