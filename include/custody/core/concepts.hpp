/// @file
/// The resource concepts: what a custody resource is, and the one argument order every resource
/// uses, written down here once and never changed.
///
/// The argument order (the one the newest CCCL and RMM settled on: stream first, then bytes, then
/// alignment):
///
///     void* allocate       (stream, bytes, alignment);             // stream-ordered
///     void  deallocate     (stream, ptr, bytes, alignment) noexcept;
///     void* allocate_sync  (bytes, alignment);                     // synchronous
///     void  deallocate_sync(ptr, bytes, alignment) noexcept;
///     void* try_allocate   (stream, bytes, alignment) noexcept;    // optional: nullptr when exhausted
///
/// Contract (checked for every resource by tests/contract):
///  - Memory returned by allocate on stream s may be used by work enqueued on s after the call.
///    Memory given back on s may be reused by work ordered after everything already enqueued on s.
///    The synchronous pair behaves as if on a stream that is always idle: the memory is usable at
///    once and may be reused at once after deallocate_sync returns.
///  - bytes == 0 returns nullptr; giving back nullptr does nothing.
///  - An alignment that is not a power of two, or above the resource's maximum, throws
///    std::invalid_argument. Exhaustion throws custody::out_of_memory. After any exception the
///    resource is exactly as before.
///  - deallocate takes the same bytes and alignment the block was allocated with.
///  - Resources are thread-safe unless their name says otherwise.
#pragma once

// custody needs C++20 or later (concepts, std::span, std::atomic::wait); say so before the first
// concept fails to parse. (MSVC reports __cplusplus as 199711L unless /Zc:__cplusplus: it has
// _MSVC_LANG.)
#if defined(_MSVC_LANG) && _MSVC_LANG < 202002L
#error "custody needs C++20 or later: compile with /std:c++20 (or a later standard)"
#elif !defined(_MSVC_LANG) && __cplusplus < 202002L
#error "custody needs C++20 or later: compile with -std=c++20 (or a later standard)"
#endif

#include <custody/core/statistics.hpp>

#include <concepts>
#include <cstddef>
#include <new>
#include <type_traits>

namespace custody {

/// A resource that allocates and frees synchronously.
template <class R>
concept synchronous_resource = std::equality_comparable<R> &&
    requires(R& r, void* ptr, std::size_t bytes, std::size_t alignment) {
        { r.allocate_sync(bytes, alignment) } -> std::same_as<void*>;
        { r.deallocate_sync(ptr, bytes, alignment) } noexcept -> std::same_as<void>;
    };

/// A resource whose allocations are ordered on streams of its platform (`R::stream_type`).
template <class R>
concept stream_ordered_resource = synchronous_resource<R> &&
    requires(R& r, typename R::stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) {
        { r.allocate(stream, bytes, alignment) } -> std::same_as<void*>;
        { r.deallocate(stream, ptr, bytes, alignment) } noexcept -> std::same_as<void>;
    };

/// A stream-ordered resource with a non-throwing allocation that returns nullptr when exhausted.
/// Strategies grow through it so that running out of memory never steers control flow through
/// exceptions. Its precondition: `alignment` already passed check_alignment.
template <class R>
concept try_allocatable_resource = stream_ordered_resource<R> &&
    requires(R& r, typename R::stream_type stream, std::size_t bytes, std::size_t alignment) {
        { r.try_allocate(stream, bytes, alignment) } noexcept -> std::same_as<void*>;
    };

/// A resource that reports its statistics.
template <class R>
concept resource_with_statistics = requires(const R& r) {
    { r.statistics() } -> std::same_as<resource_statistics>;
};

/// A resource bound to one device (-1 for memory that belongs to no device).
template <class R>
concept device_bound_resource = requires(const R& r) {
    { r.device() } -> std::convertible_to<int>;
};

/// Calls r.try_allocate when the resource has one; otherwise calls allocate and turns an
/// out-of-memory exception into nullptr. Other exceptions propagate.
template <stream_ordered_resource R>
[[nodiscard]] void* try_allocate(R& r, typename R::stream_type stream, std::size_t bytes,
                                 std::size_t alignment) noexcept(try_allocatable_resource<R>) {
    if constexpr (try_allocatable_resource<R>) {
        return r.try_allocate(stream, bytes, alignment);
    } else {
        try {
            return r.allocate(stream, bytes, alignment);
        } catch (const std::bad_alloc&) {
            return nullptr;
        }
    }
}

} // namespace custody
