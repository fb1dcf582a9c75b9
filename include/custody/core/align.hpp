/// @file
/// Alignment vocabulary: the default alignment, power-of-two checks and rounding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace custody {

/// The alignment every resource gives when none is asked for: 256 bytes, what cudaMalloc
/// guarantees and what vectorized kernels and TMA descriptors expect.
inline constexpr std::size_t default_alignment = 256;

/// The largest alignment a leaf resource accepts unless its documentation says otherwise (a page).
inline constexpr std::size_t max_alignment = 4096;

[[nodiscard]] constexpr bool is_pow2(std::size_t value) noexcept {
    return value != 0 && (value & (value - 1)) == 0;
}

/// Rounds `value` up to a multiple of `alignment` (a power of two). Precondition: no overflow.
[[nodiscard]] constexpr std::size_t align_up(std::size_t value, std::size_t alignment) noexcept {
    return (value + alignment - 1) & ~(alignment - 1);
}

[[nodiscard]] constexpr std::size_t align_down(std::size_t value, std::size_t alignment) noexcept {
    return value & ~(alignment - 1);
}

[[nodiscard]] inline bool is_aligned(const void* ptr, std::size_t alignment) noexcept {
    return (reinterpret_cast<std::uintptr_t>(ptr) & (alignment - 1)) == 0;
}

/// Throws std::invalid_argument unless `alignment` is a power of two no larger than `maximum`.
/// Every resource calls this before touching any state, so a bad alignment changes nothing.
inline void check_alignment(std::size_t alignment, std::size_t maximum = max_alignment) {
    if (!is_pow2(alignment)) {
        throw std::invalid_argument("custody: alignment " + std::to_string(alignment) +
                                    " is not a power of two");
    }
    if (alignment > maximum) {
        throw std::invalid_argument("custody: alignment " + std::to_string(alignment) +
                                    " exceeds this resource's maximum of " + std::to_string(maximum));
    }
}

/// True when `bytes` rounded up to `alignment` would overflow std::size_t.
[[nodiscard]] constexpr bool align_up_overflows(std::size_t bytes, std::size_t alignment) noexcept {
    return bytes > SIZE_MAX - (alignment - 1);
}

} // namespace custody
