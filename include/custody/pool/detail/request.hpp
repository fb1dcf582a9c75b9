/// @file
/// `request`: a call to the pool classified once (rounded size, size class, block kind), so that the
/// fast path, the slow path and the free path read the decision instead of deriving it again.
#pragma once

#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/size_classes.hpp>

#include <cstddef>
#include <cstdint>

namespace custody::pool::detail {

/// One allocation or deallocation, classified.
///
/// Invariants: 1 <= bytes <= size; size % granule == 0; alignment is a power of two;
///   kind == small <=> bytes <= small_threshold, and then size == class_size(size_class);
///   kind == large => size == bytes rounded up to the granule, size_class == 0
struct request {
    std::size_t bytes = 0;        ///< as the caller asked
    std::size_t size = 0;         ///< the block's size
    std::size_t alignment = 0;    ///< as the caller asked
    std::uint32_t size_class = 0; ///< meaningful for small requests only
    block_kind kind = block_kind::small;

    [[nodiscard]] constexpr bool small() const noexcept { return kind == block_kind::small; }
};

/// Classifies a call for `bytes` (bytes <= SIZE_MAX / 2) at `alignment`. O(1). 0 bytes is the
/// smallest class (the checked mode classifies before it sees that nothing is asked for).
[[nodiscard]] constexpr request classify(std::size_t bytes, std::size_t alignment) noexcept {
    if (bytes <= small_threshold) {
        const std::size_t c = bytes == 0 ? 0 : class_of(bytes);
        return {bytes, class_size(c), alignment, static_cast<std::uint32_t>(c), block_kind::small};
    }
    return {bytes, (bytes + granule - 1) & ~(granule - 1), alignment, 0, block_kind::large};
}

/// Whether every block meets `alignment`: a power of two up to the granule (an alignment that is
/// not a power of two, or is larger, goes the careful way, which validates it). Branch-free.
[[nodiscard, gnu::always_inline]] constexpr bool fits_granule(std::size_t alignment) noexcept {
    return ((alignment - 1) / granule | (alignment & (alignment - 1))) == 0;
}
static_assert(fits_granule(1) && fits_granule(granule) && !fits_granule(0) && !fits_granule(2 * granule) &&
              !fits_granule(3));

static_assert(classify(0, 256).size == granule && classify(1, 256).size == granule && classify(1, 256).small() && classify(1, 256).alignment == 256);
static_assert(classify(small_threshold + 1, 256).size == small_threshold + granule &&
              !classify(small_threshold + 1, 256).small());

} // namespace custody::pool::detail
