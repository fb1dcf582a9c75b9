/// @file
/// `chunked_growth`: how a pool grows over an upstream that cannot map memory (cudaMalloc, a driver
/// pool, pinned or host memory, another pool): in chunks taken from the upstream and given back
/// whole.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/chunk_map.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/growth.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/pool_statistics.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

namespace custody::pool::detail {

/// The alignment a pool asks its chunks with: the upstream's largest (when it declares one), at
/// most a page, at least the granule.
template <class Upstream>
[[nodiscard]] constexpr std::size_t chunk_alignment_of() noexcept {
    if constexpr (requires { Upstream::max_alignment; }) {
        return std::clamp<std::size_t>(Upstream::max_alignment, granule, custody::max_alignment);
    } else {
        return granule;
    }
}

/// Whether `Upstream`'s allocations are ordered on the stream they are asked on (a driver pool:
/// cudaMallocFromPoolAsync), which the upstream declares (`allocates_in_stream_order`): such a chunk
/// is usable by that stream only until the stream has run the allocation.
template <class Upstream>
inline constexpr bool allocates_in_stream_order = requires { requires Upstream::allocates_in_stream_order; };

/// Growth in chunks: each growth takes one chunk from the upstream (sized by the growth rule, or
/// exactly what the request needs when that is refused) into the free set of its kind; a chunk
/// that is wholly free goes back to the upstream whole. Blocks never cross a chunk's end, so a
/// large block takes the small free rest of its chunk along to its stream (keeps_tails), where the
/// two coalesce again when the block comes back.
///
/// A chunk of an upstream that allocates in stream order is taken on a stream of the growth's own
/// (made at the first growth, on the pool's device), and that stream is synchronized before the
/// chunk serves any stream (it runs nothing else, so the wait is the allocation's alone); other
/// upstreams' chunks are taken on the default stream, usable by every stream at once.
///
/// Invariant: chunks().reserved() = the bytes of the chunks held = what the upstream gave.
/// Thread safety: none of its own; the shared store calls it under its lock (the chunk map has its
/// own lock for readers). Ownership: holds the chunks; refers to the upstream, which outlives it.
template <stream_ordered_resource Upstream>
class chunked_growth {
public:
    using stream_type = typename Upstream::stream_type;
    static constexpr bool keeps_tails = true;
    static constexpr std::size_t chunk_alignment = chunk_alignment_of<Upstream>();

    /// Over `upstream`, announcing each chunk to CUDA's tools through `annotations` (both outlive it).
    chunked_growth(Upstream& upstream, const pool_options& options, int device,
                   custody::detail::memory_annotations& annotations)
        : upstream_(upstream), budget_(upstream, options, device), annotations_(annotations) {}

    [[nodiscard]] const chunk_map& chunks() const noexcept { return chunks_; }
    [[nodiscard]] std::size_t reserved() const noexcept { return chunks_.reserved(); }
    [[nodiscard]] std::size_t reserved(block_kind k) const noexcept { return chunks_.reserved(k); }
    [[nodiscard]] std::size_t peak_reserved() const noexcept { return chunks_.peak_reserved(); }
    [[nodiscard]] bool may_take(std::size_t n) const { return budget_.allows(n, chunks_.reserved()); }
    [[nodiscard]] const device_budget<Upstream>& budget() const noexcept { return budget_; }
    void set_maximum(std::size_t bytes) noexcept { budget_.set_maximum(bytes); }

    /// Takes a chunk of `kind` into `sets` so that a block of `size` at `alignment` fits: the growth
    /// rule's size, else exactly what the block needs. Its size follows the reserve of its own kind:
    /// small chunks sized by a reserve made of large ones would hold a few small blocks each in
    /// hundreds of megabytes. False when the limits or the upstream refuse. Strong.
    bool grow(per_kind<free_set>& sets, block_kind kind, std::size_t size, std::size_t alignment) {
        const std::size_t need = size + (alignment > chunk_alignment ? alignment - chunk_alignment : 0);
        const std::size_t preferred = budget_.rule().preferred_chunk(need, chunks_.reserved(kind));
        if (preferred != need && add_chunk(sets, kind, preferred)) return true;
        return add_chunk(sets, kind, need);
    }

    /// Takes exactly `n` bytes as one chunk of `kind` (the pool's initial size). Strong.
    bool grow_exactly(per_kind<free_set>& sets, block_kind kind, std::size_t n) { return add_chunk(sets, kind, n); }

    /// Gives every chunk that is wholly free in `sets` back to the upstream, then asks the upstream
    /// to give back what it retains; returns the bytes given back.
    std::size_t release(per_kind<free_set>& sets) noexcept {
        std::size_t released = 0;
        for (auto& set : sets) {
            const auto whole = [&](std::uintptr_t address, std::size_t size) { return chunks_.is_whole(address, size); };
            set.take_whole_chunks(whole, [&](const free_block& b) {
                chunks_.remove(b.address);
                annotations_.heap_returned(reinterpret_cast<void*>(b.address));
                upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(b.address), b.size, chunk_alignment);
                released += b.size;
            });
        }
        budget_.trim_upstream();
        return released;
    }

    /// Gives every chunk back to the upstream, free or not (the pool's end).
    void release_all() noexcept {
        chunks_.for_each([&](std::uintptr_t base, std::size_t size) {
            annotations_.heap_returned(reinterpret_cast<void*>(base));
            upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(base), size, chunk_alignment);
        });
    }

    /// The chunks and the upstream's calls and retained bytes, into `p`.
    void add_to(pool_statistics& p) const {
        p.chunks = chunks_.count();
        p.upstream_allocations = chunks_.added();
        p.upstream_deallocations = chunks_.removed();
        p.upstream_retained_bytes = budget_.upstream_retained();
    }

private:
    /// Takes exactly `n` bytes as a chunk of `kind` into its set. Strong.
    bool add_chunk(per_kind<free_set>& sets, block_kind kind, std::size_t n) {
        if (!may_take(n)) return false;
        void* p = take_ordered(n);
        if (p == nullptr) return false;
        const auto base = reinterpret_cast<std::uintptr_t>(p);
        try {
            chunks_.add(base, n, kind);
            try {
                sets[kind].insert({base, n, base, kind});
            } catch (...) {
                chunks_.remove(base);
                throw;
            }
        } catch (...) {
            upstream_.deallocate(stream_type{}, p, n, chunk_alignment);
            throw;
        }
        annotations_.heap_taken(p, n, "custody stream_ordered_pool");
        return true;
    }

    /// `n` bytes from the upstream, usable by every stream; nullptr when it has none. Throws what
    /// making or synchronizing the growth's stream throws (the memory given back first).
    void* take_ordered(std::size_t n) {
        if constexpr (allocates_in_stream_order<Upstream>) {
            return take_waited(upstream_, stream_, budget_.device(), n, chunk_alignment);
        } else {
            return custody::try_allocate(upstream_, stream_type{}, n, chunk_alignment);
        }
    }

    /// The stream of the growth's own, for an upstream that allocates in stream order.
    struct no_stream {};
    using growth_stream = std::conditional_t<allocates_in_stream_order<Upstream>,
                                             std::optional<typename stream_type::platform_type::stream>, no_stream>;

    Upstream& upstream_;
    device_budget<Upstream> budget_;
    custody::detail::memory_annotations& annotations_;
    chunk_map chunks_;
    [[no_unique_address]] growth_stream stream_; ///< made at the first growth
};

} // namespace custody::pool::detail
