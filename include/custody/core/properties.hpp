/// @file
/// Properties of resources as empty tags: where the memory they return can be read and written.
///
/// A resource declares a property with a hidden friend `get_property(const R&, tag) noexcept`.
/// Adaptors forward the properties of their upstream.
#pragma once

#include <concepts>

namespace custody {

/// The memory can be accessed by device code on the resource's device.
struct device_accessible {};
/// The memory can be accessed by host code.
struct host_accessible {};
/// Live blocks may lose their memory and contents for a while (sleepable_memory's sleep): a layer
/// above that keeps bytes of its own in them must ask it to keep them (core/discarding.hpp).
struct discards_contents {};

template <class R, class Property>
concept has_property = requires(const R& r) { get_property(r, Property{}); };

/// Declares in an adaptor the properties of `Upstream` it keeps. Use inside the class body.
#define CUSTODY_FORWARD_PROPERTIES(Self, Upstream)                                                      \
    friend void get_property(const Self&, ::custody::device_accessible) noexcept                        \
        requires ::custody::has_property<Upstream, ::custody::device_accessible>                        \
    {}                                                                                                  \
    friend void get_property(const Self&, ::custody::host_accessible) noexcept                          \
        requires ::custody::has_property<Upstream, ::custody::host_accessible>                          \
    {}                                                                                                  \
    friend void get_property(const Self&, ::custody::discards_contents) noexcept                        \
        requires ::custody::has_property<Upstream, ::custody::discards_contents>                        \
    {}

} // namespace custody
