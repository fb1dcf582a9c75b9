/// Small text formatting shared by custody's messages and reports: addresses and handles in hex.
#pragma once

#include <cstdint>
#include <string>

namespace custody::detail {

/// `v` as "0x" followed by lower-case hex digits without leading zeros ("0x0" for zero).
[[nodiscard]] inline std::string to_hex(std::uintptr_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    char buffer[2 + 2 * sizeof v];
    char* end = buffer + sizeof buffer;
    char* p = end;
    do {
        *--p = digits[v & 0xF];
        v >>= 4;
    } while (v != 0);
    *--p = 'x';
    *--p = '0';
    return std::string(p, end);
}

/// A pointer's address as to_hex does it.
[[nodiscard]] inline std::string to_hex(const void* p) { return to_hex(reinterpret_cast<std::uintptr_t>(p)); }

} // namespace custody::detail
