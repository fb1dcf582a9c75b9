/// @file
/// A small JSON writer and reader for the debug reports and the merge tool: enough JSON (RFC 8259)
/// for what custody writes, strict about what it reads.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace custody::debug::json {

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

class value;
using array = std::vector<value>;
/// Members in document order; lookups are linear (reports have few keys per object).
using object = std::vector<std::pair<std::string, value>>;

/// A JSON value. Numbers are doubles (exact for integers below 2^53, which byte counts are).
/// Thread safety: a value is a plain value type. Ownership: owns its children.
class value {
public:
    using storage = std::variant<std::nullptr_t, bool, double, std::string, array, object>;

    value() : v_(nullptr) {}
    value(std::nullptr_t) : v_(nullptr) {}
    value(bool b) : v_(b) {}
    value(double d) : v_(d) {}
    value(std::string s) : v_(std::move(s)) {}
    value(array a) : v_(std::move(a)) {}
    value(object o) : v_(std::move(o)) {}

    [[nodiscard]] bool is_null() const noexcept { return std::holds_alternative<std::nullptr_t>(v_); }
    [[nodiscard]] bool is_bool() const noexcept { return std::holds_alternative<bool>(v_); }
    [[nodiscard]] bool is_number() const noexcept { return std::holds_alternative<double>(v_); }
    [[nodiscard]] bool is_integer() const noexcept {
        return is_number() && std::floor(std::get<double>(v_)) == std::get<double>(v_);
    }
    [[nodiscard]] bool is_string() const noexcept { return std::holds_alternative<std::string>(v_); }
    [[nodiscard]] bool is_array() const noexcept { return std::holds_alternative<array>(v_); }
    [[nodiscard]] bool is_object() const noexcept { return std::holds_alternative<object>(v_); }

    /// Typed access; std::bad_variant_access on the wrong type.
    [[nodiscard]] bool as_bool() const { return std::get<bool>(v_); }
    [[nodiscard]] double as_number() const { return std::get<double>(v_); }
    [[nodiscard]] const std::string& as_string() const { return std::get<std::string>(v_); }
    [[nodiscard]] const array& as_array() const { return std::get<array>(v_); }
    [[nodiscard]] const object& as_object() const { return std::get<object>(v_); }

    /// The member `key` of an object, or nullptr (also when this is not an object).
    [[nodiscard]] const value* find(std::string_view key) const noexcept {
        const auto* o = std::get_if<object>(&v_);
        if (o == nullptr) return nullptr;
        for (const auto& [k, v] : *o)
            if (k == key) return &v;
        return nullptr;
    }

    /// The JSON type name ("null", "boolean", "number", "string", "array", "object").
    [[nodiscard]] const char* type_name() const noexcept {
        static constexpr const char* names[] = {"null", "boolean", "number", "string", "array", "object"};
        return names[v_.index()];
    }

private:
    storage v_;
};

/// Appends the JSON string literal for `s` (quotes and escapes) to `out`.
inline void write_string(std::string& out, std::string_view s) {
    out += '"';
    for (const char c : s) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
            if (static_cast<unsigned char>(c) < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
                out += buf;
            } else {
                out += c;
            }
        }
    }
    out += '"';
}

