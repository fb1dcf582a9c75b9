/// @file
/// `misuse` and `misuse_kind`: what a checked stream_ordered_pool found wrong in a deallocate
/// (a double free, an interior or foreign pointer, a wrong size), as a typed report.
#pragma once

#include <custody/core/detail/format.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace custody::pool {

/// The kinds of misuse a checked pool finds in a deallocate, each before it changes anything.
enum class misuse_kind {
    double_free,      ///< a pointer into the pool's free memory: given back already, or never handed out
    interior_pointer, ///< a pointer inside a live block, not its start
    wrong_size,       ///< a live block's start with other bytes or another alignment than its allocation's
    foreign_pointer,  ///< a pointer into none of the pool's chunks
};

[[nodiscard]] constexpr const char* to_string(misuse_kind k) noexcept {
    switch (k) {
    case misuse_kind::double_free: return "double free";
    case misuse_kind::interior_pointer: return "interior pointer";
    case misuse_kind::wrong_size: return "wrong size";
    case misuse_kind::foreign_pointer: return "foreign pointer";
    }
    return "?";
}

/// One deallocate a checked pool refused. The pool is as it was before the call.
struct misuse {
    misuse_kind kind = misuse_kind::foreign_pointer;
    std::uintptr_t address = 0;   ///< the pointer given back
    std::size_t bytes = 0;        ///< as the deallocate said
    std::size_t alignment = 0;    ///< as the deallocate said
    std::uintptr_t stream_key = 0; ///< Platform::stream_key of the deallocate's stream
    /// wrong_size, interior_pointer: the live block concerned (its start, and its allocation's
    /// bytes and alignment); 0 otherwise.
    std::uintptr_t block = 0;
    std::size_t block_bytes = 0;
    std::size_t block_alignment = 0;

    /// One line: "stream_ordered_pool: wrong size: 0x... given back as 100 bytes (alignment 256) on
    /// stream 0x...; allocated as 200 bytes (alignment 256) at 0x...; the pool is unchanged".
    [[nodiscard]] std::string describe() const {
        std::string d = std::string("stream_ordered_pool: ") + to_string(kind) + ": " + custody::detail::to_hex(address) +
                        " given back as " + std::to_string(bytes) + " bytes (alignment " + std::to_string(alignment) +
                        ") on stream " + custody::detail::to_hex(stream_key);
        if (block != 0) {
            d += "; allocated as " + std::to_string(block_bytes) + " bytes (alignment " + std::to_string(block_alignment) +
                 ") at " + custody::detail::to_hex(block);
        }
        return d + "; the pool is unchanged";
    }
};

/// Receives each misuse a checked pool finds. Must not throw. nullptr (the default): the
/// misuse's describe() goes to custody::report_failure.
using misuse_callback = void (*)(const misuse&) noexcept;

} // namespace custody::pool
