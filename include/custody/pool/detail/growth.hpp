/// @file
/// `growth_rule`: how large a chunk the pool takes from its upstream when it grows, and the limits
/// that say whether it may (maximum_size, the device budget), and the options' defaults;
/// `device_budget`: those limits applied to an upstream and its device.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/format.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/pool/detail/size_classes.hpp>
#include <custody/pool/pool_options.hpp>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace custody::pool::detail {

/// The GPU's large page, which cudaMalloc rounds every allocation to: a chunk for one large request
/// is its size rounded up to this; a chunk sized by growth_divisor is rounded down to it.
inline constexpr std::size_t chunk_rounding = std::size_t{2} << 20;

/// `o` with its defaults applied: growth_step 0 becomes the granule, record_interval 0 becomes 1
/// (and one above 2^32 - 1 becomes that),
/// growth_step is rounded up to the granule. Throws std::invalid_argument for max_streams == 0.
[[nodiscard]] inline pool_options validated(pool_options o) {
    if (o.max_streams == 0) throw std::invalid_argument("custody: pool_options::max_streams must be at least 1");
    if (o.growth_step == 0) o.growth_step = granule;
    if (o.record_interval == 0) o.record_interval = 1;
    o.record_interval = std::min<std::size_t>(o.record_interval, UINT32_MAX); // a shard counts it in 32 bits
    o.growth_step = align_up(o.growth_step, granule);
    return o;
}

/// As above, and a device_capacity left unknown is taken from `upstream` when it tells its
/// device's size (device_capacity(), as host::simulated_device_memory does), so a capacity is
/// said once, where the memory is made.
template <class Upstream>
[[nodiscard]] pool_options validated(pool_options o, const Upstream& upstream) {
    if constexpr (requires {
                      { upstream.device_capacity() } -> std::convertible_to<std::size_t>;
                  }) {
        if (o.device_capacity == 0) o.device_capacity = upstream.device_capacity();
    }
    return validated(std::move(o));
}

/// The headroom `configured` (pool_options::device_headroom) leaves on a device of `total` bytes:
/// as configured, or for automatic_headroom an eighth of the device, at most 1 GiB.
[[nodiscard]] constexpr std::size_t headroom_on(std::size_t configured, std::size_t total) noexcept {
    if (configured != automatic_headroom) return configured;
    return std::min(std::size_t{1} << 30, total / 8);
}

/// The growth and limit rules of pool_options, apart from the memory they govern. A plain value;
/// every function is pure and O(1).
class growth_rule {
public:
    /// From options already validated (growth_step a non-zero multiple of the granule).
    explicit growth_rule(const pool_options& o) noexcept
        : step_(o.growth_step), divisor_(o.growth_divisor), maximum_(o.maximum_size), headroom_(o.device_headroom),
          capacity_(o.device_capacity) {}

    /// The chunk to try first for a block of `size` bytes when the pool holds `reserved` bytes of
    /// chunks of the block's kind: preferred = max(growth_step, reserved / growth_divisor), the
    /// latter rounded down to whole 2 MiB pages once above 2 MiB (the GPU allocates whole pages: a
    /// page begun is a page taken). A large block gets a whole number of blocks of its size,
    /// max(1, preferred / size) of them, rounded up to 2 MiB: a chunk of a size that does not
    /// divide by the request leaves a tail too small for the next request of that size, and a
    /// model's large requests come back at the same few sizes. (The pool falls back to exactly
    /// `size` when this is refused.)
    [[nodiscard]] std::size_t preferred_chunk(std::size_t size, std::size_t reserved) const noexcept {
        std::size_t preferred = step_;
        if (divisor_ != 0) {
            const std::size_t share = reserved / divisor_;
            preferred = std::max(preferred, share >= chunk_rounding ? share - share % chunk_rounding : align_up(share, granule));
        }
        if (size <= small_threshold) return size > preferred ? align_up(size, chunk_rounding) : preferred;
        const std::size_t blocks = std::max<std::size_t>(1, preferred / size);
        return align_up(blocks * size, chunk_rounding);
    }

