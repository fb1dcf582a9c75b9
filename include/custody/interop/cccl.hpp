/// @file
/// `cccl_resource`: presents a custody resource through the CCCL `cuda::mr` resource concepts
/// shipped with the CUDA Toolkit, so that a custody pool can be handed to code that takes a
/// `cuda::mr::resource_ref` or `cuda::mr::async_resource_ref`.
///
/// CCCL's memory resources are experimental in the toolkit: they exist only when
/// LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE is defined before the first CCCL header is
/// included. This header defines it when it is the first; a translation unit that includes CCCL
/// headers earlier must define it itself (on the command line is simplest).
#pragma once

#ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif

#include <custody/core/concepts.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/cuda.hpp>

#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace custody::interop {

/// A non-owning adaptor that gives a custody resource `R` the member signatures CCCL expects.
///
/// The two libraries order arguments differently; the adaptor is the one place that translates:
///
///   CCCL (cuda::mr)                                  custody
///   allocate(bytes, alignment)                       R::allocate_sync(bytes, alignment)
///   deallocate(ptr, bytes, alignment)                R::deallocate_sync(ptr, bytes, alignment)
///   allocate_async(bytes, alignment, stream_ref)     R::allocate(stream, bytes, alignment)
///   deallocate_async(ptr, bytes, alignment, stream)  R::deallocate(stream, ptr, bytes, alignment)
///   get_property(r, cuda::mr::device_accessible)     declared iff has_property<R, device_accessible>
///   get_property(r, cuda::mr::host_accessible)       declared iff has_property<R, host_accessible>
///
/// The asynchronous pair exists only when `R`'s streams are CUDA streams (`R::stream_type` is
/// `custody::cuda::stream_view`), so a cuda-platform resource is a `cuda::mr::async_resource`;
/// any other synchronous custody resource (host memory, for example) is a `cuda::mr::resource`.
///
/// Errors: custody's, unchanged (`custody::out_of_memory` is a `std::bad_alloc`, as CCCL expects;
/// a bad alignment is `std::invalid_argument`). The resource is unchanged after any exception.
/// Stream semantics: those of `R` (see its documentation); `stream_ref` is passed through as the
/// CUDA stream it names.
/// Thread safety: as `R`; the adaptor holds one pointer.
/// Ownership: non-owning. `R` must outlive the adaptor, every `cuda::mr` reference made from it
/// and every block allocated through it; binding to a temporary does not compile.
/// Equality: two adaptors are equal when their resources compare equal.
/// Complexity: one call to `R`.
template <synchronous_resource R>
class cccl_resource {
    static constexpr bool cuda_streams = [] {
        if constexpr (stream_ordered_resource<R>) {
            return std::is_same_v<typename R::stream_type, custody::cuda::stream_view>;
        } else {
            return false;
        }
    }();

public:
    using resource_type = R;

    /// Adapts `resource`, which must outlive the adaptor.
    explicit cccl_resource(R& resource) noexcept : resource_(&resource) {}
    explicit cccl_resource(R&&) = delete;

    /// The adapted resource.
    [[nodiscard]] R& upstream_resource() const noexcept { return *resource_; }

    [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment) {
        return resource_->allocate_sync(bytes, alignment);
    }
    void deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        resource_->deallocate_sync(ptr, bytes, alignment);
    }

    [[nodiscard]] void* allocate_async(std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream)
        requires cuda_streams
    {
        return resource_->allocate(custody::cuda::stream_view(stream.get()), bytes, alignment);
    }
    void deallocate_async(void* ptr, std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) noexcept
        requires cuda_streams
    {
        resource_->deallocate(custody::cuda::stream_view(stream.get()), ptr, bytes, alignment);
    }

    friend bool operator==(const cccl_resource& a, const cccl_resource& b) noexcept {
        return a.resource_ == b.resource_ || *a.resource_ == *b.resource_;
    }
    friend bool operator!=(const cccl_resource& a, const cccl_resource& b) noexcept { return !(a == b); }

    friend void get_property(const cccl_resource&, ::cuda::mr::device_accessible) noexcept
        requires has_property<R, custody::device_accessible>
    {}
    friend void get_property(const cccl_resource&, ::cuda::mr::host_accessible) noexcept
        requires has_property<R, custody::host_accessible>
    {}

private:
    R* resource_; // != nullptr
};

/// Makes the adaptor for `resource` (which must outlive it).
template <synchronous_resource R>
[[nodiscard]] cccl_resource<R> as_cccl(R& resource) noexcept {
    return cccl_resource<R>(resource);
}

} // namespace custody::interop
