/// @file
/// The virtual-memory operations of a platform: reserve address space, create physical memory,
/// map it into the reserved range, make it accessible, unmap and release it, as a concept that
/// `host::vmm` (platform/host_vmm.hpp) and `cuda::vmm` (platform/cuda_vmm.hpp) satisfy.
///
/// An operation set V provides (static functions; `h` is a V::handle):
///
///   V::platform_type             the platform whose devices and streams the memory belongs to
///   V::handle                    a physical allocation, trivially copyable, that knows its device
///   V::supported(d)              device d can do all of this; never throws
///   V::exportable(d)             physical memory of d can be created exportable; never throws
///   V::granularity(d)            the smallest unit of mapping on d (a power of two, >= a page)
///   V::reserve(d, n, a)          n bytes of address space aligned to a, for memory of d; nullptr
///                                when there is none
///   V::free_reservation(d, p, n) gives the range back; every part of it must be unmapped
///   V::create(d, n, exportable)  n bytes of physical memory of d; nullopt when d has none left
///   V::release(h)                gives physical memory back (it stays alive while mapped)
///   V::map(p, n, h)              maps h over [p, p+n) inside a reservation; not yet accessible
///   V::set_access(p, n, ds)      makes [p, p+n), all mapped, readable and writable by devices ds
///                                (ds[0] the memory's own device)
///   V::unmap(d, p, n)            unmaps [p, p+n) of d's memory, exactly as one map() mapped it;
///                                true on success
///   V::export_fd(h)              a POSIX file descriptor for h (created exportable), owned by the
///                                caller; throws where the platform cannot export
///
/// Failures other than exhaustion throw (custody::cuda_error, std::system_error) and change
/// nothing. A platform that finds its memory short only at map or set_access (the host's kernel
/// charges a mapping's commit there) throws custody::out_of_memory from them: exhaustion too. release, unmap and free_reservation never throw: they report a failure (and unmap
/// answers false, leaving the range mapped). Each operation is told the device it works for, so a
/// platform can make that device's context current for it.
#pragma once

#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <type_traits>

namespace custody {

template <class V>
concept virtual_memory_operations =
    requires(int device, std::size_t bytes, void* ptr, typename V::handle h, std::span<const int> devices) {
        typename V::platform_type;
        requires std::is_trivially_copyable_v<typename V::handle>;
        { V::supported(device) } noexcept -> std::same_as<bool>;
        { V::exportable(device) } noexcept -> std::same_as<bool>;
        { V::granularity(device) } -> std::same_as<std::size_t>;
        { V::reserve(device, bytes, bytes) } -> std::same_as<void*>;
        { V::free_reservation(device, ptr, bytes) } noexcept;
        { V::create(device, bytes, true) } -> std::same_as<std::optional<typename V::handle>>;
        { V::release(h) } noexcept;
        V::map(ptr, bytes, h);
        V::set_access(ptr, bytes, devices);
        { V::unmap(device, ptr, bytes) } noexcept -> std::same_as<bool>;
        { V::export_fd(h) } -> std::same_as<int>;
    };

} // namespace custody