    /// Whether a pool holding `reserved` bytes may take `n` more: within maximum_size, and within
    /// the device budget: `device_headroom` bytes stay free on the device, as `device` reports it
    /// (memory taken by others counts), or else as device_capacity minus what the pool holds.
    [[nodiscard]] bool allows(std::size_t n, std::size_t reserved, const std::optional<device_memory>& device) const noexcept {
        return allows(n, reserved, device, maximum_);
    }
    /// The same with `maximum` in place of maximum_size (a limit changed while the pool runs).
    [[nodiscard]] bool allows(std::size_t n, std::size_t reserved, const std::optional<device_memory>& device,
                              std::size_t maximum) const noexcept {
        if (n > maximum || reserved > maximum - n) return false;
        if (device) {
            const std::size_t headroom = headroom_on(headroom_, device->total);
            return device->free >= n && device->free - n >= headroom;
        }
        if (capacity_ != 0) {
            const std::size_t budget = capacity_budget();
            return reserved <= budget && n <= budget - reserved;
        }
        return true;
    }

    /// Requests larger than this fail at once: no amount of reclaiming could serve them.
    [[nodiscard]] std::size_t request_limit() const noexcept { return request_limit(maximum_); }
    /// The same with `maximum` in place of maximum_size.
    [[nodiscard]] std::size_t request_limit(std::size_t maximum) const noexcept {
        std::size_t limit = std::min(maximum, SIZE_MAX / 2);
        if (capacity_ != 0) limit = std::min(limit, capacity_budget());
        return limit;
    }

    /// The limits as out_of_memory says them, for a pool holding `reserved` bytes that could not
    /// serve `request` bytes: the device budget and its parts ("device budget 1.75 GiB =
    /// capacity 2 GiB - headroom 256 MiB (device_headroom), the pool holds ..."), and
    /// maximum_size (`maximum`: the pool's limit now) when set; "" when neither applies. `device` as
    /// for allows().
    [[nodiscard]] std::string describe_limits(std::size_t request, std::size_t reserved,
                                              const std::optional<device_memory>& device, std::size_t maximum) const {
        using custody::detail::bytes_text;
        std::string d;
        if (device) {
            const std::size_t headroom = headroom_on(headroom_, device->total);
            const std::size_t budget = device->free > headroom ? device->free - headroom : 0;
            d = "device budget " + bytes_text(budget) + " = free on the device " + bytes_text(device->free) +
                " (of " + bytes_text(device->total) + ") - headroom " + bytes_text(headroom) + headroom_origin() +
                (request > budget ? ": the request does not fit in it" : "");
        } else if (capacity_ != 0) {
            const std::size_t budget = capacity_budget();
            d = "device budget " + bytes_text(budget) + " = capacity " + bytes_text(capacity_) + " - headroom " +
                bytes_text(headroom_on(headroom_, capacity_)) + headroom_origin() + ", the pool holds " +
                bytes_text(reserved) +
                (reserved > budget || request > budget - reserved ? ": the request does not fit in it" : "");
        }
        if (maximum != SIZE_MAX) {
            d += (d.empty() ? "" : "; ") + std::string("maximum_size ") + bytes_text(maximum) + ", the pool holds " +
                 bytes_text(reserved);
        }
        return d;
    }

private:
    /// capacity - headroom, the bytes the pool may hold on a device of known capacity.
    [[nodiscard]] std::size_t capacity_budget() const noexcept {
        const std::size_t headroom = headroom_on(headroom_, capacity_);
        return capacity_ > headroom ? capacity_ - headroom : 0;
    }
    [[nodiscard]] const char* headroom_origin() const noexcept {
        return headroom_ == automatic_headroom ? " (device_headroom's default: an eighth of the device, at most 1 GiB)"
                                               : " (pool_options::device_headroom)";
    }

