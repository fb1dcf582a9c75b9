/// @file
/// `block_kind`: which chunks a block of the pool is cut from, and `per_kind`, an array indexed by it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace custody::pool::detail {

/// Size-class blocks (small) and larger blocks (large) are cut from chunks of their own kind, so
/// that long-lived small blocks never pin holes into the ranges that large requests need.
enum class block_kind : std::uint8_t {
    small = 0, ///< size-class blocks: requests up to small_threshold
    large = 1, ///< blocks above small_threshold
};

/// The kind that is not `k`: where a request looks when its own kind may not grow.
[[nodiscard]] constexpr block_kind other(block_kind k) noexcept {
    return k == block_kind::small ? block_kind::large : block_kind::small;
}

/// One `T` per block kind, indexed by the kind. A plain aggregate: `per_kind<T> x{};`.
template <class T>
struct per_kind {
    std::array<T, 2> items{};

    [[nodiscard]] constexpr T& operator[](block_kind k) noexcept { return items[static_cast<std::size_t>(k)]; }
    [[nodiscard]] constexpr const T& operator[](block_kind k) const noexcept {
        return items[static_cast<std::size_t>(k)];
    }
    [[nodiscard]] constexpr auto begin() noexcept { return items.begin(); }
    [[nodiscard]] constexpr auto end() noexcept { return items.end(); }
    [[nodiscard]] constexpr auto begin() const noexcept { return items.begin(); }
    [[nodiscard]] constexpr auto end() const noexcept { return items.end(); }
};

/// Every kind, for loops over both.
inline constexpr std::array<block_kind, 2> block_kinds{block_kind::small, block_kind::large};

} // namespace custody::pool::detail
