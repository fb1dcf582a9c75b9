/// @file
/// How a sleepable_memory moves an owner's contents between its blocks and host memory: the host
/// memory that holds them, and the copies, on the resource's own stream, straight or through a
/// staging ring.
#pragma once

#include <custody/sleep/sleep_policy.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace custody::sleep::detail {

/// Host memory from `backing` for the contents of every block whose policy is offload
/// (backups[i] for blocks[i]; nullptr for the others): all of it, or none and the backing's
/// out_of_memory.
template <class Backing, class Block>
std::vector<std::byte*> take_backups(Backing& backing, const std::vector<Block*>& blocks,
                                     const std::vector<sleep_policy>& policies, std::size_t alignment) {
    std::vector<std::byte*> backups(blocks.size(), nullptr);
    try {
        for (std::size_t i = 0; i < blocks.size(); ++i) {
            if (policies[i] == sleep_policy::offload) {
                backups[i] = static_cast<std::byte*>(backing.allocate_sync(blocks[i]->bytes, alignment));
            }
        }
    } catch (...) {
        for (std::size_t i = 0; i < backups.size(); ++i) {
            if (backups[i] != nullptr) backing.deallocate_sync(backups[i], blocks[i]->bytes, alignment);
        }
        throw;
    }
    return backups;
}

/// Straight copies: the copy engine reads and writes the host memory itself, which is what pinned
/// memory allows (on the cuda platform, cudaMemcpyAsync into pageable memory works, but is staged
/// by the driver and does not overlap). Each call enqueues one copy and returns.
template <class Platform>
struct direct_copies {
    using stream_view = typename Platform::stream_view;

    static void save(const std::byte* device, std::byte* host, std::size_t bytes, stream_view s) {
        Platform::memcpy_async(host, device, bytes, s);
    }
    static void restore(const std::byte* host, std::byte* device, std::size_t bytes, stream_view s) {
        Platform::memcpy_async(device, host, bytes, s);
    }
};

/// Copies through a staging ring (staging/staging_ring.hpp): the device side copies into and out
/// of the ring's pinned region, the host copies between the ring and the host memory, chunk by
/// chunk, so the host memory may be pageable and the pinned memory used is the ring's alone. save
/// returns when the contents are in host memory; restore when they are all in the ring (the copy to
/// the device completes in the stream's order).
template <class Ring>
class ring_copies {
public:
    using stream_view = typename Ring::stream_type;

    explicit ring_copies(Ring& ring) noexcept : ring_(&ring) {}

    void save(const std::byte* device, std::byte* host, std::size_t bytes, stream_view s) {
        ring_->copy_from_device(device, std::span<std::byte>(host, bytes), s);
    }
    void restore(const std::byte* host, std::byte* device, std::size_t bytes, stream_view s) {
        ring_->copy_to_device(std::span<const std::byte>(host, bytes), device, s);
    }

private:
    Ring* ring_;
};

} // namespace custody::sleep::detail
