/// @file
/// The allocators custody-replay drives on a GPU: cudaMalloc, cudaMallocAsync, CUB's
/// CachingDeviceAllocator and custody's pool over cudaMalloc. Built when the CUDA Toolkit is
/// found; each refuses with a clear message when no device is present. Included by allocators.hpp.
#pragma once

#include "adaptors.hpp"
#include "allocator_spec.hpp"
#include "program.hpp"
#include "replay.hpp"
#include "streams.hpp"

#include <custody/platform/cuda.hpp>
#include <custody/platform/cuda_vmm.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/cuda_async.hpp>
#include <custody/resource/cuda_malloc.hpp>
#include <custody/resource/virtual_memory.hpp>

#include <cub/util_allocator.cuh>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace custody::replay {

/// The number of CUDA devices; throws spec_error naming `spec` when there is none.
inline int require_cuda_device(const allocator_spec& spec) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
        static_cast<void>(cudaGetLastError());
        spec.fail(std::string("needs a CUDA device, and none is present (cudaGetDeviceCount: ") +
                  (status != cudaSuccess ? cudaGetErrorName(status) : "no devices") + ")");
    }
    return count;
}

/// Whether a CUDA device is present (the default pool then maps on the GPU).
inline bool cuda_device_present() noexcept {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        return false;
    }
    return count > 0;
}

/// The GPU a trace's device replays on: the trace's device modulo the devices present.
[[nodiscard]] inline int cuda_device_of(int trace_device, int count) noexcept {
    return (trace_device < 0 ? 0 : trace_device) % count;
}

/// Device memory in use on `device` (total minus free): what cudaMalloc really takes, page
/// rounding included.
inline std::uint64_t device_used(int device) {
    cuda::device_guard guard(device);
    std::size_t free = 0, total = 0;
    CUSTODY_CUDA_TRY(cudaMemGetInfo(&free, &total));
    return total - free;
}

/// cudaMalloc's reserved bytes: the device memory in use above what was in use when the replay
/// began.
class cuda_malloc_adaptor : public custody_adaptor<resource::cuda_malloc> {
public:
    cuda_malloc_adaptor(const std::vector<cuda::stream_view>& streams, int device)
        : custody_adaptor(streams, device), device_(device), baseline_(device_used(device)) {}
    [[nodiscard]] std::uint64_t reserved() const {
        const std::uint64_t used = device_used(device_);
        return used > baseline_ ? used - baseline_ : 0;
    }

private:
    int device_;
    std::uint64_t baseline_;
};

/// What a cudaMallocAsync pool holds from the device (cudaMemPoolAttrReservedMemCurrent).
struct mempool_reserved {
    std::uint64_t operator()(const resource::cuda_async& r) const {
        std::uint64_t v = 0;
        CUSTODY_CUDA_TRY(cudaMemPoolGetAttribute(r.pool_handle(), cudaMemPoolAttrReservedMemCurrent, &v));
        return v;
    }
};

/// custody's cuda_async (the device's default pool, release threshold at its maximum, so the pool
/// stays warm within a replay); its pool is trimmed to empty before each replay, so every replay
/// starts from nothing as every other allocator does.
class cuda_async_adaptor : public custody_adaptor<resource::cuda_async, mempool_reserved> {
public:
    cuda_async_adaptor(const std::vector<cuda::stream_view>& streams, int device) : custody_adaptor(streams, device) {
        cuda::device_guard guard(device);
        CUSTODY_CUDA_TRY(cudaDeviceSynchronize());
        CUSTODY_CUDA_TRY(cudaMemPoolTrimTo(resource().pool_handle(), 0));
    }
};

/// CUB's CachingDeviceAllocator. A block is freed on the stream it was allocated on (CUB keeps
/// that stream; a trace's free on another stream is not CUB's model). Reserved: CUB's own count
/// of the bytes it holds (live and cached).
class cub_adaptor {
public:
    struct options {
        unsigned bin_growth = 8;
        unsigned min_bin = 3;                    // 512 B
        unsigned max_bin = 9;                    // 128 MiB; larger blocks are not cached
        std::size_t max_cached_bytes = cub::CachingDeviceAllocator::INVALID_SIZE; // no limit
    };

    cub_adaptor(const std::vector<cuda::stream_view>& streams, int device, const options& o)
        : streams_(streams), device_(device), cub_(o.bin_growth, o.min_bin, o.max_bin, o.max_cached_bytes, false) {}

