/// @file
/// `recording_resource`: an adaptor that records every allocate and deallocate of its upstream
/// into a trace::recorder, for replaying the program's allocations through other allocators.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/discarding.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/statistics.hpp>
#include <custody/trace/event.hpp>
#include <custody/trace/recorder.hpp>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace custody::trace {

/// Forwards every call to `Upstream` (held by value, constructed in place from the trailing
/// constructor arguments) and records it in a recorder: allocations that succeeded (after the
/// upstream returned), allocations that failed with out-of-memory (as allocation_failure, before
/// the exception propagates), and deallocations (before the upstream is called). Calls that do
/// nothing (0 bytes, a null pointer) and calls that throw std::invalid_argument are not events.
///
/// Each event carries the stream (Platform::stream_key; 0 for the synchronous pair, which acts on
/// the default stream), the device (the upstream's when it is bound to one, else the stream's),
/// the size, the alignment, the address, and with recorder_options::record_owner the thread's
/// owner_scope.
///
/// Stream semantics, errors, exception guarantees: the upstream's (the recording itself never
/// throws). Thread safety: as the upstream; the recorder is thread-safe.
/// Ownership: owns its upstream; the recorder is referenced and must outlive the adaptor.
/// Complexity: the upstream's, plus recorder::record (a few nanoseconds) per call.
/// Equality: identity.
template <stream_ordered_resource Upstream>
class recording_resource final {
public:
    using upstream_type = Upstream;
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;

    static constexpr const char* name = "recording_resource";

    template <class... Args>
    explicit recording_resource(recorder& into, Args&&... upstream_args)
        : upstream_(std::forward<Args>(upstream_args)...), recorder_(into), device_(bound_device()) {}

    recording_resource(const recording_resource&) = delete;
    recording_resource& operator=(const recording_resource&) = delete;

    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        void* p = nullptr;
        try {
            p = upstream_.allocate(stream, bytes, alignment);
        } catch (const std::bad_alloc&) {
            recorder_.record(event_kind::allocation_failure, key(stream), device_of(stream), bytes, alignment, nullptr);
            throw;
        }
        if (p != nullptr) recorder_.record(event_kind::allocate, key(stream), device_of(stream), bytes, alignment, p);
        return p;
    }

    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        recorder_.record(event_kind::deallocate, key(stream), device_of(stream), bytes, alignment, ptr);
        upstream_.deallocate(stream, ptr, bytes, alignment);
    }

    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        void* p = nullptr;
        try {
            p = upstream_.allocate_sync(bytes, alignment);
        } catch (const std::bad_alloc&) {
            recorder_.record(event_kind::allocation_failure, 0, device_of(stream_type{}), bytes, alignment, nullptr);
            throw;
        }
        if (p != nullptr) recorder_.record(event_kind::allocate, 0, device_of(stream_type{}), bytes, alignment, p);
        return p;
    }

    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        recorder_.record(event_kind::deallocate, 0, device_of(stream_type{}), bytes, alignment, ptr);
        upstream_.deallocate_sync(ptr, bytes, alignment);
    }

    /// Non-throwing allocate, for strategies that grow through this adaptor; a null answer to a
    /// non-empty request is recorded as allocation_failure.
    [[nodiscard]] void* try_allocate(stream_type stream, std::size_t bytes, std::size_t alignment) noexcept
        requires try_allocatable_resource<Upstream>
    {
        void* p = upstream_.try_allocate(stream, bytes, alignment);
        if (p != nullptr) {
            recorder_.record(event_kind::allocate, key(stream), device_of(stream), bytes, alignment, p);
        } else if (bytes != 0) {
            recorder_.record(event_kind::allocation_failure, key(stream), device_of(stream), bytes, alignment, nullptr);
        }
        return p;
    }

    [[nodiscard]] resource_statistics statistics() const
        requires resource_with_statistics<Upstream>
    {
        return upstream_.statistics();
    }

    /// The upstream's device (-1 for memory that belongs to no device).
    [[nodiscard]] int device() const noexcept
        requires device_bound_resource<Upstream>
    {
        return device_;
    }

    [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
    [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }
    [[nodiscard]] recorder& trace_recorder() const noexcept { return recorder_; }

    friend bool operator==(const recording_resource& a, const recording_resource& b) noexcept { return &a == &b; }
    CUSTODY_FORWARD_PROPERTIES(recording_resource, Upstream)
    CUSTODY_FORWARD_DISCARDING(Upstream, upstream_)

private:
    static std::uint64_t key(stream_type stream) noexcept { return platform_type::stream_key(stream); }

    int bound_device() const noexcept {
        if constexpr (device_bound_resource<Upstream>) {
            return static_cast<int>(upstream_.device());
        } else {
            return unbound;
        }
    }

    /// The upstream's device; for an upstream bound to none, the stream's (the current device for
    /// the default stream).
    std::int32_t device_of(stream_type stream) const noexcept {
        if (device_ != unbound) return device_;
        try {
            return platform_type::stream_device(stream);
        } catch (...) {
            return -1;
        }
    }

    static constexpr int unbound = -2;

    Upstream upstream_;
    recorder& recorder_;
    int device_; // the upstream's device, or `unbound`
};

} // namespace custody::trace
