/// @file
/// What a discard keeps of a block: the bytes a layer above holds in it (a tracker's guards, see
/// core/discarding.hpp), copied to host memory at the sleep and written back after the zero fill at
/// the wake, so that a discard zeroes what the owner wrote and nothing else.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

namespace custody::sleep::detail {

/// Bytes of a block that a layer above keeps through a discard: where they are, and room for them
/// while the block sleeps. Invariant: saved holds `bytes` bytes; offset + bytes <= the block's bytes.
struct kept_bytes {
    std::size_t offset = 0;
    std::size_t bytes = 0;
    std::unique_ptr<std::byte[]> saved;
};

/// Notes that the `bytes` at `offset` of a block of `block_bytes` are kept (their room taken now, so
/// that a sleep never fails for it). False, with nothing noted, when they lie outside the block.
/// Throws std::bad_alloc; nothing is noted then.
[[nodiscard]] inline bool keep(std::vector<kept_bytes>& kept, std::size_t block_bytes, std::size_t offset,
                               std::size_t bytes) {
    if (offset > block_bytes || bytes > block_bytes - offset) return false;
    kept_bytes k{offset, bytes, std::make_unique<std::byte[]>(bytes)};
    kept.push_back(std::move(k));
    return true;
}

/// Forgets one span kept at `offset` of `bytes`, if there is one.
inline void release(std::vector<kept_bytes>& kept, std::size_t offset, std::size_t bytes) noexcept {
    const auto it = std::find_if(kept.begin(), kept.end(),
                                 [&](const kept_bytes& k) { return k.offset == offset && k.bytes == bytes; });
    if (it != kept.end()) kept.erase(it);
}

/// Enqueues the copies of a block's kept bytes (at `base`) into their room, on `s` (at the sleep).
template <class Platform>
void save_kept(std::vector<kept_bytes>& kept, const std::byte* base, typename Platform::stream_view s) {
    for (kept_bytes& k : kept) Platform::memcpy_async(k.saved.get(), base + k.offset, k.bytes, s);
}

/// Enqueues the copies of a block's kept bytes back into it (at `base`), on `s` (at the wake).
template <class Platform>
void restore_kept(const std::vector<kept_bytes>& kept, std::byte* base, typename Platform::stream_view s) {
    for (const kept_bytes& k : kept) Platform::memcpy_async(base + k.offset, k.saved.get(), k.bytes, s);
}

} // namespace custody::sleep::detail