    void* allocate(std::uint16_t stream, std::uint64_t bytes, std::size_t) noexcept {
        void* p = nullptr;
        const cudaError_t status = cub_.DeviceAllocate(device_, &p, bytes, streams_[stream].get());
        if (status != cudaSuccess) {
            static_cast<void>(cudaGetLastError());
            failure_ = std::string("CachingDeviceAllocator::DeviceAllocate: ") + cudaGetErrorName(status);
            return nullptr;
        }
        return p;
    }
    void deallocate(std::uint16_t, void* p, std::uint64_t, std::size_t) noexcept {
        if (cub_.DeviceFree(device_, p) != cudaSuccess) static_cast<void>(cudaGetLastError());
    }
    [[nodiscard]] std::uint64_t reserved() const {
        const auto it = cub_.cached_bytes.find(device_);
        return it == cub_.cached_bytes.end() ? 0 : it->second.free + it->second.live;
    }
    [[nodiscard]] std::optional<std::uint64_t> largest_free() const noexcept { return std::nullopt; }
    [[nodiscard]] std::optional<std::uint64_t> peak_live() const noexcept { return std::nullopt; }
    void settle() {
        cuda::device_guard guard(device_);
        CUSTODY_CUDA_TRY(cudaDeviceSynchronize());
    }
    [[nodiscard]] const std::string& failure() const noexcept { return failure_; }

private:
    const std::vector<cuda::stream_view>& streams_;
    int device_;
    cub::CachingDeviceAllocator cub_;
    std::string failure_;
};

/// A driver factory for an adaptor `A` built as A(streams, device, args...) on the program's GPU.
template <class A, class... Args>
auto cuda_factory(int devices, Args... args) {
    return [=](const device_program& p, stream_pool& streams) {
        const int device = cuda_device_of(p.device, devices);
        cuda::device_guard guard(device);
        const auto& views = streams.views<cuda::platform>(device);
        return make_driver<A>([&views, device, args...] {
            cuda::device_guard inner(device);
            return std::make_unique<A>(views, device, args...);
        });
    };
}

/// custody's pool over cudaMalloc on the GPU (pool:upstream=cuda_malloc).
inline std::function<std::unique_ptr<driver>(const device_program&, stream_pool&)>
cuda_pool(const allocator_spec& spec, const pool::pool_options& o) {
    const int devices = require_cuda_device(spec);
    using A = custody_adaptor<pool::stream_ordered_pool<resource::cuda_malloc>>;
    return [=](const device_program& p, stream_pool& streams) {
        const int device = cuda_device_of(p.device, devices);
        cuda::device_guard guard(device);
        const auto& views = streams.views<cuda::platform>(device);
        return make_driver<A>([&views, device, o] {
            cuda::device_guard inner(device);
            return std::make_unique<A>(views, o, device);
        });
    };
}

/// custody's pool growing in one address range of the GPU mapped with cuda::vmm (pool, or
/// pool:upstream=cuda_vmm): granules of `granule` bytes, `address_space` bytes reserved (0: four
/// times the device's memory).
inline std::function<std::unique_ptr<driver>(const device_program&, stream_pool&)>
cuda_mapped_pool(const allocator_spec& spec, const pool::pool_options& o, std::size_t granule, std::size_t address_space) {
    const int devices = require_cuda_device(spec);
    using upstream = resource::virtual_memory<cuda::vmm>;
    using A = custody_adaptor<pool::stream_ordered_pool<upstream>>;
    return [=](const device_program& p, stream_pool& streams) {
        const int device = cuda_device_of(p.device, devices);
        cuda::device_guard guard(device);
        const auto& views = streams.views<cuda::platform>(device);
        return make_driver<A>([&views, device, o, granule, address_space] {
            cuda::device_guard inner(device);
            resource::reservation_options ro;
            ro.granule = granule;
            const std::size_t space = address_space != 0 ? address_space : upstream::default_capacity(device);
            return std::make_unique<A>(views, o, device, space, ro);
        });
    };
}

/// cuda_malloc, cuda_async or cub, with their options taken from `spec`.
inline std::function<std::unique_ptr<driver>(const device_program&, stream_pool&)> cuda_allocator(allocator_spec& spec) {
    if (spec.name() == "cub") {
        cub_adaptor::options o;
        spec.take_count("bin_growth", o.bin_growth);
        spec.take_count("min_bin", o.min_bin);
        spec.take_count("max_bin", o.max_bin);
        spec.take_size("max_cached_bytes", o.max_cached_bytes);
        if (o.bin_growth < 2) spec.fail("option bin_growth must be at least 2");
        if (o.min_bin > o.max_bin) spec.fail("option min_bin is above max_bin");
        return cuda_factory<cub_adaptor>(require_cuda_device(spec), o);
    }
    const int devices = require_cuda_device(spec);
    if (spec.name() == "cuda_async") return cuda_factory<cuda_async_adaptor>(devices);
    return cuda_factory<cuda_malloc_adaptor>(devices);
}

} // namespace custody::replay
