/// @file
/// `fault_injecting`: an adaptor that makes its upstream fail on purpose, on the Nth allocation or
/// above a byte budget, to test everything built above it.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace custody::resource {

/// Forwards to `Upstream` (held by value, constructed in place from the constructor's arguments)
/// and fails allocations on demand with the same typed error as real exhaustion
/// (custody::out_of_memory from allocate, nullptr from try_allocate):
///
///  - fail_at(n): the n-th allocation call from now (1 = the next) fails; with `repeat`, every
///    allocation from then on fails until disarm().
///  - set_byte_budget(b): any allocation that would bring the bytes live through this adaptor
///    above b fails.
///
/// Failed calls change nothing in the upstream. Every allocation call (allocate, allocate_sync,
/// try_allocate with bytes > 0) counts, failed or not.
/// Thread safety: as the upstream; the fault state is atomic.
/// Equality: identity.
template <stream_ordered_resource Upstream>
class fault_injecting final {
public:
    using stream_type = typename Upstream::stream_type;

    template <class... Args>
    explicit fault_injecting(Args&&... upstream_args) : upstream_(std::forward<Args>(upstream_args)...) {}
    fault_injecting(const fault_injecting&) = delete;
    fault_injecting& operator=(const fault_injecting&) = delete;

    /// Makes the n-th allocation call from now fail (n >= 1); with `repeat`, all later ones too.
    void fail_at(std::uint64_t n, bool repeat = false) noexcept {
        fail_at_.store(calls_.load() + n);
        repeat_.store(repeat);
    }
    /// Makes allocations fail once the live bytes through this adaptor would exceed `bytes`.
    void set_byte_budget(std::size_t bytes) noexcept { budget_.store(bytes); }
    /// Stops injecting failures.
    void disarm() noexcept {
        fail_at_.store(0);
        repeat_.store(false);
        budget_.store(SIZE_MAX);
    }
    /// Allocation calls seen so far, and how many of them were failed on purpose.
    [[nodiscard]] std::uint64_t calls() const noexcept { return calls_.load(); }
    [[nodiscard]] std::uint64_t injected_failures() const noexcept { return injected_.load(); }

    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        check_alignment(alignment, SIZE_MAX);
        if (bytes == 0) return upstream_.allocate(stream, bytes, alignment);
        if (inject(bytes)) throw_injected(bytes, alignment);
        return admit(bytes, [&] { return upstream_.allocate(stream, bytes, alignment); });
    }
    [[nodiscard]] void* try_allocate(stream_type stream, std::size_t bytes, std::size_t alignment) noexcept {
        if (bytes == 0) return nullptr;
        if (inject(bytes)) return nullptr;
        return admit(bytes, [&]() noexcept { return custody::try_allocate(upstream_, stream, bytes, alignment); });
    }
    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        upstream_.deallocate(stream, ptr, bytes, alignment);
        live_.fetch_sub(bytes);
    }
    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        check_alignment(alignment, SIZE_MAX);
        if (bytes == 0) return upstream_.allocate_sync(bytes, alignment);
        if (inject(bytes)) throw_injected(bytes, alignment);
        return admit(bytes, [&] { return upstream_.allocate_sync(bytes, alignment); });
    }
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        upstream_.deallocate_sync(ptr, bytes, alignment);
        live_.fetch_sub(bytes);
    }

    [[nodiscard]] resource_statistics statistics() const
        requires resource_with_statistics<Upstream>
    {
        return upstream_.statistics();
    }
    [[nodiscard]] int device() const
        requires device_bound_resource<Upstream>
    {
        return upstream_.device();
    }
    [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
    [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }

    friend bool operator==(const fault_injecting& a, const fault_injecting& b) noexcept { return &a == &b; }
    CUSTODY_FORWARD_PROPERTIES(fault_injecting, Upstream)

private:
    bool inject(std::size_t bytes) noexcept {
        const std::uint64_t call = calls_.fetch_add(1) + 1;
        const std::uint64_t target = fail_at_.load();
        bool fail = target != 0 && (call == target || (repeat_.load() && call > target));
        if (!fail && live_.load() + bytes > budget_.load()) fail = true;
        if (fail) injected_.fetch_add(1);
        return fail;
    }

    template <class Allocate>
    void* admit(std::size_t bytes, Allocate&& allocate) {
        void* ptr = std::forward<Allocate>(allocate)();
        if (ptr != nullptr) live_.fetch_add(bytes);
        return ptr;
    }

    [[noreturn]] void throw_injected(std::size_t bytes, std::size_t alignment) const {
        resource_statistics stats{};
        if constexpr (resource_with_statistics<Upstream>) stats = upstream_.statistics();
        int device = -1;
        if constexpr (device_bound_resource<Upstream>) device = upstream_.device();
        throw out_of_memory(bytes, alignment, device, stats, "fault_injecting", "failure injected on purpose");
    }

    Upstream upstream_;
    std::atomic<std::uint64_t> calls_{0};
    std::atomic<std::uint64_t> fail_at_{0}; // 0: not armed
    std::atomic<bool> repeat_{false};
    std::atomic<std::size_t> budget_{SIZE_MAX};
    std::atomic<std::size_t> live_{0};
    std::atomic<std::uint64_t> injected_{0};
};

} // namespace custody::resource
