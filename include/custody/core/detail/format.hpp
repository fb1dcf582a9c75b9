/// Small text formatting shared by custody's messages and reports: addresses and handles in hex,
/// byte counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
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

/// A byte count as messages give it: exact, and in binary units once it reaches 1 KiB
/// ("2147483648 B (2 GiB)", "1536 B (1.5 KiB)", "512 B").
[[nodiscard]] inline std::string bytes_text(std::size_t bytes) {
    std::string s = std::to_string(bytes) + " B";
    if (bytes < 1024) return s;
    static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double value = static_cast<double>(bytes) / 1024.0;
    std::size_t unit = 0;
    while (value >= 1024.0 && unit + 1 < std::size(units)) {
        value /= 1024.0;
        ++unit;
    }
    char text[32];
    std::snprintf(text, sizeof text, " (%.3g %s)", value, units[unit]);
    return s + text;
}

} // namespace custody::detail