    std::size_t step_;
    std::size_t divisor_;
    std::size_t maximum_;
    std::size_t headroom_;
    std::size_t capacity_;
};

/// `n` bytes at `alignment` from `upstream`, taken on `stream` (the caller's own, made on `device` at
/// the first call: it runs nothing else) and waited for, so that any stream may use them at once;
/// nullptr when the upstream has none. Throws what making or synchronizing the stream throws, the
/// memory given back first.
template <class Upstream>
[[nodiscard]] void* take_waited(Upstream& upstream,
                                std::optional<typename Upstream::stream_type::platform_type::stream>& stream, int device,
                                std::size_t n, std::size_t alignment) {
    using platform_type = typename Upstream::stream_type::platform_type;
    if (!stream) stream.emplace(device >= 0 ? device : platform_type::current_device());
    const typename Upstream::stream_type on = stream->view();
    void* p = custody::try_allocate(upstream, on, n, alignment);
    if (p == nullptr) return nullptr;
    try {
        platform_type::synchronize(on);
    } catch (...) {
        upstream.deallocate(on, p, n, alignment);
        throw;
    }
    return p;
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

/// The growth rule applied to a pool's upstream and device: whether the pool may take more now
/// (the device's memory queried through options.memory_info when set), what the upstream retains
/// of what it was given back, and the upstream's own trim.
/// Thread safety: as the upstream's retained_bytes and trim (the pool calls them under its store's
/// lock). Ownership: refers to the upstream, which outlives it.
template <stream_ordered_resource Upstream>
class device_budget {
public:
    device_budget(Upstream& upstream, const pool_options& options, int device)
        : upstream_(upstream), rule_(options), memory_info_(options.memory_info), device_(device),
          maximum_(options.maximum_size) {}

    [[nodiscard]] const growth_rule& rule() const noexcept { return rule_; }
    [[nodiscard]] int device() const noexcept { return device_; }

    /// Whether a pool holding `reserved` bytes may take `n` more now. What the upstream retains
    /// counts as free: the pool's next memory comes from it first.
    [[nodiscard]] bool allows(std::size_t n, std::size_t reserved) const {
        return rule_.allows(n, reserved, device_memory_now(), maximum_.load(std::memory_order_relaxed));
    }
    /// The limits that stopped a request of `request` bytes of a pool holding `reserved`, for
    /// out_of_memory (growth_rule::describe_limits).
    [[nodiscard]] std::string describe_limits(std::size_t request, std::size_t reserved) const {
        return rule_.describe_limits(request, reserved, device_memory_now(), maximum_.load(std::memory_order_relaxed));
    }
    /// From now on the pool may hold at most `bytes` (in place of options.maximum_size).
    void set_maximum(std::size_t bytes) noexcept { maximum_.store(bytes, std::memory_order_relaxed); }

    /// Bytes the upstream keeps for itself of what was given back to it (a driver pool's reserve
    /// beyond its live blocks), when it can tell (`Upstream::retained_bytes()`); else 0.
    [[nodiscard]] std::size_t upstream_retained() const noexcept {
        if constexpr (requires(const Upstream& u) { u.retained_bytes(); }) {
            return upstream_.retained_bytes();
        } else {
            return 0;
        }
    }

    /// The upstream's trim(), when it has one; a failure is reported (what was given back stays so).
    void trim_upstream() noexcept {
        if constexpr (requires(Upstream& u) { u.trim(); }) {
            try {
                upstream_.trim();
            } catch (...) {
                report_failure("stream_ordered_pool: the upstream could not give back the memory it retains");
            }
        }
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

    Upstream& upstream_;
    growth_rule rule_;
    memory_info_function memory_info_;
    int device_;
    std::atomic<std::size_t> maximum_; ///< options.maximum_size until set_maximum
};

} // namespace custody::pool::detail