/// A streaming writer that emits compact JSON with one member per line at the top levels, and
/// keeps commas right. Usage: w.begin_object(); w.field("a", 1); w.key("b"); w.begin_array(); ...
/// Not thread-safe. Preconditions (Expects-style, not checked at run time): keys only inside
/// objects, balanced begin/end.
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
    void number(std::int64_t v) {
        separate();
        out_ += std::to_string(v);
    }
    void number(std::uint64_t v) {
        separate();
        out_ += std::to_string(v);
    }
    void number(int v) { number(static_cast<std::int64_t>(v)); }
    void number(double v) {
        separate();
        if (!std::isfinite(v)) {
            out_ += "null";
            return;
        }
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.17g", v);
        out_ += buf;
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
    /// Writes a parsed value back.
    void write(const value& v) {
        if (v.is_null()) null();
        else if (v.is_bool()) boolean(v.as_bool());
        else if (v.is_integer() && std::fabs(v.as_number()) < 9.0e15) number(static_cast<std::int64_t>(v.as_number()));
        else if (v.is_number()) number(v.as_number());
        else if (v.is_string()) string(v.as_string());
        else if (v.is_array()) {
            begin_array();
            for (const auto& e : v.as_array()) write(e);
            end_array();
        } else {
            begin_object();
            for (const auto& [k, e] : v.as_object()) {
                key(k);
                write(e);
            }
            end_object();
        }
    }

    [[nodiscard]] const std::string& str() const noexcept { return out_; }
    [[nodiscard]] std::string take() noexcept { return std::move(out_); }

private:
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

namespace detail {

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

    [[noreturn]] void fail(const std::string& what) const {
        const bool truncated = pos_ >= text_.size();
        throw parse_error("json: " + (truncated ? std::string("document ends early (truncated)") : what) +
                              " at offset " + std::to_string(pos_),
                          pos_, truncated);
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
        default: return value(parse_number());
        }
    }

    value parse_object(int depth) {
        expect('{');
        object o;
        skip_space();
        if (peek() == '}') {
            ++pos_;
            return value(std::move(o));
        }
        for (;;) {
            skip_space();
            if (peek() != '"') fail("expected a member name");
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
            return value(std::move(o));
        }
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
            ++pos_;
            v <<= 4;
            if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
            else fail("invalid \\u escape");
        }
        return v;
    }

    std::string parse_string() {
        expect('"');
        std::string s;
        for (;;) {
            const char c = peek();
            ++pos_;
            if (c == '"') return s;
            if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
            if (c != '\\') {
                s += c;
                continue;
            }
            const char e = peek();
            ++pos_;
            switch (e) {
            case '"': s += '"'; break;
            case '\\': s += '\\'; break;
            case '/': s += '/'; break;
            case 'b': s += '\b'; break;
            case 'f': s += '\f'; break;
            case 'n': s += '\n'; break;
            case 'r': s += '\r'; break;
            case 't': s += '\t'; break;
            case 'u': {
                std::uint32_t cp = hex4();
                if (cp >= 0xD800 && cp < 0xDC00) {
                    expect('\\');
                    expect('u');
                    const std::uint32_t low = hex4();
                    if (low < 0xDC00 || low >= 0xE000) fail("invalid surrogate pair");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                }
                append_utf8(s, cp);
                break;
            }
            default: fail("invalid escape");
            }
        }
    }

    double parse_number() {
        const std::size_t start = pos_;
        if (peek() == '-') ++pos_;
        if (!digit()) fail("invalid value");
        if (text_[pos_] == '0') ++pos_;
        else while (pos_ < text_.size() && digit()) ++pos_;
        if (pos_ < text_.size() && text_[pos_] == '.') {
            ++pos_;
            if (!digit()) fail("invalid number");
            while (pos_ < text_.size() && digit()) ++pos_;
        }
        if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
            ++pos_;
            if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
            if (!digit()) fail("invalid number");
            while (pos_ < text_.size() && digit()) ++pos_;
        }
        // A number at the very end of the text may itself be cut short; the caller's structure
        // check (an unclosed container) reports that as truncation.
        return std::strtod(std::string(text_.substr(start, pos_ - start)).c_str(), nullptr);
    }
    bool digit() const {
        const char c = peek();
        return c >= '0' && c <= '9';
    }

    std::string_view text_;
    std::size_t pos_ = 0;
};

} // namespace detail

/// Parses one JSON document; throws parse_error (with truncated() for a document cut short).
[[nodiscard]] inline value parse(std::string_view text) { return detail::parser(text).document(); }

} // namespace custody::debug::json
