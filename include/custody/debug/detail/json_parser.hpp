/// @file
/// The strict JSON reader of the debug layer (RFC 8259, valid UTF-8, no duplicate names, bounded
/// nesting) and the parse_error it throws. An internal of the debug layer.
#pragma once

#include <custody/debug/detail/json_utf8.hpp>
#include <custody/debug/detail/json_value.hpp>
#include <custody/debug/detail/json_writer.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace custody::debug::detail::json {

/// A document that is not valid JSON. `truncated()` when the text ended inside a value (a report
/// cut short by a crash or a full disk), as opposed to a wrong character at `offset()`.
class parse_error : public std::runtime_error {
public:
    parse_error(const std::string& what, std::size_t offset, bool truncated)
        : std::runtime_error(what), offset_(offset), truncated_(truncated) {}
    [[nodiscard]] std::size_t offset() const noexcept { return offset_; }
    [[nodiscard]] bool truncated() const noexcept { return truncated_; }

private:
    std::size_t offset_;
    bool truncated_;
};

/// The reader behind parse(). Strict: RFC 8259's grammar, valid UTF-8, no lone surrogate in a
/// \u escape, no two members of one name in an object, at most 256 levels of nesting.
/// Complexity: O(n) in the text for objects whose names come in order (as custody writes them),
/// O(n log n) otherwise (the duplicate check sorts each object's names).
class parser {
public:
    explicit parser(std::string_view text) : text_(text) {}

    value document() {
        skip_space();
        value v = parse_value(0);
        skip_space();
        if (pos_ != text_.size()) fail("unexpected text after the document");
        return v;
    }

private:
    static constexpr int max_depth = 256;

