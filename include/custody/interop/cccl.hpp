/// @file
/// `cccl_resource`: presents a custody resource through the CCCL `cuda::mr` resource concepts
/// shipped with the CUDA Toolkit, so that a custody pool can be handed to code that takes a
/// `cuda::mr` resource reference.
///
/// CCCL renamed its resource API in 3.1 (CUDA 13.1); this header speaks the spelling of the CCCL it
/// is compiled with, chosen by CCCL_VERSION:
///
///   CCCL 3.0 and older                          CCCL 3.1 and newer
///   allocate(bytes, alignment)                  allocate_sync(bytes, alignment)
///   deallocate(ptr, bytes, alignment)           deallocate_sync(ptr, bytes, alignment)
///   allocate_async(bytes, alignment, stream)    allocate(stream, bytes, alignment)
///   deallocate_async(ptr, bytes, alignment, s)  deallocate(stream, ptr, bytes, alignment)
///   concepts resource / async_resource          synchronous_resource / resource
///   refs resource_ref / async_resource_ref      synchronous_resource_ref / resource_ref
///
/// Tested: CCCL 3.0.1 (CUDA 13.0, compiled and run), 3.1.4 and 3.2.0 (compiled: the compile-time
/// checks of tests/interop/cccl_test.cpp against those headers).
///
/// Up to CCCL 3.1 the type-erased references are experimental: they exist only when
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

/// 1 when the CCCL in use has the 3.1 spelling (stream first, `_sync` for the synchronous pair).
#if CCCL_MAJOR_VERSION > 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION >= 1)
#define CUSTODY_CCCL_STREAM_FIRST 1
#else
#define CUSTODY_CCCL_STREAM_FIRST 0
#endif

namespace custody::interop {

/// The CCCL concepts under one name for either spelling: a stream-ordered resource with properties
/// `P...` (CCCL 3.0: async_resource_with; 3.1: resource_with), and a synchronous one (CCCL 3.0:
/// resource_with; 3.1: synchronous_resource_with).
#if CUSTODY_CCCL_STREAM_FIRST
template <class R, class... P>
concept cccl_stream_ordered_with = ::cuda::mr::resource_with<R, P...>;
template <class R, class... P>
concept cccl_synchronous_with = ::cuda::mr::synchronous_resource_with<R, P...>;
#else
template <class R, class... P>
concept cccl_stream_ordered_with = ::cuda::mr::async_resource_with<R, P...>;
template <class R, class... P>
concept cccl_synchronous_with = ::cuda::mr::resource_with<R, P...>;
#endif

/// A non-owning adaptor that gives a custody resource `R` the member signatures CCCL expects.
///
/// The libraries order arguments differently; the adaptor is the one place that translates:
///
///   CCCL 3.0 (cuda::mr)                           CCCL 3.1+                          custody
///   allocate(bytes, alignment)                    allocate_sync(bytes, alignment)    R::allocate_sync
///   deallocate(ptr, bytes, alignment)             deallocate_sync(ptr, bytes, al.)   R::deallocate_sync
///   allocate_async(bytes, alignment, stream_ref)  allocate(stream_ref, bytes, al.)   R::allocate
///   deallocate_async(ptr, bytes, al., stream_ref) deallocate(stream_ref, ptr, ...)   R::deallocate
///   get_property(r, cuda::mr::device_accessible)  declared iff has_property<R, device_accessible>
///   get_property(r, cuda::mr::host_accessible)    declared iff has_property<R, host_accessible>
///
/// The stream-ordered pair exists only when `R`'s streams are CUDA streams (`R::stream_type` is
/// `custody::cuda::stream_view`), so a cuda-platform resource is a stream-ordered CCCL resource
/// (`async_resource` in 3.0, `resource` in 3.1+); any other synchronous custody resource (host
/// memory, for example) is a synchronous one only (`resource` in 3.0, `synchronous_resource` in 3.1+).
///
/// Errors: custody's, unchanged (`custody::out_of_memory` is a `std::bad_alloc`, as CCCL expects;
/// a bad alignment is `std::invalid_argument`). The resource is unchanged after any exception.
/// Stream semantics: those of `R` (see its documentation); `stream_ref` is passed through as the
/// CUDA stream it names.
/// Thread safety: as `R`; the adaptor holds one pointer (copyable, as CCCL 3.2's references need).
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

#if CUSTODY_CCCL_STREAM_FIRST
    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        return resource_->allocate_sync(bytes, alignment);
    }
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        resource_->deallocate_sync(ptr, bytes, alignment);
    }
    [[nodiscard]] void* allocate(::cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
        requires cuda_streams
    {
        return resource_->allocate(custody::cuda::stream_view(stream.get()), bytes, alignment);
    }
    void deallocate(::cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept
        requires cuda_streams
    {
        resource_->deallocate(custody::cuda::stream_view(stream.get()), ptr, bytes, alignment);
    }
#else
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
#endif

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
