/// @file
/// `cuda_memory_info`: the device-memory query a stream_ordered_pool on the cuda platform uses for
/// its whole-device budget (pool_options::memory_info), from cudaMemGetInfo.
#pragma once

#include <custody/platform/cuda.hpp>
#include <custody/pool/pool_options.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <new>
#include <optional>

namespace custody::pool {

/// Free and total memory of `device` now, from cudaMemGetInfo on that device (the caller's current
/// device is restored); nothing if the query fails (the pool then applies no device budget).
/// Thread-safe. Costs a driver call: the pool calls it only when it grows.
inline std::optional<device_memory> cuda_memory_info(int device) noexcept {
    std::optional<device_memory> result;
    cuda::device_guard guard(device, std::nothrow);
    std::size_t free = 0;
    std::size_t total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
        result = device_memory{free, total};
    } else {
        static_cast<void>(cudaGetLastError());
    }
    return result;
}

} // namespace custody::pool