    [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }
    [[noreturn]] void fail_at(std::size_t at, const std::string& what) const {
        const bool truncated = at >= text_.size();
        throw parse_error("json: " + (truncated ? std::string("document ends early (truncated)") : what) +
                              " at offset " + std::to_string(at),
                          at, truncated);
    }
    void skip_space() noexcept {
        while (pos_ < text_.size() &&
               (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' || text_[pos_] == '\t'))
            ++pos_;
    }
    char peek() const {
        if (pos_ >= text_.size()) fail("");
        return text_[pos_];
    }
    void expect(char c) {
        if (peek() != c) fail(std::string("expected '") + c + "'");
        ++pos_;
    }
    void literal(std::string_view word) {
        for (const char c : word) {
            if (peek() != c) fail("invalid literal");
            ++pos_;
        }
    }

    value parse_value(int depth) {
        if (depth > max_depth) fail("nesting too deep");
        switch (peek()) {
        case '{': return parse_object(depth);
        case '[': return parse_array(depth);
        case '"': return value(parse_string());
        case 't': literal("true"); return value(true);
        case 'f': literal("false"); return value(false);
        case 'n': literal("null"); return value(nullptr);
        default: return parse_number();
        }
    }

    value parse_object(int depth) {
        expect('{');
        object o;
        std::vector<std::size_t> offsets; // offsets[i]: where the name of o[i] starts
        skip_space();
        if (peek() == '}') {
            ++pos_;
            return value(std::move(o));
        }
        for (;;) {
            skip_space();
            if (peek() != '"') fail("expected a member name");
            offsets.push_back(pos_);
            std::string k = parse_string();
            skip_space();
            expect(':');
            skip_space();
            o.emplace_back(std::move(k), parse_value(depth + 1));
            skip_space();
            if (peek() == ',') {
                ++pos_;
                continue;
            }
            expect('}');
            check_distinct(o, offsets);
            return value(std::move(o));
        }
    }

    /// Fails at the later of two members with one name.
    void check_distinct(const object& o, const std::vector<std::size_t>& offsets) const {
        if (o.size() <= 8) {
            for (std::size_t i = 1; i < o.size(); ++i)
                for (std::size_t j = 0; j < i; ++j)
                    if (o[i].first == o[j].first) duplicate(o[i].first, offsets[i]);
            return;
        }
        bool increasing = true; // names in order, as custody writes them: nothing to sort
        for (std::size_t i = 1; i < o.size() && increasing; ++i) increasing = o[i - 1].first < o[i].first;
        if (increasing) return;
        std::vector<std::size_t> order(o.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
            return o[a].first != o[b].first ? o[a].first < o[b].first : a < b;
        });
        for (std::size_t i = 1; i < order.size(); ++i) {
            if (o[order[i]].first == o[order[i - 1]].first) duplicate(o[order[i]].first, offsets[order[i]]);
        }
    }
    [[noreturn]] void duplicate(const std::string& name, std::size_t at) const {
        std::string quoted;
        write_string(quoted, excerpt(name));
        fail_at(at, "duplicate member " + quoted);
    }

    value parse_array(int depth) {
        expect('[');
        array a;
        skip_space();
        if (peek() == ']') {
            ++pos_;
            return value(std::move(a));
        }
        for (;;) {
            skip_space();
            a.push_back(parse_value(depth + 1));
            skip_space();
            if (peek() == ',') {
                ++pos_;
                continue;
            }
            expect(']');
            return value(std::move(a));
        }
    }

    static void append_utf8(std::string& out, std::uint32_t cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }

    std::uint32_t hex4() {
        std::uint32_t v = 0;
        for (int i = 0; i < 4; ++i) {
            const char c = peek();
            v <<= 4;
            if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
            else fail("invalid \\u escape");
            ++pos_;
        }
        return v;
    }

    /// The code point of a \u escape whose 'u' is at pos_; a surrogate pair gives one code point.
    std::uint32_t unicode_escape() {
        const std::size_t at = pos_ - 1;
        ++pos_;
        const std::uint32_t cp = hex4();
        if (cp >= 0xDC00 && cp < 0xE000) fail_at(at, "a low surrogate without its high half");
        if (cp < 0xD800 || cp >= 0xDC00) return cp;
        if (peek() != '\\') fail_at(at, "a high surrogate without its low half");
        ++pos_;
        if (peek() != 'u') fail_at(at, "a high surrogate without its low half");
        ++pos_;
        const std::uint32_t low = hex4();
        if (low < 0xDC00 || low >= 0xE000) fail_at(at, "a high surrogate without its low half");
        return 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }

    std::string parse_string() {
        expect('"');
        std::string s;
        for (;;) {
            const std::size_t plain = plain_run_end(text_, pos_); // in in one piece
            s.append(text_.substr(pos_, plain - pos_));
            pos_ = plain;
            const char c = peek();
            if (c == '"') {
                ++pos_;
                return s;
            }
            if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
            if (c != '\\') {
                const utf8_step u = next_utf8(text_, pos_);
                if (!u.valid) {
                    if (pos_ + u.length >= text_.size()) fail_at(text_.size(), ""); // cut inside a character
                    fail("invalid UTF-8 in a string");
                }
                s.append(text_.substr(pos_, u.length));
                pos_ += u.length;
                continue;
            }
            ++pos_;
            const char e = peek();
            switch (e) {
            case '"': s += '"'; break;
            case '\\': s += '\\'; break;
            case '/': s += '/'; break;
            case 'b': s += '\b'; break;
            case 'f': s += '\f'; break;
            case 'n': s += '\n'; break;
            case 'r': s += '\r'; break;
            case 't': s += '\t'; break;
            case 'u': append_utf8(s, unicode_escape()); continue;
            default: fail("invalid escape");
            }
            ++pos_;
        }
    }

    /// A number token: an integer that int64 or uint64 holds becomes one; anything else a real.
    value parse_number() {
        const std::size_t start = pos_;
        const bool negative = peek() == '-';
        if (negative) ++pos_;
        if (!digit()) fail("invalid value");
        if (text_[pos_] == '0') ++pos_;
        else while (pos_ < text_.size() && digit()) ++pos_;
        const std::size_t integer_end = pos_;
        bool integral = true;
        if (pos_ < text_.size() && text_[pos_] == '.') {
            integral = false;
            ++pos_;
            if (!digit()) fail("invalid number");
            while (pos_ < text_.size() && digit()) ++pos_;
        }
        std::size_t exponent_start = pos_;
        if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
            integral = false;
            ++pos_;
            exponent_start = pos_;
            if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
            if (!digit()) fail("invalid number");
            while (pos_ < text_.size() && digit()) ++pos_;
        }
        // A number at the very end of the text may itself be cut short; the caller's structure
        // check (an unclosed container) reports that as truncation.
        const std::string_view token = text_.substr(start, pos_ - start);
        const char* first = token.data();
        const char* last = token.data() + token.size();
        if (integral) {
            if (negative) {
                std::int64_t i = 0;
                if (const auto r = std::from_chars(first, last, i); r.ec == std::errc() && r.ptr == last) return value(i);
            } else {
                std::uint64_t u = 0;
                if (const auto r = std::from_chars(first, last, u); r.ec == std::errc() && r.ptr == last) return value(u);
            }
        }
        double nearest = 0;
        const auto r = std::from_chars(first, last, nearest);
        if (r.ec == std::errc::result_out_of_range) {
            nearest = overflows(token, integer_end - start, exponent_start - start, integral)
                          ? std::numeric_limits<double>::infinity()
                          : 0.0;
            if (negative) nearest = -nearest;
        }
        return value(real{std::string(token), nearest, integral});
    }

    /// Whether a token that a double cannot hold is too large (rather than too small): its decimal
    /// magnitude (digits before the point, less leading zeros, plus the exponent) is positive.
    static bool overflows(std::string_view token, std::size_t integer_end, std::size_t exponent_start, bool integral) {
        if (integral) return true;
        std::size_t i = token[0] == '-' ? 1 : 0;
        long long magnitude = 0;
        if (token[i] != '0') {
            magnitude = static_cast<long long>(integer_end - i);
        } else {
            // 0.000ddd: minus the zeros after the point
            if (integer_end < token.size() && token[integer_end] == '.')
                for (std::size_t k = integer_end + 1; k < token.size() && token[k] == '0'; ++k) --magnitude;
        }
        if (exponent_start < token.size()) {
            bool minus = token[exponent_start] == '-';
            std::size_t k = exponent_start + (token[exponent_start] == '-' || token[exponent_start] == '+' ? 1 : 0);
            long long exponent = 0;
            for (; k < token.size(); ++k) exponent = std::min<long long>(exponent * 10 + (token[k] - '0'), 1LL << 40);
            magnitude += minus ? -exponent : exponent;
        }
        return magnitude > 0;
    }

    bool digit() const {
        const char c = peek();
        return c >= '0' && c <= '9';
    }

    std::string_view text_;
    std::size_t pos_ = 0;
};

/// Parses one JSON document; throws parse_error (with truncated() for a document cut short).
[[nodiscard]] inline value parse(std::string_view text) { return parser(text).document(); }

} // namespace custody::debug::detail::json
