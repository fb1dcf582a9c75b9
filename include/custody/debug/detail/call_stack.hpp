/// @file
/// A call stack captured cheaply as return addresses into a fixed array (glibc's backtrace), and
/// symbolized only when a report is made (symbolizer.hpp: function, file and line with libdw); a
/// process may extend what is captured (stack_extension: the Python package's library puts Python
/// frames in place of the interpreter's).
#pragma once

#include <custody/debug/detail/symbolizer.hpp>

#include <execinfo.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace custody::debug::detail {

/// What a process adds to the stacks it captures, set once for the process (install_stack_extension).
/// `rewrite(raw, n, out, room)` turns the raw return addresses of a capture (innermost first, the
/// tracker's own frames included) into the frames kept (at most `room`) and returns how many; it may
/// leave frames out and add frames of its own, each tagged (is_added_frame: the top bit set, never
/// a code address), which `name(frame, text)` later writes as a report line ("FILE:LINE in NAME").
/// Both run without custody's locks held and must not throw.
struct stack_extension {
    int (*rewrite)(void* const* raw, int n, void** out, int room) noexcept = nullptr;
    bool (*name)(const void* frame, std::string& text) = nullptr;
};

[[nodiscard]] inline std::atomic<const stack_extension*>& stack_extension_slot() noexcept {
    static std::atomic<const stack_extension*> slot{nullptr};
    return slot;
}
/// Sets the process's extension (`e` must outlive every capture and report; nullptr: none).
inline void install_stack_extension(const stack_extension* e) noexcept { stack_extension_slot().store(e); }

/// Whether `frame` was added by a stack_extension rather than captured.
[[nodiscard]] inline bool is_added_frame(const void* frame) noexcept {
    return (reinterpret_cast<std::uintptr_t>(frame) >> 63) != 0;
}

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
    /// With a stack_extension installed, it rewrites the frames kept.
    [[gnu::noinline]] static call_stack capture(int skip) noexcept {
        std::array<void*, max_depth + 16> raw{};
        const int n = ::backtrace(raw.data(), static_cast<int>(raw.size()));
        call_stack s;
        const int first = std::min(skip, n);
        if (const stack_extension* e = stack_extension_slot().load(std::memory_order_acquire)) {
            s.depth = std::clamp(e->rewrite(raw.data() + first, n - first, s.frames.data(), max_depth), 0, max_depth);
            return s;
        }
        s.depth = std::min(n - first, max_depth);
        std::copy_n(raw.begin() + first, s.depth, s.frames.begin());
        return s;
    }

    /// Where each captured frame's code lies (module and offset), innermost first; the frames a
    /// stack_extension added are left out. Allocates.
    [[nodiscard]] std::vector<code_location> locations() const {
        std::vector<code_location> where;
        where.reserve(static_cast<std::size_t>(depth));
        for (int i = 0; i < depth; ++i) {
            if (!is_added_frame(frames[static_cast<std::size_t>(i)])) where.push_back(locate(frames[static_cast<std::size_t>(i)]));
        }
        return where;
    }

    /// One line per source frame (frame_text.hpp: "FILE:LINE in FUNCTION [MODULE+0xOFFSET]", or
    /// "unsymbolized [MODULE+0xOFFSET]" without libdw), innermost first, starting at the
    /// application's first frame: the tracker's own frames on top are left out. The frames a
    /// stack_extension added follow the captured ones (as it puts them), named by it. Takes the
    /// process-wide symbolizer's lock. Allocates; for reports only.
    [[nodiscard]] std::vector<std::string> symbolize() const {
        if (depth == 0) return {};
        std::vector<std::string> lines;
        if (const std::vector<code_location> where = locations(); !where.empty()) {
            shared_symbolizer& shared = process_symbolizer();
            const std::lock_guard lock(shared.mutex);
            lines = symbolize_stack(shared.instance, where);
        }
        const stack_extension* e = stack_extension_slot().load(std::memory_order_acquire);
        for (int i = 0; i < depth; ++i) {
            const void* f = frames[static_cast<std::size_t>(i)];
            if (!is_added_frame(f)) continue;
            std::string text;
            if (e == nullptr || e->name == nullptr || !e->name(f, text)) text = "unnamed added frame";
            lines.push_back(std::move(text));
        }
        return lines;
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
