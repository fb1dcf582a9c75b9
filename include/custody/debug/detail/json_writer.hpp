/// @file
/// The streaming JSON writer of the debug reports: string literals with escapes and U+FFFD, and
/// compact output with one member per line at the top levels. An internal of the debug layer.
#pragma once

#include <custody/debug/detail/json_utf8.hpp>
#include <custody/debug/detail/json_value.hpp>

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace custody::debug::detail::json {

/// The end of the run of bytes from s[from] that a JSON string holds as they are: printable ASCII
/// but '"' and '\\'.
[[nodiscard]] constexpr std::size_t plain_run_end(std::string_view s, std::size_t from) noexcept {
    while (from < s.size()) {
        const auto b = static_cast<unsigned char>(s[from]);
        if (b < 0x20 || b >= 0x80 || b == '"' || b == '\\') break;
        ++from;
    }
    return from;
}

/// Appends the JSON string literal for `s` to `out`: quotes, escapes, and U+FFFD for each invalid
/// UTF-8 sequence (see to_valid_utf8), so that the output is always valid JSON.
inline void write_string(std::string& out, std::string_view s) {
    out += '"';
    std::size_t i = 0;
    while (i < s.size()) {
        const std::size_t plain = plain_run_end(s, i); // out in one piece
        out.append(s.substr(i, plain - i));
        i = plain;
        if (i == s.size()) break;
        const char c = s[i];
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
            if (static_cast<unsigned char>(c) < 0x20) {
                static constexpr char hex[] = "0123456789abcdef";
                out += "\\u00";
                out += hex[static_cast<unsigned char>(c) >> 4];
                out += hex[static_cast<unsigned char>(c) & 0xF];
            } else {
                const utf8_step u = next_utf8(s, i);
                if (u.valid) out.append(s.substr(i, u.length));
                else out.append(replacement_character);
                i += u.length;
                continue;
            }
        }
        ++i;
    }
    out += '"';
}

/// A streaming writer that emits compact JSON with one member per line at the top levels, and
/// keeps commas right. Usage: w.begin_object(); w.field("a", 1); w.key("b"); w.begin_array(); ...
/// Strings go through write_string (invalid UTF-8 becomes U+FFFD). Keys are the caller's to keep
/// distinct within an object. Not thread-safe. Preconditions (Expects-style, not checked at run
/// time): keys only inside objects, balanced begin/end.
class writer {
public:
    void begin_object() { open('{'); }
    void end_object() { close('}'); }
    void begin_array() { open('['); }
    void end_array() { close(']'); }
    void key(std::string_view k) {
        separate();
        write_string(out_, k);
        out_ += ':';
        after_key_ = true;
    }
    void string(std::string_view s) {
        separate();
        write_string(out_, s);
    }
    void number(std::int64_t v) { integer(v); }
    void number(std::uint64_t v) { integer(v); }
    void number(int v) { integer(v); }
    /// A finite double as its shortest round-trip text; NaN and infinities as null.
    void number(double v) {
        separate();
        if (!std::isfinite(v)) {
            out_ += "null";
            return;
        }
        char buf[32];
        out_.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
    }
    void boolean(bool b) {
        separate();
        out_ += b ? "true" : "false";
    }
    void null() {
        separate();
        out_ += "null";
    }
    /// A member: key(k), then the value as string(), number() or boolean() would write it.
    void field(std::string_view k, std::string_view v) {
        key(k);
        string(v);
    }
    void field(std::string_view k, const char* v) { field(k, std::string_view(v)); } // not the bool one
    void field(std::string_view k, std::int64_t v) {
        key(k);
        number(v);
    }
    void field(std::string_view k, std::uint64_t v) {
        key(k);
        number(v);
    }
    void field(std::string_view k, int v) {
        key(k);
        number(v);
    }
    void field(std::string_view k, double v) {
        key(k);
        number(v);
    }
    void field(std::string_view k, bool v) {
        key(k);
        boolean(v);
    }
    /// Writes a value back; what the reader parsed writes back to the same numbers and strings.
    void write(const value& v) {
        std::visit(
            [this](const auto& x) {
                using T = std::decay_t<decltype(x)>;
                if constexpr (std::is_same_v<T, std::nullptr_t>) {
                    null();
                } else if constexpr (std::is_same_v<T, bool>) {
                    boolean(x);
                } else if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t>) {
                    integer(x);
                } else if constexpr (std::is_same_v<T, real>) {
                    separate();
                    out_ += x.text;
                } else if constexpr (std::is_same_v<T, std::string>) {
                    string(x);
                } else if constexpr (std::is_same_v<T, array>) {
                    begin_array();
                    for (const auto& e : x) write(e);
                    end_array();
                } else {
                    begin_object();
                    for (const auto& [k, e] : x) {
                        key(k);
                        write(e);
                    }
                    end_object();
                }
            },
            v.get());
    }

    [[nodiscard]] const std::string& str() const noexcept { return out_; }
    [[nodiscard]] std::string take() noexcept { return std::move(out_); }

private:
    template <std::integral T>
    void integer(T v) {
        separate();
        char buf[24];
        out_.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
    }
    void open(char c) {
        separate();
        out_ += c;
        first_.push_back(true);
    }
    void close(char c) {
        const bool empty = first_.back();
        first_.pop_back();
        if (!empty && first_.size() < 2) {
            out_ += '\n';
            out_.append(first_.size() * 2, ' ');
        }
        out_ += c;
    }
    void separate() {
        if (after_key_) {
            after_key_ = false;
            return;
        }
        if (first_.empty()) return;
        if (!first_.back()) out_ += ',';
        first_.back() = false;
        if (first_.size() <= 2) {
            out_ += '\n';
            out_.append(first_.size() * 2, ' ');
        }
    }

    std::string out_;
    std::vector<bool> first_; // per open container: no member written yet
    bool after_key_ = false;
};

} // namespace custody::debug::detail::json
