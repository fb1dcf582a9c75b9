/// @file
/// `memory_annotations`: what one resource (a pool, a staging ring, a tracker) tells CUDA's tools
/// about the memory it hands out, behind one switch that its hot path reads as a single,
/// predictable branch. The calls themselves are detail/nvtx_memory.hpp's.
#pragma once

#include <custody/core/detail/nvtx_memory.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace custody::detail {

/// A resource's announcements to CUDA's tools (compute-sanitizer, Nsight Systems) through NVTX:
/// the memory it takes from its upstream as heaps, each block while it is handed out as a region,
/// blocks named after their owners.
///
/// The switch: on() is false until the resource's first heap, and stays false unless the owner
/// asked for annotations (`wanted`) and a tool listens. Without a tool every call is one relaxed
/// load and a branch never taken (nothing at all where NVTX is compiled out); the first heap asks NVTX once per process whether a tool is
/// there, after the upstream handed out memory (so the CUDA runtime is initialized, as
/// compute-sanitizer requires before any NVTX call). A resource's blocks all come from its heaps,
/// so none is handed out before on() settles.
///
/// Order of calls, so that the tool never sees a block of one owner withdrawn by another: announce
/// a heap before cutting blocks from it and withdraw it before giving it back to the upstream;
/// announce a block after taking it (handed_out) and withdraw it before putting it back where
/// another thread may take it (coming_back).
/// Thread safety: thread-safe. Ownership: none (a view of the process's nvtx_memory).
class memory_annotations {
public:
    explicit memory_annotations(bool wanted) noexcept : wanted_(wanted) {}
    memory_annotations(const memory_annotations&) = delete;
    memory_annotations& operator=(const memory_annotations&) = delete;

    /// Whether this resource announces anything: wanted, and a tool listens.
    [[nodiscard]] bool on() const noexcept {
        if constexpr (nvtx_compiled) {
            return on_.load(std::memory_order_relaxed);
        } else {
            return false; // compiled out: no branch at all
        }
    }
    /// Whether the owner asked for annotations (a tool may still be absent).
    [[nodiscard]] bool wanted() const noexcept { return wanted_; }

    /// `size` bytes at `base`, just taken from the upstream: a heap named `name` (copied; the
    /// tools take printable ASCII, at most 49 characters). `whole`: the heap is one region end to end (see nvtx_memory).
    void heap_taken(const void* base, std::size_t size, std::string_view name, bool whole = false) noexcept {
        if (!wanted_) return;
        if (!on()) {
            if (!nvtx_memory::listening()) return;
            on_.store(true, std::memory_order_relaxed);
        }
        nvtx_memory::instance().add_heap(address(base), size, name, whole);
    }
    /// The heap at `base`, about to go back to the upstream. Blocks still in it (never given back)
    /// go with it: the tool may report them as leaks.
    void heap_returned(const void* base) noexcept {
        if (on()) [[unlikely]] static_cast<void>(nvtx_memory::instance().remove_heap(address(base)));
    }

    /// `bytes` at `p`, just handed out (p may be null: nothing was).
    [[gnu::always_inline]] void handed_out(const void* p, std::size_t bytes) noexcept {
        if (on()) [[unlikely]] announce(p, bytes);
    }
    /// The block at `p`, about to come back.
    [[gnu::always_inline]] void coming_back(const void* p) noexcept {
        if (on()) [[unlikely]] withdraw(p);
    }

    /// Names the block at `p` after its owner (the tracker's). Asks whether a tool listens at the
    /// first call: call it after the block was handed out by the upstream.
    void name(const void* p, std::string_view owner) noexcept {
        if (!wanted_ || p == nullptr) return;
        if (!nvtx_memory::listening()) return;
        nvtx_memory::instance().name(address(p), owner);
    }

private:
    static std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

    [[gnu::noinline]] static void announce(const void* p, std::size_t bytes) noexcept {
        if (p != nullptr) nvtx_memory::instance().add_region(address(p), bytes);
    }
    [[gnu::noinline]] static void withdraw(const void* p) noexcept {
        nvtx_memory::instance().remove_region(address(p));
    }

    std::atomic<bool> on_{false}; ///< wanted_ and a tool listens; set at the first heap, never reset
    const bool wanted_;
};

} // namespace custody::detail
