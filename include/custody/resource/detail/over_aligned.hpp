/// @file
/// Alignments above what an allocator guarantees, for host-accessible memory: over-allocate, align
/// inside the block, and keep the allocator's pointer in the word before the aligned one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace custody::resource::detail {

/// How an allocator that guarantees `guaranteed`-byte alignment serves stronger alignments.
/// `guaranteed` and every alignment are powers of two, guaranteed >= sizeof(void*).
///
///   extra(a)      = 0 when a <= guaranteed, else a      (bytes requested beyond the caller's)
///   place(base,a) = base when a <= guaranteed, else the first multiple of a in (base, base + a],
///                   with base stored in the word just before it
///   base_of(p,a)  = the pointer place() was given
///
/// Invariant for a > guaranteed: base < place(base, a) <= base + a, so the block
/// [place, place + bytes) lies within [base, base + bytes + a), and the stored word lies in
/// [base, place). The memory must be host-accessible (the word is written by the host).
template <std::size_t guaranteed>
struct over_aligned {
    static_assert(guaranteed >= sizeof(void*) && (guaranteed & (guaranteed - 1)) == 0);

    [[nodiscard]] static constexpr std::size_t extra(std::size_t alignment) noexcept {
        return alignment <= guaranteed ? 0 : alignment;
    }

    [[nodiscard]] static void* place(void* base, std::size_t alignment) noexcept {
        if (alignment <= guaranteed) return base;
        const auto address = reinterpret_cast<std::uintptr_t>(base);
        const std::uintptr_t aligned = (address + alignment) & ~(std::uintptr_t{alignment} - 1);
        std::memcpy(reinterpret_cast<void*>(aligned - sizeof(void*)), &base, sizeof base);
        return reinterpret_cast<void*>(aligned);
    }

    [[nodiscard]] static void* base_of(void* block, std::size_t alignment) noexcept {
        if (alignment <= guaranteed) return block;
        void* base = nullptr;
        std::memcpy(&base, reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(block) - sizeof(void*)), sizeof base);
        return base;
    }
};

} // namespace custody::resource::detail
