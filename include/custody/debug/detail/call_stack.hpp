/// @file
/// A call stack captured cheaply as return addresses into a fixed array (glibc's backtrace), and
/// symbolized only when a report is made (symbolizer.hpp: function, file and line with libdw).
#pragma once

#include <custody/debug/detail/symbolizer.hpp>

#include <execinfo.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace custody::debug::detail {

/// The return addresses of one call stack, innermost first.
/// Invariant: depth <= frames.size(); frames[depth..] are null.
struct call_stack {
    static constexpr int max_depth = 16;
    std::array<void*, max_depth> frames{};
    int depth = 0;

    [[nodiscard]] bool empty() const noexcept { return depth == 0; }

    /// Captures the caller's stack, dropping the `skip` innermost frames (1: this function; a
    /// sanitizer's interceptor of backtrace adds one, which symbolize() leaves out with the rest of
    /// custody's frames). Addresses only: nothing is looked up. Not inlined, so the count is the same at every
    /// optimization level. Not async-signal-safe on first use (glibc loads libgcc lazily);
    /// allocation-free afterwards.
    [[gnu::noinline]] static call_stack capture(int skip) noexcept {
        std::array<void*, max_depth + 8> raw{};
        const int n = ::backtrace(raw.data(), static_cast<int>(raw.size()));
        call_stack s;
        const int first = std::min(skip, n);
        s.depth = std::min(n - first, max_depth);
        std::copy_n(raw.begin() + first, s.depth, s.frames.begin());
        return s;
    }

    /// Where each frame's code lies (module and offset), innermost first. Allocates.
    [[nodiscard]] std::vector<code_location> locations() const {
        std::vector<code_location> where;
        where.reserve(static_cast<std::size_t>(depth));
        for (int i = 0; i < depth; ++i) where.push_back(locate(frames[static_cast<std::size_t>(i)]));
        return where;
    }

    /// One line per source frame (frame_text.hpp: "FILE:LINE in FUNCTION [MODULE+0xOFFSET]", or
    /// "unsymbolized [MODULE+0xOFFSET]" without libdw), innermost first, starting at the
    /// application's first frame: the tracker's own frames on top are left out. Takes the
    /// process-wide symbolizer's lock. Allocates; for reports only.
    [[nodiscard]] std::vector<std::string> symbolize() const {
        if (depth == 0) return {};
        const std::vector<code_location> where = locations();
        shared_symbolizer& shared = process_symbolizer();
        const std::lock_guard lock(shared.mutex);
        return symbolize_stack(shared.instance, where);
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
