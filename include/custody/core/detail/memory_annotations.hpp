/// @file
/// `memory_annotations`: what one resource (a pool, a staging ring, a tracker) tells CUDA's tools
/// about the memory it hands out, behind one switch fixed when the resource is built, which its hot
/// path reads as a single, predictable branch. The calls themselves are detail/nvtx_memory.hpp's.
#pragma once

#include <custody/core/detail/nvtx_memory.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace custody::detail {

/// A resource's announcements to CUDA's tools (compute-sanitizer, Nsight Systems) through NVTX:
/// the memory it takes from its upstream as heaps, each block while it is handed out as a region,
/// blocks named after their owners.
///
/// The switch, on(): the owner asked for annotations (`wanted`), NVTX is compiled in, and the
/// process names an NVTX tool (nvtx_memory::tool_named(): how compute-sanitizer and Nsight Systems
/// attach theirs). Fixed at construction, so that no block is ever handed out under one answer and
/// given back under another; NVTX itself is first asked at the first heap, after the upstream
/// handed out memory (so the CUDA runtime is initialized, as compute-sanitizer requires before any
/// NVTX call). Off, every call is a branch never taken on a constant (nothing at all where NVTX is
/// compiled out).
///
/// Order of calls, so that the tool never sees a block of one owner withdrawn by another: announce
/// a heap before cutting blocks from it and withdraw it before giving it back to the upstream;
/// announce a block after taking it (handed_out) and withdraw it before putting it back where
/// another thread may take it (coming_back).
/// Thread safety: thread-safe. Ownership: none (a view of the process's nvtx_memory).
class memory_annotations {
public:
    /// `wanted`: the owner asks for annotations (its `annotate` option).
    explicit memory_annotations(bool wanted) noexcept : on_(nvtx_compiled && wanted && nvtx_memory::tool_named()) {}
    memory_annotations(const memory_annotations&) = delete;
    memory_annotations& operator=(const memory_annotations&) = delete;

    /// Whether this resource tells the tools anything.
    [[nodiscard]] bool on() const noexcept {
        if constexpr (nvtx_compiled) {
            return on_;
        } else {
            return false; // compiled out: no branch at all
        }
    }

    /// `size` bytes at `base`, just taken from the upstream: a heap named `name` (copied; the
    /// tools take printable ASCII, at most 49 characters). `whole`: the heap is one region end to
    /// end (see nvtx_memory).
    void heap_taken(const void* base, std::size_t size, std::string_view name, bool whole = false) noexcept {
        if (on()) nvtx_memory::instance().add_heap(address(base), size, name, whole);
    }
    /// The heap at `base`, about to go back to the upstream. Blocks still in it (never given back)
    /// go with it: the tool may report them as leaks.
    void heap_returned(const void* base) noexcept {
        if (on()) static_cast<void>(nvtx_memory::instance().remove_heap(address(base)));
    }

    /// `bytes` at `p`, just handed out (p may be null: nothing was).
    [[gnu::always_inline]] void handed_out(const void* p, std::size_t bytes) noexcept {
        if (on()) [[unlikely]] announce(p, bytes);
    }
    /// The block at `p`, about to come back.
    [[gnu::always_inline]] void coming_back(const void* p) noexcept {
        if (on()) [[unlikely]] withdraw(p);
    }

    /// Names the block at `p` after its owner (the tracker's). Call it after the block was handed
    /// out by the upstream: NVTX may be asked for the first time.
    void name(const void* p, std::string_view owner) noexcept {
        if (on() && p != nullptr) nvtx_memory::instance().name(address(p), owner);
    }

private:
    static std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

    [[gnu::noinline, gnu::cold]] static void announce(const void* p, std::size_t bytes) noexcept {
        if (p != nullptr) nvtx_memory::instance().add_region(address(p), bytes);
    }
    [[gnu::noinline, gnu::cold]] static void withdraw(const void* p) noexcept {
        nvtx_memory::instance().remove_region(address(p));
    }

    const bool on_;
};

} // namespace custody::detail
