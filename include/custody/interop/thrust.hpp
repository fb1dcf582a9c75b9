/// @file
/// `thrust_allocator`: a Thrust allocator over a custody resource, so that
/// `thrust::device_vector<T, thrust_allocator<T, R>>` (and Thrust's temporary storage, through
/// `thrust::cuda::par(alloc)`) draws from a custody pool.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>

#include <thrust/device_malloc_allocator.h>
#include <thrust/device_ptr.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <new>

namespace custody::interop {

/// An allocator of `T` for Thrust's device containers, over the stream-ordered custody resource `R`.
///
/// allocate(n) is `R::allocate(stream, n * sizeof(T), alignment)` and deallocate(p, n) is
/// `R::deallocate(stream, p, n * sizeof(T), alignment)`, where `stream` is the stream given at
/// construction (the platform's default stream if none) and
/// `alignment = max(alignof(T), custody::default_alignment)`. The pointer type is Thrust's
/// `device_ptr<T>` of the configured device system, so containers dispatch their algorithms there.
///
/// Stream semantics: every allocation and deallocation is ordered on the allocator's stream.
/// Thrust's container operations run on the default stream unless a policy says otherwise; run them
/// on the same stream (`thrust::cuda::par.on(stream)`) or synchronize, as with any stream-ordered
/// allocator.
/// Errors: `n * sizeof(T)` overflowing is `std::bad_array_new_length`; exhaustion is
/// `custody::out_of_memory` (a `std::bad_alloc`). Thrust's containers give the strong guarantee on
/// top of that.
/// Thread safety: as `R`; an allocator is a pointer and a stream, copied freely.
/// Ownership: non-owning. `R` must outlive the allocator, its copies and every container using it.
/// Equality: equal when the resources compare equal and the streams are the same.
template <class T, stream_ordered_resource R>
class thrust_allocator : public thrust::device_malloc_allocator<T> {
    using base = thrust::device_malloc_allocator<T>;

public:
    using value_type = T;
    using pointer = typename base::pointer;
    using size_type = typename base::size_type;
    using stream_type = typename R::stream_type;
    using resource_type = R;

    /// The alignment every block is allocated with.
    static constexpr std::size_t alignment = std::max(alignof(T), default_alignment);

    template <class U>
    struct rebind {
        using other = thrust_allocator<U, R>;
    };

    /// Allocates from `resource` (which must outlive the allocator) on `stream`.
    explicit thrust_allocator(R& resource, stream_type stream = stream_type{}) noexcept
        : resource_(&resource), stream_(stream) {}
    explicit thrust_allocator(R&&, stream_type = stream_type{}) = delete;

    template <class U>
    thrust_allocator(const thrust_allocator<U, R>& other) noexcept // NOLINT: rebinding converts
        : resource_(&other.resource()), stream_(other.stream()) {}

    [[nodiscard]] pointer allocate(size_type n) {
        if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
        return pointer(static_cast<T*>(resource_->allocate(stream_, n * sizeof(T), alignment)));
    }

    void deallocate(pointer p, size_type n) noexcept {
        resource_->deallocate(stream_, static_cast<void*>(thrust::raw_pointer_cast(p)), n * sizeof(T), alignment);
    }

    [[nodiscard]] R& resource() const noexcept { return *resource_; }
    [[nodiscard]] stream_type stream() const noexcept { return stream_; }

    template <class U>
    friend bool operator==(const thrust_allocator& a, const thrust_allocator<U, R>& b) noexcept {
        return a.stream_ == b.stream() && (a.resource_ == &b.resource() || *a.resource_ == b.resource());
    }

private:
    R* resource_; // != nullptr
    stream_type stream_;
};

} // namespace custody::interop
