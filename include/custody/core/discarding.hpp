/// @file
/// `discarding_resource`: a resource whose live blocks may lose their memory and contents for a
/// while (sleepable_memory), and how the layers above it keep their own bytes there; adaptors
/// forward the three calls with CUSTODY_FORWARD_DISCARDING.
///
/// A layer that keeps bytes of its own inside the blocks it hands out (a tracking_resource's guards)
/// names them with keep_through_discard(ptr, bytes) once the block is its, forgets them with
/// release_kept(ptr, bytes) before giving the block back, and touches a block's bytes only while
/// is_resident(ptr). A discard then zeroes what the block's owner wrote and nothing of the layers
/// above. An upstream with the discards_contents property that does not offer the three (an
/// adaptor that forwards the property and not the calls) cannot keep them: the tracker refuses to
/// compile over it.
#pragma once

#include <custody/core/properties.hpp>

#include <concepts>
#include <cstddef>

namespace custody {

template <class R>
concept discarding_resource = has_property<R, discards_contents> &&
    requires(R& r, const R& cr, const void* ptr, std::size_t bytes) {
        r.keep_through_discard(ptr, bytes);
        { r.release_kept(ptr, bytes) } noexcept;
        { cr.is_resident(ptr) } noexcept -> std::same_as<bool>;
    };

/// Declares in an adaptor the three calls of a discarding_resource `Upstream`, forwarded to
/// `member` (the upstream it holds). Use inside the class body, beside CUSTODY_FORWARD_PROPERTIES.
#define CUSTODY_FORWARD_DISCARDING(Upstream, member)                                                    \
    void keep_through_discard(const void* ptr, std::size_t bytes)                                       \
        requires ::custody::discarding_resource<Upstream>                                               \
    {                                                                                                   \
        member.keep_through_discard(ptr, bytes);                                                        \
    }                                                                                                   \
    void release_kept(const void* ptr, std::size_t bytes) noexcept                                      \
        requires ::custody::discarding_resource<Upstream>                                               \
    {                                                                                                   \
        member.release_kept(ptr, bytes);                                                                \
    }                                                                                                   \
    [[nodiscard]] bool is_resident(const void* ptr) const noexcept                                      \
        requires ::custody::discarding_resource<Upstream>                                               \
    {                                                                                                   \
        return member.is_resident(ptr);                                                                 \
    }

} // namespace custody
