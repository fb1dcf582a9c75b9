/// @file
/// `allocator_spec`: an allocator named on custody-replay's command line with its options
/// ("pool:maximum_size=8GiB,reuse=same_stream"), and the parsing of the values options take.
#pragma once

#include <custody/core/error.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace custody::replay {

/// An allocator name or option that custody-replay does not accept. The message names the
/// allocator as written on the command line and what is wrong.
class spec_error final : public custody::error {
public:
    using custody::error::error;
};

/// One allocator as written on the command line: `name[:key=value[,key=value]...]`.
/// Each option may be read once (take_*); unused() lists those nobody took, which are errors.
class allocator_spec {
public:
    /// Parses `text`. Throws spec_error for an empty name or an option without '='.
    explicit allocator_spec(std::string text) : text_(std::move(text)) {
        const auto colon = text_.find(':');
        name_ = text_.substr(0, colon);
        if (name_.empty()) fail("the allocator name is empty");
        if (colon == std::string::npos) return;
        std::string_view rest = std::string_view(text_).substr(colon + 1);
        while (!rest.empty()) {
            const auto comma = rest.find(',');
            const std::string_view item = rest.substr(0, comma);
            const auto eq = item.find('=');
            if (eq == std::string_view::npos || eq == 0) {
                fail("option '" + std::string(item) + "' is not key=value");
            }
            for (const auto& o : options_) {
                if (o.key == item.substr(0, eq)) fail("option '" + o.key + "' is given twice");
            }
            options_.push_back({std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)), false});
            rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
            if (comma != std::string_view::npos && rest.empty()) fail("a comma ends the options");
        }
    }

    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    [[nodiscard]] const std::string& text() const noexcept { return text_; }

    /// The value of option `key` (marking it used), or nullptr when not given.
    const std::string* take(std::string_view key) {
        for (auto& o : options_) {
            if (o.key == key) {
                o.used = true;
                return &o.value;
            }
        }
        return nullptr;
    }

    /// A byte count: a number with an optional unit B, KiB, MiB, GiB, TiB (powers of 1024) or
    /// kB, MB, GB, TB (powers of 1000); fractions allowed with a unit ("1.5GiB").
    template <class T>
    void take_size(std::string_view key, T& into) {
        if (const std::string* v = take(key)) into = static_cast<T>(parse_size(*v, key));
    }
    /// A non-negative integer.
    template <class T>
    void take_count(std::string_view key, T& into) {
        if (const std::string* v = take(key)) {
            T n{};
            const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
            if (v->empty() || ec != std::errc{} || end != v->data() + v->size()) {
                fail("option " + std::string(key) + "='" + *v + "' is not a non-negative integer in range");
            }
            into = n;
        }
    }
    /// One of `choices`; returns its index, or -1 when the option is not given.
    int take_choice(std::string_view key, const std::vector<std::string_view>& choices) {
        const std::string* v = take(key);
        if (v == nullptr) return -1;
        for (std::size_t i = 0; i < choices.size(); ++i)
            if (*v == choices[i]) return static_cast<int>(i);
        std::string list;
        for (const auto c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
        fail("option " + std::string(key) + "='" + *v + "' is not one of " + list);
    }

    /// Throws spec_error naming the first option nobody took, with the options `known` lists.
    void check_all_used(std::string_view known) const {
        for (const auto& o : options_) {
            if (!o.used) {
                fail("unknown option '" + o.key + "'" +
                     (known.empty() ? std::string(" (it takes no options)") : " (options: " + std::string(known) + ")"));
            }
        }
    }

    [[noreturn]] void fail(const std::string& what) const {
        throw spec_error("allocator '" + text_ + "': " + what);
    }

    std::uint64_t parse_size(std::string_view text, std::string_view key) const {
        const auto bad = [&] {
            fail("option " + std::string(key) + "='" + std::string(text) +
                 "' is not a size (a number with an optional unit: B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)");
        };
        const auto value = parse_byte_count(text);
        if (!value) bad();
        return *value;
    }

    /// `text` as a byte count (see take_size), or nothing when it is not one or does not fit 64 bits.
    static std::optional<std::uint64_t> parse_byte_count(std::string_view text) {
        std::size_t digits = 0;
        while (digits < text.size() && ((text[digits] >= '0' && text[digits] <= '9') || text[digits] == '.')) ++digits;
        const std::string_view number = text.substr(0, digits);
        const std::string_view unit = text.substr(digits);
        static constexpr std::pair<std::string_view, double> units[] = {
            {"", 1.0},         {"B", 1.0},           {"KiB", 1024.0},   {"MiB", 1048576.0}, {"GiB", 1073741824.0},
            {"TiB", 1099511627776.0}, {"kB", 1e3}, {"KB", 1e3},  {"MB", 1e6},        {"GB", 1e9}, {"TB", 1e12}};
        double scale = 0;
        for (const auto& [u, s] : units)
            if (unit == u) scale = s;
        if (number.empty() || scale == 0) return std::nullopt;
        double n = 0;
        const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), n);
        if (ec != std::errc{} || end != number.data() + number.size()) return std::nullopt;
        if (unit.empty() && number.find('.') != std::string_view::npos) return std::nullopt; // bytes are whole
        const double bytes = std::floor(n * scale);
        if (!(bytes >= 0) || bytes >= 18446744073709551615.0) return std::nullopt;
        return static_cast<std::uint64_t>(bytes);
    }

private:
    struct option {
        std::string key;
        std::string value;
        bool used;
    };
    std::string text_;
    std::string name_;
    std::vector<option> options_;
};

/// Bytes as people read them: "512 B", "1.50 KiB", "9.21 GiB".
[[nodiscard]] inline std::string format_bytes(std::uint64_t bytes) {
    static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = static_cast<double>(bytes);
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        ++u;
    }
    char buf[32];
    if (u == 0) {
        std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
    } else {
        std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
    }
    return buf;
}

} // namespace custody::replay
