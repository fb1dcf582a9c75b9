/// @file
/// The pool's rounding rules: the granule every block is a multiple of, and the size classes that
/// small and medium requests are rounded to.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace custody::pool::detail {

/// Every block is a multiple of 256 bytes and starts 256-aligned: what cudaMalloc guarantees, so a
/// pool block may stand in for a cudaMalloc block anywhere.
inline constexpr std::size_t granule = 256;

/// Requests up to this many bytes (1 MiB) are served from per-stream size-class lists in O(1);
/// larger ones by best fit with splitting and coalescing. 1 MiB keeps per-token tensors of
/// inference (activations of a decode step, small workspaces, KV pages) on the O(1) path, while
/// prefill activations and weights, which are few and large, get exact fits.
inline constexpr std::size_t small_threshold = std::size_t{1} << 20;

/// Classes 0..15 are 256, 512, ..., 4096 bytes (one granule apart). Above 4 KiB each doubling
/// (2^k, 2^(k+1)] is split into 16 classes 2^(k-4) apart, so rounding wastes at most 1/16 (6.25%)
/// of a request and on average about 3%: little enough for the pool to stay within 5% of the live
/// bytes, few enough classes (144) that a stream's lists fit in a few kilobytes.
inline constexpr std::size_t class_count = 16 + (20 - 12) * 16;

/// The class of a request of `bytes` (1 <= bytes <= small_threshold), computed.
[[nodiscard]] constexpr std::size_t compute_class_of(std::size_t bytes) noexcept {
    if (bytes <= 4096) return bytes == 0 ? 0 : (bytes - 1) / granule;
    const std::size_t k = static_cast<std::size_t>(std::bit_width(bytes - 1)) - 1; // 2^k < bytes <= 2^(k+1)
    // ceil((bytes - 2^k) / 2^(k-4)) - 1, in 0..15, by a shift (the classes are 2^(k-4) apart)
    const std::size_t sub = (bytes - 1 - (std::size_t{1} << k)) >> (k - 4);
    return 16 + (k - 12) * 16 + sub;
}

/// The class of every request by its granule: classes above 4 KiB are at least a granule apart, so
/// all the requests of one granule, (g * 256, (g + 1) * 256], share a class. 4 KiB of bytes.
inline constexpr auto class_by_granule = [] {
    std::array<std::uint8_t, small_threshold / granule> classes{};
    for (std::size_t g = 0; g < classes.size(); ++g) classes[g] = static_cast<std::uint8_t>(compute_class_of(g * granule + 1));
    return classes;
}();
static_assert(class_count <= 256, "a class fits in a byte");

/// The class of a request of `bytes` (1 <= bytes <= small_threshold): one load, no branch.
[[nodiscard, gnu::always_inline]] constexpr std::size_t class_of(std::size_t bytes) noexcept {
    return class_by_granule[(bytes - 1) / granule];
}

/// The size of every block of class `c` (c < class_count), computed.
[[nodiscard]] constexpr std::size_t compute_class_size(std::size_t c) noexcept {
    if (c < 16) return (c + 1) * granule;
    const std::size_t j = c - 16;
    const std::size_t k = 12 + j / 16;
    return (std::size_t{1} << k) + (j % 16 + 1) * (std::size_t{1} << (k - 4));
}

/// Every class's size, looked up on the pool's fast path (one load from a table of 1152 bytes).
inline constexpr auto class_sizes = [] {
    std::array<std::size_t, class_count> sizes{};
    for (std::size_t c = 0; c < class_count; ++c) sizes[c] = compute_class_size(c);
    return sizes;
}();

/// The size of every block of class `c` (c < class_count).
[[nodiscard, gnu::always_inline]] constexpr std::size_t class_size(std::size_t c) noexcept { return class_sizes[c]; }

/// The size of the block that serves a request of `bytes` (bytes >= 1, not near SIZE_MAX): its
/// class size when small, else `bytes` rounded up to the granule.
[[nodiscard]] constexpr std::size_t block_size(std::size_t bytes) noexcept {
    if (bytes <= small_threshold) return class_size(class_of(bytes));
    return (bytes + granule - 1) & ~(granule - 1);
}

static_assert(class_size(class_count - 1) == small_threshold);
static_assert(class_of(small_threshold) == class_count - 1);
static_assert(class_of(4097) == 16 && class_size(16) == 4096 + 256);
static_assert(class_of(1) == 0 && class_of(256) == 0 && class_of(257) == 1 && class_of(4096) == 15);
static_assert(class_of(small_threshold - 1) == class_count - 1 && class_of(3 * 4096 + 1) == compute_class_of(3 * 4096 + 1));

} // namespace custody::pool::detail
