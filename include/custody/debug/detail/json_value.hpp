/// @file
/// The JSON value of the debug layer's reader and writer: null, boolean, exact integers, other
/// numbers kept as text, strings, arrays and objects. An internal of the debug layer.
#pragma once

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace custody::debug::detail::json {

/// A number that is not a 64-bit integer: it has a fraction or an exponent, or it is an integer
/// beyond the range of int64 and uint64. Kept as its text, so that it writes back as it was read,
/// and as the nearest double (±infinity or 0 beyond the double's range).
struct real {
    std::string text;
    double nearest = 0;
    bool integral = false; ///< the text has neither fraction nor exponent (an integer out of range)
};

class value;
using array = std::vector<value>;
/// Members in document order; lookups are linear (reports have few keys per object). The reader
/// refuses a document with two members of one name in an object.
using object = std::vector<std::pair<std::string, value>>;

/// A JSON value. Integers are held exactly: int64 for every integer in its range, uint64 for those
/// above it; other numbers as `real`.
/// Thread safety: a value is a plain value type. Ownership: owns its children.
class value {
public:
    using storage =
        std::variant<std::nullptr_t, bool, std::int64_t, std::uint64_t, real, std::string, array, object>;

    value() : v_(nullptr) {}
    value(std::nullptr_t) : v_(nullptr) {}
    value(bool b) : v_(b) {}
    template <std::integral T>
        requires(!std::same_as<T, bool>)
    value(T i) : v_(nullptr) {
        if (std::in_range<std::int64_t>(i)) v_ = static_cast<std::int64_t>(i);
        else v_ = static_cast<std::uint64_t>(i);
    }
    /// A finite double as its shortest round-trip text; JSON has no NaN or infinity: null.
    value(double d) : v_(nullptr) {
        if (!std::isfinite(d)) return;
        char buf[32];
        const auto end = std::to_chars(buf, buf + sizeof buf, d).ptr;
        v_ = real{std::string(buf, end), d, false};
    }
    value(real r) : v_(std::move(r)) {}
    value(std::string s) : v_(std::move(s)) {}
    value(const char* s) : v_(std::string(s)) {}
    value(array a) : v_(std::move(a)) {}
    value(object o) : v_(std::move(o)) {}

    [[nodiscard]] bool is_null() const noexcept { return std::holds_alternative<std::nullptr_t>(v_); }
    [[nodiscard]] bool is_bool() const noexcept { return std::holds_alternative<bool>(v_); }
    [[nodiscard]] bool is_number() const noexcept { return is_integer() || std::holds_alternative<real>(v_); }
    /// An integer that int64 or uint64 holds exactly (written without fraction or exponent).
    [[nodiscard]] bool is_integer() const noexcept {
        return std::holds_alternative<std::int64_t>(v_) || std::holds_alternative<std::uint64_t>(v_);
    }
    [[nodiscard]] bool is_string() const noexcept { return std::holds_alternative<std::string>(v_); }
    [[nodiscard]] bool is_array() const noexcept { return std::holds_alternative<array>(v_); }
    [[nodiscard]] bool is_object() const noexcept { return std::holds_alternative<object>(v_); }

    /// Typed access; std::bad_variant_access on the wrong type.
    [[nodiscard]] bool as_bool() const { return std::get<bool>(v_); }
    [[nodiscard]] const std::string& as_string() const { return std::get<std::string>(v_); }
    [[nodiscard]] const array& as_array() const { return std::get<array>(v_); }
    [[nodiscard]] const object& as_object() const { return std::get<object>(v_); }

    /// The integer as T when it is an integer within T's range; nullopt otherwise (not a number,
    /// a real, or out of T's range).
    template <std::integral T>
    [[nodiscard]] std::optional<T> as_integer() const noexcept {
        if (const auto* i = std::get_if<std::int64_t>(&v_)) {
            if (std::in_range<T>(*i)) return static_cast<T>(*i);
        } else if (const auto* u = std::get_if<std::uint64_t>(&v_)) {
            if (std::in_range<T>(*u)) return static_cast<T>(*u);
        }
        return std::nullopt;
    }
    /// The number as the nearest double (inexact above 2^53); std::bad_variant_access when this is
    /// not a number.
    [[nodiscard]] double as_number() const {
        if (const auto* i = std::get_if<std::int64_t>(&v_)) return static_cast<double>(*i);
        if (const auto* u = std::get_if<std::uint64_t>(&v_)) return static_cast<double>(*u);
        return std::get<real>(v_).nearest;
    }
    /// The number that is not a 64-bit integer, or nullptr.
    [[nodiscard]] const real* as_real() const noexcept { return std::get_if<real>(&v_); }

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
        static constexpr const char* names[] = {"null",   "boolean", "number", "number",
                                                "number", "string",  "array",  "object"};
        return names[v_.index()];
    }

    [[nodiscard]] const storage& get() const noexcept { return v_; }

private:
    storage v_;
};

} // namespace custody::debug::detail::json
