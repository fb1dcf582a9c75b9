/// @file
/// The part every leaf resource shares: argument checks, the zero-size and null rules, exact
/// statistics and typed exhaustion, written once over a resource's raw allocate/free.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/error.hpp>
#include <custody/core/statistics.hpp>

#include <cstddef>

namespace custody::resource::detail {

/// Base of the leaf resources (CRTP). `Derived` provides, all of them noexcept except where said:
///
///   static constexpr const char* name;            for messages
///   static constexpr std::size_t max_alignment;   largest alignment it accepts
///   void* raw_allocate(stream_type, bytes, alignment)              nullptr when exhausted
///   void  raw_deallocate(stream_type, ptr, bytes, alignment) noexcept
///   void* raw_allocate_sync(bytes, alignment)                      nullptr when exhausted
///   void  raw_deallocate_sync(ptr, bytes, alignment) noexcept
///
/// Raw functions run under the resource's device (the derived class guards), see only bytes > 0,
/// valid alignments and non-null pointers, and leave nothing behind when they return nullptr or
/// throw. Exhaustion is nullptr; any other failure (a broken driver) throws custody::cuda_error,
/// which try_allocate turns into nullptr.
///
/// Thread safety: as Derived's raw functions; the statistics are lock-free.
/// Equality: two leaves are equal when they are the same object, or when `Derived::interchangeable`
/// and they are bound to the same device (memory from one may be given back to the other).
///
/// Statistics are per instance: what went through this object.
///   allocations   = allocation calls this instance served (exact, never decreases)
///   deallocations = non-null blocks given back through this instance (exact, never decreases)
///   live_bytes    = bytes handed out here - bytes given back here, never below 0
///   reserved_bytes == live_bytes (a leaf holds nothing beyond its live blocks)
/// The live figures are exact while each block comes back to the instance that handed it out. A
/// block given back to another, equal instance lowers that instance's live figures down to zero at
/// most (they never wrap) and leaves the giver's as they were: neither can know where the block was
/// counted. Code that moves blocks between equal leaves and reads their statistics should read the
/// allocation and deallocation counts, or keep one instance per device.
template <class Derived, class Platform>
class leaf {
public:
    using platform_type = Platform;
    using stream_type = typename Platform::stream_view;

    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        check_alignment(alignment, Derived::max_alignment);
        if (bytes == 0) return nullptr;
        void* ptr = self().raw_allocate(stream, bytes, alignment);
        if (ptr == nullptr) throw_out_of_memory(bytes, alignment);
        stats_.on_allocate(bytes, bytes);
        return ptr;
    }

    /// Non-throwing allocate for strategies that grow through this resource. Precondition: the
    /// alignment passed check_alignment.
    [[nodiscard]] void* try_allocate(stream_type stream, std::size_t bytes, std::size_t alignment) noexcept {
        if (bytes == 0 || alignment > Derived::max_alignment) return nullptr;
        void* ptr = nullptr;
        try {
            ptr = self().raw_allocate(stream, bytes, alignment);
        } catch (...) {
            return nullptr;
        }
        if (ptr != nullptr) stats_.on_allocate(bytes, bytes);
        return ptr;
    }

    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        self().raw_deallocate(stream, ptr, bytes, alignment);
        stats_.on_deallocate(bytes, bytes);
    }

    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        check_alignment(alignment, Derived::max_alignment);
        if (bytes == 0) return nullptr;
        void* ptr = self().raw_allocate_sync(bytes, alignment);
        if (ptr == nullptr) throw_out_of_memory(bytes, alignment);
        stats_.on_allocate(bytes, bytes);
        return ptr;
    }

    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        self().raw_deallocate_sync(ptr, bytes, alignment);
        stats_.on_deallocate(bytes, bytes);
    }

    [[nodiscard]] resource_statistics statistics() const noexcept { return stats_.snapshot(); }

    /// The device this resource is bound to; -1 for memory that belongs to no device.
    [[nodiscard]] int device() const noexcept { return device_; }

    friend bool operator==(const Derived& a, const Derived& b) noexcept {
        if (&a == &b) return true;
        if constexpr (Derived::interchangeable) {
            return a.device() == b.device();
        } else {
            return false;
        }
    }

    leaf(const leaf&) = delete;
    leaf& operator=(const leaf&) = delete;

protected:
    explicit leaf(int device) noexcept : device_(device) {}
    ~leaf() = default;

    [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::size_t alignment) const {
        throw out_of_memory(bytes, alignment, device_, stats_.snapshot(), Derived::name);
    }

private:
    Derived& self() noexcept { return static_cast<Derived&>(*this); }

    int device_;
    statistics_counter stats_;
};

} // namespace custody::resource::detail
