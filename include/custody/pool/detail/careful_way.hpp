/// @file
/// `careful_way`: a stream_ordered_pool's calls that its common path does not serve: validation,
/// captures routed into private pools, checked mode and blocks announced to CUDA's tools, large
/// blocks, and the slow path through the seam; out_of_memory when nothing serves.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/error.hpp>
#include <custody/pool/detail/capture_store.hpp>
#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/covering.hpp>
#include <custody/pool/detail/live_blocks.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/seam.hpp>
#include <custody/pool/detail/shared_store.hpp>
#include <custody/pool/detail/stream_caches.hpp>
#include <custody/pool/pool_misuse.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/pool_statistics.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace custody::pool::detail {

/// The parts of a pool over `Upstream` that the careful way uses, all the pool's (which outlive it).
template <stream_ordered_resource Upstream>
struct pool_parts {
    const pool_options& options;
    int device;
    custody::detail::memory_annotations& annotations;
    activity_counters& activity;
    shared_store<Upstream>& store;
    stream_caches<Upstream>& front;
    covering<Upstream>& cover;
    seam<Upstream>& ladder;
    capture_store<Upstream>& captures;
    const std::atomic<std::size_t>& request_limit; ///< larger requests fail at once (limits, budget)
    /// The pool's figures, for out_of_memory's message: `figures(owner)`.
    pool_statistics (*figures)(const void* owner);
    const void* owner;
};

/// The careful way of a pool over `Upstream`.
///
/// A watched pool (checked, or announcing blocks to CUDA's tools) comes here for every call its
/// common path does not serve: a checked pool's common path records its blocks itself
/// (stream_caches::pop_checked); here they are recorded in the pool-wide table, room made first.
/// Thread safety: as the pool's. Ownership: refers to the pool's parts.
template <stream_ordered_resource Upstream>
class careful_way {
public:
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;

    explicit careful_way(const pool_parts<Upstream>& parts) noexcept
        : p_(parts), watched_(parts.options.checked || parts.annotations.on()) {}
    careful_way(const careful_way&) = delete;
    careful_way& operator=(const careful_way&) = delete;

    /// allocate, when the common path did not serve it.
    void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (!watched_) [[likely]] return take(stream, bytes, alignment);
        void* ptr = p_.options.checked ? allocate_checked(stream, bytes, alignment) : take_own(stream, bytes, alignment);
        p_.annotations.handed_out(ptr, bytes); // once the block is this call's alone
        return ptr;
    }
    /// deallocate, when the common path did not serve it.
    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        if (!watched_) [[likely]] return give(stream, ptr, bytes, alignment);
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        if (p_.options.checked && !p_.front.forget_live(address, bytes, alignment)) [[unlikely]] {
            return refuse(stream, address, bytes, alignment);
        }
        p_.annotations.coming_back(ptr); // while the block is still this call's alone
        if (!p_.options.checked && bytes - 1 < small_threshold && !p_.captures.watching() && !p_.captures.owns(address)) {
            if (p_.front.push_found(p_.front.key_of(stream), address, bytes)) return;
        }
        give(stream, ptr, bytes, alignment);
    }

    /// A block for `bytes` at `alignment` on `stream`: validated, from the capture's private pool
    /// when a route claims the stream, else through the seam. Throws std::invalid_argument (a bad
    /// alignment, a stream of another device), capture_error, out_of_memory; the pool is unchanged
    /// after any of them.
    void* take(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (!is_pow2(alignment) || alignment > custody::max_alignment) [[unlikely]] check_alignment(alignment, custody::max_alignment);
        if (bytes == 0) return nullptr;
        if (bytes > p_.request_limit.load(std::memory_order_relaxed)) [[unlikely]] {
            p_.activity.count(p_.activity.failures);
            throw_out_of_memory(bytes, alignment, "the request exceeds the pool's limits");
        }
        if (p_.captures.watching()) [[unlikely]] {
            try {
                if (void* ptr = p_.captures.allocate(stream, bytes, alignment)) return ptr;
            } catch (const out_of_memory&) { // a private pool that cannot grow: counted as every failure is
                p_.activity.count(p_.activity.failures);
                throw;
            }
        }
        const char* why = nullptr;
        if (void* ptr = p_.ladder.take(stream, classify(bytes, alignment), p_.captures.routing(), why)) return ptr;
        p_.activity.count(p_.activity.failures);
        throw_out_of_memory(bytes, alignment, why == nullptr ? std::string_view{} : std::string_view{why});
    }

    /// Gives `ptr` back on `stream`: to its private pool, quarantined when the stream is being
    /// captured, else to the stream's shard (covering::give_back).
    void give(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        const request r = classify(bytes, alignment);
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        if (p_.captures.owns(address)) [[unlikely]] {
            p_.captures.deallocate(stream, address, bytes);
        } else if (p_.captures.watching() && p_.captures.capturing(stream)) [[unlikely]] {
            p_.store.quarantine(r.size);
            p_.front.count_given_without_shard(r);
        } else {
            p_.cover.give_back(stream, p_.front.key_of(stream), address, r);
        }
    }

    /// out_of_memory for `bytes` at `alignment`, saying `reason`, the limits and where the memory is.
    [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::size_t alignment, std::string_view reason) const {
        const pool_statistics s = p_.figures(p_.owner);
        std::string d(reason);
        for (const std::string& part : {p_.store.describe_limits(bytes), s.describe()}) {
            if (!part.empty()) d += (d.empty() ? "" : "; ") + part;
        }
        throw out_of_memory(bytes, alignment, p_.device, s.totals, "stream_ordered_pool", d);
    }

private:
    /// take, the block recorded among the live ones (room made first: a bad_alloc takes no block;
    /// room too in the stream's own table, for the common path's next blocks).
    void* allocate_checked(stream_type stream, std::size_t bytes, std::size_t alignment) {
        live_blocks& live = p_.front.live();
        p_.front.reserve_live(p_.front.key_of(stream));
        live.reserve_one();
        void* ptr = nullptr;
        try {
            ptr = take(stream, bytes, alignment);
        } catch (...) {
            live.unreserve();
            throw;
        }
        if (ptr == nullptr) [[unlikely]] {
            live.unreserve();
        } else {
            live.add(reinterpret_cast<std::uintptr_t>(ptr), bytes, alignment);
        }
        return ptr;
    }
    /// For a pool that announces blocks (its common path is off): the stream's hot stack when no
    /// capture is watched, else take.
    void* take_own(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (bytes - 1 < small_threshold && fits_granule(alignment) && !p_.captures.watching()) {
            void* ptr = nullptr;
            if (p_.front.pop_found(p_.front.key_of(stream), bytes, ptr)) return ptr;
        }
        return take(stream, bytes, alignment);
    }
    /// Reports a deallocate that matches no live block (the pool is left as it was).
    [[gnu::noinline, gnu::cold]] void refuse(stream_type stream, std::uintptr_t address, std::size_t bytes,
                                             std::size_t alignment) noexcept {
        misuse m = p_.front.misuse_of({.address = address, .bytes = bytes, .alignment = alignment},
                                     [&](std::uintptr_t a) { return p_.store.chunks().find(a).size != 0; });
        m.stream_key = platform_type::stream_key(stream); // asked only for the report
        live_blocks::report(m, p_.options.on_misuse);
        p_.activity.count(p_.activity.misuses);
    }

    pool_parts<Upstream> p_;
    const bool watched_; ///< options.checked || annotations.on()
};

} // namespace custody::pool::detail
