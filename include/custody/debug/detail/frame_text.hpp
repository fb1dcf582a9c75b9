/// @file
/// The text of one call-stack frame in custody's reports, written here and read back here (by
/// custody-merge, which symbolizes frames from other machines):
///
///     FILE:LINE in FUNCTION [MODULE+0xOFFSET]        symbolized
///     FUNCTION [MODULE+0xOFFSET]                     a function without line information
///     unsymbolized NAME+0xN [MODULE+0xOFFSET]        not symbolized (NAME: the dynamic symbol,
///     unsymbolized [MODULE+0xOFFSET]                 when the module exports one)
///
/// MODULE is the file the code was loaded from and OFFSET the address within that file (what
/// `addr2line -e MODULE OFFSET` takes), so any frame can be symbolized later from the module.
#pragma once

#include <custody/core/detail/format.hpp>
#include <custody/debug/detail/function_name.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace custody::debug::detail {

/// Where a code address lies: the module's file and the address within it. `symbol` is the
/// nearest exported symbol and `symbol_offset` the distance from it (empty when not looked up).
struct code_location {
    std::string module;           ///< empty: no module holds the address (offset: the address)
    std::uintptr_t offset = 0;
    std::string symbol;           ///< demangled, shortened (see short_function_name)
    std::uintptr_t symbol_offset = 0;
    std::uintptr_t address = 0;   ///< in this process when located here; 0 when read from text
};

/// One source-level frame. One address gives several when calls were inlined into each other:
/// the innermost first, each `inlined` into the next, the last one the function really called.
struct source_frame {
    std::string function; ///< qualified name, parameters left out; empty when unknown
    std::string file;     ///< empty when the module has no line information for the address
    unsigned line = 0;    ///< 0 when unknown
    bool inlined = false;
};

/// The word that marks a frame custody could not symbolize.
inline constexpr std::string_view unsymbolized_mark = "unsymbolized";

inline std::string location_text(const code_location& at) {
    return "[" + (at.module.empty() ? std::string("?") : at.module) + "+" + custody::detail::to_hex(at.offset) + "]";
}

/// "FILE:LINE in FUNCTION [MODULE+0xOFFSET]" (or the shorter forms above when a part is unknown).
[[nodiscard]] inline std::string frame_text(const source_frame& f, const code_location& at) {
    std::string s;
    if (!f.file.empty() && f.line != 0) s = f.file + ":" + std::to_string(f.line) + " in ";
    s += f.function.empty() ? std::string("?") : f.function;
    return s + " " + location_text(at);
}

/// "unsymbolized NAME+0xN [MODULE+0xOFFSET]" (NAME when the location carries a symbol).
[[nodiscard]] inline std::string unsymbolized_text(const code_location& at) {
    std::string s(unsymbolized_mark);
    if (!at.symbol.empty()) s += " " + at.symbol + "+" + custody::detail::to_hex(at.symbol_offset);
    return s + " " + location_text(at);
}

/// True for a frame written by unsymbolized_text.
[[nodiscard]] inline bool is_unsymbolized(std::string_view text) noexcept {
    return text.substr(0, unsymbolized_mark.size()) == unsymbolized_mark &&
           (text.size() == unsymbolized_mark.size() || text[unsymbolized_mark.size()] == ' ');
}

/// The module and offset of a frame's text (its trailing "[MODULE+0xOFFSET]"), or nothing when the
/// text does not end so (text from a report is untrusted: any string gives an answer or nothing).
/// The symbol fields are left empty.
[[nodiscard]] inline std::optional<code_location> frame_location(std::string_view text) {
    if (text.empty() || text.back() != ']') return std::nullopt;
    const auto plus = text.rfind("+0x");
    if (plus == std::string_view::npos) return std::nullopt;
    const std::string_view digits = text.substr(plus + 3, text.size() - 1 - (plus + 3));
    if (digits.empty() || digits.size() > 2 * sizeof(std::uintptr_t)) return std::nullopt;
    std::uintptr_t offset = 0;
    for (const char c : digits) {
        unsigned d = 0;
        if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
        else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
        else return std::nullopt;
        offset = (offset << 4U) | d;
    }
    const auto open = text.rfind('[', plus);
    if (open == std::string_view::npos || (open != 0 && text[open - 1] != ' ')) return std::nullopt;
    code_location at;
    const std::string_view module = text.substr(open + 1, plus - open - 1);
    if (module.empty()) return std::nullopt;
    if (module != "?") at.module = std::string(module);
    at.offset = offset;
    return at;
}

/// The function a frame's text names: FUNCTION of "FILE:LINE in FUNCTION [...]" or
/// "FUNCTION [...]", NAME of "unsymbolized NAME+0xN [...]"; empty when it names none (text from a
/// report is untrusted: any string gives an answer).
[[nodiscard]] inline std::string_view frame_function(std::string_view text) {
    const std::size_t open = text.rfind(" [");
    if (open == std::string_view::npos) return {};
    std::string_view head = text.substr(0, open);
    if (is_unsymbolized(head)) {
        head.remove_prefix(std::min(head.size(), unsymbolized_mark.size() + 1));
        const std::size_t plus = head.rfind("+0x");
        return plus == std::string_view::npos ? std::string_view{} : head.substr(0, plus);
    }
    // "FILE:LINE in ": the first " in " right after ":DIGITS".
    for (std::size_t in = head.find(" in "); in != std::string_view::npos; in = head.find(" in ", in + 1)) {
        std::size_t digits = in;
        while (digits > 0 && head[digits - 1] >= '0' && head[digits - 1] <= '9') --digits;
        if (digits < in && digits > 0 && head[digits - 1] == ':') return head.substr(in + 4);
    }
    return head == "?" ? std::string_view{} : head;
}

/// `text` with the function it names shortened by short_function_name (a frame written before
/// names were shortened, or elsewhere); other text comes back unchanged.
[[nodiscard]] inline std::string with_short_function(std::string text) {
    const std::string_view function = frame_function(text);
    if (function.empty()) return text;
    const std::string shorter = short_function_name(function);
    if (shorter == function) return text;
    const auto at = static_cast<std::size_t>(function.data() - text.data());
    return text.replace(at, function.size(), shorter);
}

} // namespace custody::debug::detail
