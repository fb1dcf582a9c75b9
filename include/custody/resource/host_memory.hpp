/// @file
/// `host_memory`: aligned host memory from the global operator new, on the host platform.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/host.hpp>
#include <custody/resource/detail/leaf.hpp>

#include <cstddef>
#include <new>

namespace custody::resource {

/// Aligned host memory (`operator new` with `std::align_val_t`), belonging to no device.
///
/// Stream semantics: allocate returns memory usable at once. deallocate on a stream enqueues the
/// free on that stream, so the memory is not reused while work enqueued before the call runs.
/// Thread safety: thread-safe. Ownership: owns nothing beyond the blocks it hands out.
/// Complexity: that of the global allocator. Maximum alignment: 4096.
/// Interchangeable: any two host_memory resources can free each other's blocks.
class host_memory final : public detail::leaf<host_memory, host::platform> {
public:
    static constexpr const char* name = "host_memory";
    static constexpr std::size_t max_alignment = custody::max_alignment;
    static constexpr bool interchangeable = true;

    host_memory() noexcept : leaf(-1) {}

    void* raw_allocate_sync(std::size_t bytes, std::size_t alignment) noexcept {
        return ::operator new(bytes, std::align_val_t{alignment}, std::nothrow);
    }
    void raw_deallocate_sync(void* ptr, std::size_t, std::size_t alignment) noexcept {
        ::operator delete(ptr, std::align_val_t{alignment});
    }
    void* raw_allocate(stream_type, std::size_t bytes, std::size_t alignment) noexcept {
        return raw_allocate_sync(bytes, alignment);
    }
    void raw_deallocate(stream_type stream, void* ptr, std::size_t, std::size_t alignment) noexcept {
        host::free_after_stream(stream, [ptr, alignment] { ::operator delete(ptr, std::align_val_t{alignment}); });
    }

    friend void get_property(const host_memory&, host_accessible) noexcept {}
};

static_assert(try_allocatable_resource<host_memory>);
static_assert(resource_with_statistics<host_memory>);
static_assert(has_property<host_memory, host_accessible> && !has_property<host_memory, device_accessible>);

} // namespace custody::resource
