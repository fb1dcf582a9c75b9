/// @file
/// The allocators custody-replay knows, by name, with their options: the catalog, and plan(),
/// which checks an allocator_spec and returns the factory of its drivers.
#pragma once

#include "address_space.hpp"
#include "adaptors.hpp"
#include "allocator_spec.hpp"
#include "program.hpp"
#include "replay.hpp"
#include "streams.hpp"

#include <custody/platform/host.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/virtual_memory.hpp>

#include <functional>
#include <memory>
#include <memory_resource>
#include <string>
#include <string_view>
#include <vector>

namespace custody::replay {

/// Builds the driver of one allocator for one device program, using the program's streams.
using driver_factory = std::function<std::unique_ptr<driver>(const device_program&, stream_pool&)>;

/// One entry of the catalog (custody-replay --list).
struct allocator_info {
    std::string_view name;
    std::string_view platform; ///< "host" (runs anywhere) or "cuda" (needs a device)
    std::string_view summary;
    std::string_view options;  ///< the options it takes, "" for none
};

inline constexpr std::string_view pool_option_names =
    "upstream=virtual_memory|address_space|host_memory|cuda_malloc|cuda_vmm, granule, address_space, "
    "release_threshold, initial_size, growth_step, growth_divisor, maximum_size, "
    "reuse=same_stream|opportunistic|follow_dependencies, record_interval, record_bytes, device_headroom, "
    "device_capacity, max_streams";

/// How the pool over virtual memory maps: the granule (a GPU's 2 MiB by default on the host too, so
/// that it rounds as it would there) and the address space it reserves (0: the upstream's default).
struct mapping_options {
    std::size_t granule = std::size_t{2} << 20;
    std::size_t address_space = 0;
};

/// The pool over address space mapped on the host (pool:upstream=virtual_memory).
using host_mapped_pool = pool::stream_ordered_pool<resource::virtual_memory<address_space_vmm>>;

[[nodiscard]] inline const std::vector<allocator_info>& catalog() {
    static const std::vector<allocator_info> entries = {
        {"pool", "host",
         "custody's stream_ordered_pool growing in one mapped address range: the GPU's (upstream=cuda_vmm) when "
         "built with CUDA and a device is present, else address space mapped on the host (upstream=virtual_memory); "
         "in chunks over upstream=address_space, host_memory or cuda_malloc",
         pool_option_names},
        {"address_space", "host", "each block its own mapping of inaccessible address space (a leaf, no caching)",
         "capacity"},
        {"host_memory", "host", "custody's host_memory leaf (aligned operator new)", ""},
        {"malloc", "host", "glibc malloc (posix_memalign above 16-byte alignment)", ""},
        {"pmr_unsync", "host", "std::pmr::unsynchronized_pool_resource over operator new",
         "largest_block, blocks_per_chunk"},
        {"pmr_sync", "host", "std::pmr::synchronized_pool_resource over operator new",
         "largest_block, blocks_per_chunk"},
        {"cuda_malloc", "cuda", "cudaMalloc/cudaFree (custody's cuda_malloc leaf)", ""},
        {"cuda_async", "cuda", "cudaMallocAsync/cudaFreeAsync on the device's default pool, kept warm", ""},
        {"cub", "cuda", "CUB's CachingDeviceAllocator", "bin_growth, min_bin, max_bin, max_cached_bytes"},
    };
    return entries;
}

/// The host platform's device for a trace's device (-1, memory of no device, replays on device 0).
[[nodiscard]] inline int host_device_of(int trace_device) noexcept { return trace_device < 0 ? 0 : trace_device; }

/// Reads the pool's options from `spec` (every option but `upstream`).
inline pool::pool_options take_pool_options(allocator_spec& spec) {
    pool::pool_options o;
    spec.take_size("initial_size", o.initial_size);
    spec.take_size("growth_step", o.growth_step);
    spec.take_count("growth_divisor", o.growth_divisor);
    spec.take_size("maximum_size", o.maximum_size);
    const int reuse = spec.take_choice("reuse", {"same_stream", "opportunistic", "follow_dependencies"});
    if (reuse >= 0) o.reuse = static_cast<pool::reuse_policy>(reuse);
    spec.take_count("record_interval", o.record_interval);
    spec.take_size("record_bytes", o.record_bytes);
    spec.take_size("device_headroom", o.device_headroom);
    spec.take_size("device_capacity", o.device_capacity);
    spec.take_count("max_streams", o.max_streams);
    spec.take_size("release_threshold", o.release_threshold);
    if (o.max_streams == 0) spec.fail("option max_streams must be at least 1");
    return o;
}

/// Reads the mapping options from `spec` (for upstream=virtual_memory and cuda_vmm).
inline mapping_options take_mapping_options(allocator_spec& spec) {
    mapping_options m;
    spec.take_size("granule", m.granule);
    spec.take_size("address_space", m.address_space);
    if (m.granule == 0 || (m.granule & (m.granule - 1)) != 0) spec.fail("option granule must be a power of two");
    return m;
}

/// A driver over a custody resource `R` on the host platform, built from `args...` each replay.
template <class R, class... Args>
driver_factory host_custody(Args... args) {
    return [=](const device_program& p, stream_pool& streams) {
        const auto& views = streams.views<host::platform>(host_device_of(p.device));
        return make_driver<custody_adaptor<R>>([&views, args...] { return std::make_unique<custody_adaptor<R>>(views, args...); });
    };
}

} // namespace custody::replay

