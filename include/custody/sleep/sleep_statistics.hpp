/// @file
/// What a sleepable_memory holds and has done (`sleep_statistics`), and one owner's share of it
/// (`owner_memory`): plain values.
#pragma once

#include <custody/sleep/sleep_policy.hpp>

#include <cstddef>
#include <cstdint>

namespace custody::sleep {

/// A snapshot of a sleepable_memory, beyond resource_statistics. A plain value.
///
/// Invariants: mapped_bytes = awake_bytes + stuck_bytes + withheld_bytes; a block's span is its
/// bytes rounded up to whole granules; address space of live blocks = awake_bytes + asleep_bytes.
struct sleep_statistics {
    std::size_t awake_bytes = 0;     ///< spans of the blocks of owners that are awake (all mapped)
    std::size_t asleep_bytes = 0;    ///< spans of the blocks of sleeping owners (address space kept)
    std::size_t mapped_bytes = 0;    ///< physical memory held from the device now
    std::size_t offloaded_bytes = 0; ///< host memory holding the contents of sleeping owners
    std::size_t stuck_bytes = 0;     ///< granules of sleeping blocks that would not unmap (reported);
                                     ///< given back at the owner's next wake or free
    std::size_t withheld_bytes = 0;  ///< granules of freed blocks that would not unmap (reported);
                                     ///< never reused, given back at destruction
    std::size_t sleeping_owners = 0;
    std::size_t granule = 0;
    std::uint64_t sleeps = 0;        ///< owners put to sleep, ever
    std::uint64_t wakes = 0;         ///< owners woken, ever
    std::uint64_t released_bytes = 0; ///< physical memory given back by sleeps, ever
};

/// One owner's blocks, as they are now. A plain value.
struct owner_memory {
    std::size_t blocks = 0;          ///< live blocks allocated for the owner
    std::size_t bytes = 0;           ///< their bytes, as requested
    std::size_t span_bytes = 0;      ///< their address space: bytes rounded up to granules
    std::size_t mapped_bytes = 0;    ///< physical memory they hold (span_bytes when awake)
    std::size_t offloaded_bytes = 0; ///< host memory holding their contents (asleep, offload)
    bool asleep = false;
    sleep_policy policy = sleep_policy::discard; ///< how the owner sleeps (while asleep)
};

} // namespace custody::sleep
