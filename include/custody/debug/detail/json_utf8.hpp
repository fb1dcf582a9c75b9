/// @file
/// UTF-8 for the debug layer's JSON: stepping through text, checking it, repairing it, and quoting
/// a bounded excerpt of it in an error message. An internal of the debug layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace custody::debug::detail::json {

/// One step through UTF-8 text: the character at the start of `s` is valid and `length` bytes
/// long, or invalid and `length` is its maximal subpart (the longest start of a valid sequence,
/// at least one byte), the unit that U+FFFD replaces (Unicode 15, section 3.9).
struct utf8_step {
    std::size_t length;
    bool valid;
};

/// The UTF-8 character at s[i] (i < s.size()), as RFC 3629 allows them: no overlong forms, no
/// surrogates, nothing above U+10FFFF.
[[nodiscard]] constexpr utf8_step next_utf8(std::string_view s, std::size_t i) noexcept {
    const auto lead = static_cast<unsigned char>(s[i]);
    if (lead < 0x80) return {1, true};
    std::size_t follow = 0;
    unsigned lo = 0x80; // the range of the byte after the lead; later ones are 0x80..0xBF
    unsigned hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
        follow = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        follow = 2;
        if (lead == 0xE0) lo = 0xA0; // overlong below U+0800
        if (lead == 0xED) hi = 0x9F; // surrogates U+D800..U+DFFF
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        follow = 3;
        if (lead == 0xF0) lo = 0x90; // overlong below U+10000
        if (lead == 0xF4) hi = 0x8F; // above U+10FFFF
    } else {
        return {1, false};
    }
    for (std::size_t n = 1; n <= follow; ++n) {
        if (i + n >= s.size()) return {n, false};
        const auto b = static_cast<unsigned char>(s[i + n]);
        if (b < lo || b > hi) return {n, false};
        lo = 0x80;
        hi = 0xBF;
    }
    return {follow + 1, true};
}

/// Whether `s` is valid UTF-8 (see next_utf8).
[[nodiscard]] constexpr bool is_valid_utf8(std::string_view s) noexcept {
    for (std::size_t i = 0; i < s.size();) {
        const utf8_step c = next_utf8(s, i);
        if (!c.valid) return false;
        i += c.length;
    }
    return true;
}

/// U+FFFD REPLACEMENT CHARACTER in UTF-8.
inline constexpr std::string_view replacement_character = "\xEF\xBF\xBD";

/// `s` with each invalid UTF-8 sequence (each maximal subpart) replaced by U+FFFD, as Python's
/// `bytes.decode("utf-8", "replace")` and the WHATWG decoder do. Valid text comes back unchanged.
[[nodiscard]] inline std::string to_valid_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size();) {
        const utf8_step c = next_utf8(s, i);
        if (c.valid) out.append(s.substr(i, c.length));
        else out.append(replacement_character);
        i += c.length;
    }
    return out;
}

/// `text` for an error message: at most `limit` bytes of it, then how long it was.
[[nodiscard]] inline std::string excerpt(std::string_view text, std::size_t limit = 40) {
    if (text.size() <= limit) return std::string(text);
    return to_valid_utf8(text.substr(0, limit)) + "... (" + std::to_string(text.size()) + " bytes)";
}

} // namespace custody::debug::detail::json