#if defined(CUSTODY_REPLAY_CUDA)
#include "cuda_allocators.hpp"
#endif

namespace custody::replay {

/// Checks `spec` (its name and every option) and returns the factory of its drivers. Throws
/// spec_error for an unknown name, an unknown or malformed option, or a CUDA allocator where
/// custody-replay has no CUDA (not built with it, or no device present).
[[nodiscard]] inline driver_factory plan(allocator_spec spec) {
    const std::string& name = spec.name();
    const allocator_info* info = nullptr;
    for (const auto& e : catalog())
        if (e.name == name) info = &e;
    if (info == nullptr) {
        std::string names;
        for (const auto& e : catalog()) names += (names.empty() ? "" : ", ") + std::string(e.name);
        spec.fail("unknown allocator (known: " + names + ")");
    }
    driver_factory factory;
    if (name == "pool") {
        int upstream = spec.take_choice("upstream", {"virtual_memory", "address_space", "host_memory", "cuda_malloc", "cuda_vmm"});
        const pool::pool_options o = take_pool_options(spec);
        const mapping_options m = take_mapping_options(spec);
#if defined(CUSTODY_REPLAY_CUDA)
        if (upstream < 0 && cuda_device_present()) upstream = 4;
#endif
        if (upstream < 0) upstream = 0;
        if (upstream == 0) {
            factory = [o, m](const device_program& p, stream_pool& streams) {
                using A = custody_adaptor<host_mapped_pool>;
                const int device = host_device_of(p.device);
                const auto& views = streams.views<host::platform>(device);
                return make_driver<A>([&views, o, m, device] {
                    resource::reservation_options ro;
                    ro.granule = m.granule;
                    const std::size_t space = m.address_space != 0 ? m.address_space : std::size_t{320} << 30;
                    return std::make_unique<A>(views, o, device, space, ro);
                });
            };
        } else if (upstream == 1) {
            factory = [o](const device_program& p, stream_pool& streams) {
                using R = pool::stream_ordered_pool<address_space>;
                const int device = host_device_of(p.device);
                const auto& views = streams.views<host::platform>(device);
                return make_driver<custody_adaptor<R>>([&views, o, device] { return std::make_unique<custody_adaptor<R>>(views, o, device); });
            };
        } else if (upstream == 2) {
            factory = host_custody<pool::stream_ordered_pool<resource::host_memory>>(o);
        } else {
#if defined(CUSTODY_REPLAY_CUDA)
            factory = upstream == 3 ? cuda_pool(spec, o) : cuda_mapped_pool(spec, o, m.granule, m.address_space);
#else
            spec.fail("upstream=cuda_malloc and cuda_vmm need a custody-replay built with the CUDA Toolkit");
#endif
        }
    } else if (name == "address_space") {
        std::size_t capacity = SIZE_MAX;
        spec.take_size("capacity", capacity);
        factory = [capacity](const device_program& p, stream_pool& streams) {
            const int device = host_device_of(p.device);
            const auto& views = streams.views<host::platform>(device);
            return make_driver<custody_adaptor<address_space>>(
                [&views, device, capacity] { return std::make_unique<custody_adaptor<address_space>>(views, device, capacity); });
        };
    } else if (name == "host_memory") {
        factory = host_custody<resource::host_memory>();
    } else if (name == "malloc") {
        factory = [](const device_program&, stream_pool&) {
            return make_driver<malloc_adaptor>([] { return std::make_unique<malloc_adaptor>(); });
        };
    } else if (name == "pmr_unsync" || name == "pmr_sync") {
        std::pmr::pool_options o;
        o.largest_required_pool_block = pool::detail::small_threshold; // custody's pool's size-class limit
        spec.take_size("largest_block", o.largest_required_pool_block);
        spec.take_count("blocks_per_chunk", o.max_blocks_per_chunk);
        if (name == "pmr_unsync") {
            using A = pmr_adaptor<std::pmr::unsynchronized_pool_resource>;
            factory = [o](const device_program&, stream_pool&) { return make_driver<A>([o] { return std::make_unique<A>(o); }); };
        } else {
            using A = pmr_adaptor<std::pmr::synchronized_pool_resource>;
            factory = [o](const device_program&, stream_pool&) { return make_driver<A>([o] { return std::make_unique<A>(o); }); };
        }
    } else {
#if defined(CUSTODY_REPLAY_CUDA)
        factory = cuda_allocator(spec);
#else
        spec.fail("a CUDA allocator, and this custody-replay was built without the CUDA Toolkit");
#endif
    }
    spec.check_all_used(info->options);
    return factory;
}

} // namespace custody::replay
