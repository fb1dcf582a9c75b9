/// @file
/// `sleep_options`: how a sleepable_memory maps its blocks. A plain value.
#pragma once

#include <cstddef>
#include <vector>

namespace custody::sleep {

/// How a sleepable_memory maps its blocks. Plain value, copied into the resource.
struct sleep_options {
    /// The unit of mapping: 0 for the device's granularity (2 MiB on current GPUs, a page on the
    /// host platform), otherwise a power-of-two multiple of it. Every block takes whole granules.
    std::size_t granule = 0;
    /// Devices besides the resource's that may read and write every block; wake grants them again.
    std::vector<int> peers{};
};

} // namespace custody::sleep
