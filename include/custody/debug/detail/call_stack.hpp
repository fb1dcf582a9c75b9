/// @file
/// A call stack captured cheaply into a fixed array (glibc's backtrace), symbolized only when a
/// report is written (backtrace_symbols).
#pragma once

#include <custody/core/detail/format.hpp>

#include <cxxabi.h>
#include <execinfo.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace custody::debug::detail {

/// The return addresses of one call stack, innermost first.
/// Invariant: depth <= frames.size(); frames[depth..] are null.
struct call_stack {
    static constexpr int max_depth = 16;
    std::array<void*, max_depth> frames{};
    int depth = 0;

    [[nodiscard]] bool empty() const noexcept { return depth == 0; }

    /// Captures the caller's stack, dropping the `skip` innermost frames (1: this function).
    /// Not inlined, so the count is the same at every optimization level. Function names need the
    /// program linked with -rdynamic; otherwise frames read "binary(+offset)" (see addr2line).
    /// Not async-signal-safe on first use (glibc loads libgcc lazily); allocation-free afterwards.
    [[gnu::noinline]] static call_stack capture(int skip) noexcept {
        std::array<void*, max_depth + 8> raw{};
        const int n = ::backtrace(raw.data(), static_cast<int>(raw.size()));
        call_stack s;
        const int first = std::min(skip, n);
        s.depth = std::min(n - first, max_depth);
        std::copy_n(raw.begin() + first, s.depth, s.frames.begin());
        return s;
    }

    /// One line per frame ("binary(function+0x1f) [0x...]"), starting at the caller's first frame:
    /// the tracker's own frames on top of the stack (how many depends on inlining) are dropped, so
    /// a report starts where the application asked for memory. Allocates; for reports only.
    [[nodiscard]] std::vector<std::string> symbolize() const {
        std::vector<std::string> lines;
        if (depth == 0) return lines;
        char** symbols = ::backtrace_symbols(frames.data(), depth);
        lines.reserve(static_cast<std::size_t>(depth));
        for (int i = 0; i < depth; ++i) {
            lines.push_back(symbols != nullptr ? demangle(symbols[i]) : custody::detail::to_hex(frames[static_cast<std::size_t>(i)]));
        }
        std::free(static_cast<void*>(symbols)); // NOLINT: backtrace_symbols returns one malloc'ed block
        const auto own = [](const std::string& line) { // the function itself is custody::debug's
            static constexpr std::string_view prefix = "custody::debug::";
            const auto open = line.find('(');
            return open != std::string::npos && line.compare(open + 1, prefix.size(), prefix) == 0;
        };
        const auto first_caller = std::find_if_not(lines.begin(), lines.end(), own);
        if (first_caller != lines.end()) lines.erase(lines.begin(), first_caller);
        return lines;
    }

    /// "bin(_ZN3foo3barEv+0x1f) [0x..]" -> "bin(foo::bar()+0x1f) [0x..]"; other text unchanged.
    static std::string demangle(const std::string& line) {
        const auto open = line.find('(');
        const auto plus = line.find('+', open == std::string::npos ? 0 : open);
        if (open == std::string::npos || plus == std::string::npos || plus == open + 1) return line;
        const std::string mangled = line.substr(open + 1, plus - open - 1);
        int status = -1;
        char* name = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
        if (status != 0 || name == nullptr) {
            std::free(name); // NOLINT: __cxa_demangle allocates with malloc
            return line;
        }
        std::string out = line.substr(0, open + 1) + name + line.substr(plus);
        std::free(name); // NOLINT
        return out;
    }


    friend bool operator==(const call_stack& a, const call_stack& b) noexcept {
        return a.depth == b.depth && std::equal(a.frames.begin(), a.frames.begin() + a.depth, b.frames.begin());
    }
};

/// Hash of a call stack, for grouping.
struct call_stack_hash {
    std::size_t operator()(const call_stack& s) const noexcept {
        std::size_t h = static_cast<std::size_t>(s.depth);
        for (int i = 0; i < s.depth; ++i) {
            h ^= std::hash<const void*>{}(s.frames[static_cast<std::size_t>(i)]) + 0x9e3779b97f4a7c15ULL + (h << 6) +
                 (h >> 2);
        }
        return h;
    }
};

} // namespace custody::debug::detail
