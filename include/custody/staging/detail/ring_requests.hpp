/// @file
/// The checks a staging ring makes on what it is asked for: its options, the size of a request,
/// the chunk of a chunked copy, and a destination's length. Each throws before anything changes.
#pragma once

#include <custody/core/align.hpp>
#include <custody/staging/ring_options.hpp>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace custody::staging::detail {

/// The ring's capacity for `o`: o.capacity rounded up to `alignment`. Throws std::invalid_argument
/// for zero, std::length_error when rounding up overflows.
inline std::size_t checked_capacity(const ring_options& o, std::size_t alignment) {
    if (o.capacity == 0) throw std::invalid_argument("custody: staging ring: zero capacity");
    if (align_up_overflows(o.capacity, alignment)) throw std::length_error("custody: staging ring: capacity overflows");
    return align_up(o.capacity, alignment);
}

/// o.max_regions; throws std::invalid_argument for zero.
inline std::size_t checked_regions(const ring_options& o) {
    if (o.max_regions == 0) throw std::invalid_argument("custody: staging ring: zero regions");
    return o.max_regions;
}

/// Bytes of `count` elements of T in a ring of `capacity` bytes aligned to `Alignment`.
/// Throws std::invalid_argument for count == 0, std::length_error above the capacity.
template <class T, std::size_t Alignment>
[[nodiscard]] std::size_t request_bytes(std::size_t count, std::size_t capacity) {
    static_assert(std::is_trivially_copyable_v<T>, "the ring copies bytes");
    static_assert(alignof(T) <= Alignment, "element alignment above the ring's");
    if (count == 0) throw std::invalid_argument("custody: staging ring: zero elements requested");
    if (count > capacity / sizeof(T)) {
        throw std::length_error("custody: staging ring: " + std::to_string(count) + " elements of " +
                                std::to_string(sizeof(T)) + " bytes exceed the ring's " + std::to_string(capacity) +
                                " bytes");
    }
    return count * sizeof(T);
}

/// Elements of T per chunk of `chunk_bytes` (at least one). Throws std::length_error when one
/// element is larger than the ring's `capacity`.
template <class T>
[[nodiscard]] std::size_t elements_per_chunk(std::size_t capacity, std::size_t chunk_bytes) {
    if (sizeof(T) > capacity) throw std::length_error("custody: staging ring: element larger than the ring");
    return std::max<std::size_t>(chunk_bytes / sizeof(T), 1);
}

/// Throws std::invalid_argument when a destination of `have` elements cannot hold `need`.
inline void check_destination(std::size_t have, std::size_t need) {
    if (have < need) {
        throw std::invalid_argument("custody: staging ring: destination of " + std::to_string(have) +
                                    " elements is smaller than the " + std::to_string(need) + " to copy");
    }
}

} // namespace custody::staging::detail
