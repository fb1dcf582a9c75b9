/// @file
/// `pmr_adaptor`: a `std::pmr::memory_resource` over a host-accessible custody resource, so that
/// `std::pmr` containers (vector, string, map...) can draw from host, pinned or managed memory.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/properties.hpp>

#include <cstddef>
#include <memory_resource>
#include <type_traits>

namespace custody::interop {

/// A `std::pmr::memory_resource` that forwards to the synchronous pair of a custody resource `R`:
/// `allocate(bytes, alignment)` is `R::allocate_sync(bytes, alignment)`, and
/// `deallocate(p, bytes, alignment)` is `R::deallocate_sync(p, bytes, alignment)`.
///
/// Only host-accessible resources are accepted (a `std::pmr` container dereferences its memory on
/// the host): `R` must declare `get_property(r, host_accessible)`. Passing device-only memory is a
/// compile error.
///
/// Mapping of the contract:
///  - A request of 0 bytes is served as 1 byte (std::pmr requires a distinct non-null pointer;
///    custody returns nullptr for 0) and given back with the same rounding.
///  - Exhaustion propagates as `custody::out_of_memory`, which is a `std::bad_alloc`.
///  - An alignment that is not a power of two, or above `R`'s maximum, propagates as
///    `std::invalid_argument`; the resource is unchanged.
///
/// Stream semantics: none; memory is usable at once and reusable once deallocate returns.
/// Thread safety: as `R` (the adaptor itself holds one pointer and no state).
/// Ownership: non-owning. `R` must outlive the adaptor and every block allocated through it;
/// binding to a temporary does not compile.
/// Equality: equal to another `pmr_adaptor<R>` whose resources compare equal (so memory allocated
/// through one may be freed through the other), never to any other memory_resource.
/// Complexity: one call to `R` per allocation, plus a virtual call.
template <synchronous_resource R>
class pmr_adaptor final : public std::pmr::memory_resource {
    static_assert(has_property<R, host_accessible>,
                  "custody::interop::pmr_adaptor needs a host-accessible resource: std::pmr containers "
                  "touch their memory on the host");

public:
    using resource_type = R;

    /// Adapts `resource`, which must outlive the adaptor.
    explicit pmr_adaptor(R& resource) noexcept : resource_(&resource) {}
    explicit pmr_adaptor(R&&) = delete;

    pmr_adaptor(const pmr_adaptor&) noexcept = default;
    pmr_adaptor& operator=(const pmr_adaptor&) noexcept = default;
    ~pmr_adaptor() override = default;

    /// The adapted resource.
    [[nodiscard]] R& upstream_resource() const noexcept { return *resource_; }

private:
    static constexpr std::size_t served(std::size_t bytes) noexcept { return bytes == 0 ? 1 : bytes; }

    void* do_allocate(std::size_t bytes, std::size_t alignment) override {
        return resource_->allocate_sync(served(bytes), alignment);
    }

    void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) override {
        resource_->deallocate_sync(ptr, served(bytes), alignment);
    }

    [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
        if (this == &other) return true;
        const auto* that = dynamic_cast<const pmr_adaptor*>(&other);
        return that != nullptr && (that->resource_ == resource_ || *that->resource_ == *resource_);
    }

    R* resource_; // != nullptr
};

} // namespace custody::interop
