/// @file
/// `gpu_name`: a GPU's identity as nvidia-smi prints it, "GPU-" and its UUID as 8-4-4-4-12 hex
/// digits: the one name that every claim of a GPU (interop/device_lock.hpp) uses, whether C++ (an
/// NCCL communicator) or Python (custody.torch, through the allocator library) makes it, so that
/// two claims of one GPU always lock one file.
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace custody::interop {

/// The name of the GPU whose 16-byte UUID is `uuid` (cudaDeviceProp::uuid), e.g.
/// "GPU-5c1e0000-1111-2222-3333-444455556666". Pure; O(1).
[[nodiscard]] inline std::string gpu_name(std::span<const unsigned char, 16> uuid) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string text = "GPU-";
    text.reserve(40);
    for (std::size_t i = 0; i < uuid.size(); ++i) {
        text += digits[uuid[i] >> 4U];
        text += digits[uuid[i] & 0x0FU];
        if (i == 3 || i == 5 || i == 7 || i == 9) text += '-';
    }
    return text;
}

} // namespace custody::interop
