/// @file
/// `resource_ref`: a type-erased, non-owning reference to a resource, for the places where a
/// resource's full type must not leak into every signature (a buffer's member, a function
/// parameter).
///
/// Ownership: the referenced resource must outlive the reference and everything allocated through
/// it. A reference cannot be bound to a temporary (that constructor is deleted), so the most
/// common way to dangle does not compile.
/// Thread safety: as the referenced resource. Copying a reference is two pointer copies.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/statistics.hpp>

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace custody {

/// A non-owning reference to a resource whose stream type is `Stream`; `resource_ref<void>`
/// (alias `synchronous_resource_ref`) references any synchronous resource and has no stream
/// operations.
template <class Stream>
class resource_ref {
    static constexpr bool stream_ordered = !std::is_void_v<Stream>;
    using stream_arg = std::conditional_t<stream_ordered, Stream, int>;

    struct operations {
        void* (*allocate_sync)(void*, std::size_t, std::size_t);
        void (*deallocate_sync)(void*, void*, std::size_t, std::size_t) noexcept;
        void* (*allocate)(void*, stream_arg, std::size_t, std::size_t);
        void (*deallocate)(void*, stream_arg, void*, std::size_t, std::size_t) noexcept;
        bool (*equal)(const void*, const void*) noexcept;
        resource_statistics (*statistics)(const void*);
        int (*device)(const void*);
    };

    template <class R>
    static constexpr bool accepts = [] {
        if constexpr (std::is_same_v<std::remove_cvref_t<R>, resource_ref>) {
            return false;
        } else if constexpr (stream_ordered) {
            if constexpr (stream_ordered_resource<R>) {
                return std::is_same_v<typename R::stream_type, Stream>;
            } else {
                return false;
            }
        } else {
            return synchronous_resource<R>;
        }
    }();

    template <class R>
    static constexpr operations operations_for{
        [](void* r, std::size_t n, std::size_t a) { return static_cast<R*>(r)->allocate_sync(n, a); },
        [](void* r, void* p, std::size_t n, std::size_t a) noexcept {
            static_cast<R*>(r)->deallocate_sync(p, n, a);
        },
        [](void* r, stream_arg s, std::size_t n, std::size_t a) -> void* {
            if constexpr (stream_ordered) {
                return static_cast<R*>(r)->allocate(s, n, a);
            } else {
                static_cast<void>(s);
                return static_cast<R*>(r)->allocate_sync(n, a);
            }
        },
        [](void* r, stream_arg s, void* p, std::size_t n, std::size_t a) noexcept {
            if constexpr (stream_ordered) {
                static_cast<R*>(r)->deallocate(s, p, n, a);
            } else {
                static_cast<void>(s);
                static_cast<R*>(r)->deallocate_sync(p, n, a);
            }
        },
        [](const void* a, const void* b) noexcept {
            return *static_cast<const R*>(a) == *static_cast<const R*>(b);
        },
        [](const void* r) -> resource_statistics {
            if constexpr (resource_with_statistics<R>) {
                return static_cast<const R*>(r)->statistics();
            } else {
                static_cast<void>(r);
                return {};
            }
        },
        [](const void* r) -> int {
            if constexpr (device_bound_resource<R>) {
                return static_cast<const R*>(r)->device();
            } else {
                static_cast<void>(r);
                return -1;
            }
        },
    };

public:
    using stream_type = Stream;

    /// Refers to `resource`, which must outlive this reference.
    template <class R>
        requires accepts<R>
    resource_ref(R& resource) noexcept // NOLINT(google-explicit-constructor): a reference converts
        : resource_(&resource), operations_(&operations_for<R>) {}

    /// Binding to a temporary would dangle at the end of the full expression: refused.
    template <class R>
        requires(!std::is_lvalue_reference_v<R> && !std::is_same_v<std::remove_cvref_t<R>, resource_ref>)
    resource_ref(R&&) = delete;

    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        return operations_->allocate_sync(resource_, bytes, alignment);
    }
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        operations_->deallocate_sync(resource_, ptr, bytes, alignment);
    }

    [[nodiscard]] void* allocate(stream_arg stream, std::size_t bytes, std::size_t alignment)
        requires stream_ordered
    {
        return operations_->allocate(resource_, stream, bytes, alignment);
    }
    void deallocate(stream_arg stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept
        requires stream_ordered
    {
        operations_->deallocate(resource_, stream, ptr, bytes, alignment);
    }

    /// The referenced resource's statistics, or all zeros if it keeps none.
    [[nodiscard]] resource_statistics statistics() const { return operations_->statistics(resource_); }

    /// The referenced resource's device, or -1 if it is bound to none.
    [[nodiscard]] int device() const { return operations_->device(resource_); }

    /// Two references are equal when they refer to resources of one type that compare equal.
    /// (A template, so that no conversion to resource_ref is ever tried while comparing.)
    template <class Ref>
        requires std::same_as<Ref, resource_ref>
    friend bool operator==(const Ref& a, const Ref& b) noexcept {
        if (a.resource_ == b.resource_) return true;
        return a.operations_ == b.operations_ && a.operations_->equal(a.resource_, b.resource_);
    }

private:
    void* resource_;
    const operations* operations_;
};

using synchronous_resource_ref = resource_ref<void>;

static_assert(synchronous_resource<synchronous_resource_ref>);

} // namespace custody
