// The resources the contract suite runs over on the host platform. Add a case here for every new
// host-platform resource.
#pragma once

#include <custody/debug/tracking_resource.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/resource/simulated_device_memory.hpp>
#include <custody/resource/virtual_memory.hpp>

#include <cstddef>
#include <memory>
#include <tuple>

namespace custody::test {

struct host_memory_case {
    using resource = custody::resource::host_memory;
    static std::unique_ptr<resource> make() { return std::make_unique<resource>(); }
    static constexpr std::size_t max_alignment = resource::max_alignment;
    static constexpr bool exhaustible = true;
};

struct simulated_device_memory_case {
    using resource = custody::host::simulated_device_memory;
    static std::unique_ptr<resource> make() { return std::make_unique<resource>(1, std::size_t{1} << 30); }
    static constexpr std::size_t max_alignment = resource::max_alignment;
    static constexpr bool exhaustible = true;
};

struct fault_injecting_case {
    using resource = custody::resource::fault_injecting<custody::host::simulated_device_memory>;
    static std::unique_ptr<resource> make() { return std::make_unique<resource>(2, std::size_t{1} << 30); }
    static constexpr std::size_t max_alignment = custody::host::simulated_device_memory::max_alignment;
    static constexpr bool exhaustible = true;
};

/// The tracking resource with everything on (canaries, poison, stream and device checks) over
/// host memory; a violation would throw from the next call and fail the suite.
struct tracking_host_memory_case {
    using resource = custody::debug::tracking_resource<custody::resource::host_memory>;
    static std::unique_ptr<resource> make() {
        custody::debug::tracking_options o;
        o.name = "contract";
        o.rank = custody::rank_info{};
        return std::make_unique<resource>(o);
    }
    static constexpr std::size_t max_alignment = custody::resource::host_memory::max_alignment;
    static constexpr bool exhaustible = true;
};

struct pool_over_host_memory_case {
    using resource = custody::pool::stream_ordered_pool<custody::resource::host_memory>;
    static std::unique_ptr<resource> make() { return std::make_unique<resource>(custody::pool::pool_options{}); }
    static constexpr std::size_t max_alignment = resource::max_alignment;
    static constexpr bool exhaustible = true;
};

struct pool_over_simulated_device_memory_case {
    using resource = custody::pool::stream_ordered_pool<custody::host::simulated_device_memory>;
    static std::unique_ptr<resource> make() {
        custody::pool::pool_options options;
        options.growth_step = std::size_t{1} << 20; // several chunks in play even in short tests
        // The suite's streams are made on the current device (0): a pool takes only streams of its
        // own device, as events of one CUDA device cannot be recorded on another's streams.
        return std::make_unique<resource>(options, 0, std::size_t{1} << 30);
    }
    static constexpr std::size_t max_alignment = resource::max_alignment;
    static constexpr bool exhaustible = true;
};

/// Address space reserved up front, pages mapped per block and unmapped when it comes back.
struct virtual_memory_case {
    using resource = custody::resource::virtual_memory<custody::host::vmm>;
    static std::unique_ptr<resource> make() {
        return std::make_unique<resource>(0, std::size_t{1} << 30,
                                          custody::resource::reservation_options{.granule = granule, .exportable = false, .peers = {}});
    }
    static constexpr std::size_t granule = std::size_t{64} << 10; // a multiple of every Linux page size
    static constexpr std::size_t max_alignment = granule;
    static constexpr bool exhaustible = true;
    static constexpr bool blocking_free = true; // deallocate on a stream waits for it, as cudaFree does
};

using host_contract_cases = std::tuple<host_memory_case, simulated_device_memory_case, fault_injecting_case,
                                       tracking_host_memory_case, pool_over_host_memory_case,
                                       pool_over_simulated_device_memory_case, virtual_memory_case>;

} // namespace custody::test
