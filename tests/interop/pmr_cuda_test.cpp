// interop/pmr.hpp over the CUDA toolkit's host-accessible resources (pinned and managed memory).
#include <custody/interop/pmr.hpp>
#include <custody/resource/cuda_async.hpp>
#include <custody/resource/managed.hpp>
#include <custody/resource/pinned_host.hpp>

#include "../support/catch.hpp"

#include <cstdint>
#include <memory_resource>
#include <numeric>
#include <type_traits>
#include <vector>

using custody::interop::pmr_adaptor;

// Pinned and managed memory are host accessible; device memory is refused (see pmr_device_memory.cpp).
static_assert(std::is_constructible_v<pmr_adaptor<custody::resource::pinned_host>, custody::resource::pinned_host&>);
static_assert(std::is_constructible_v<pmr_adaptor<custody::resource::managed>, custody::resource::managed&>);
static_assert(!custody::has_property<custody::resource::cuda_async, custody::host_accessible>);

TEMPLATE_TEST_CASE("std::pmr containers over pinned and managed memory", "[interop][pmr][gpu]",
                   custody::resource::pinned_host, custody::resource::managed) {
    TestType memory(0);
    pmr_adaptor adaptor(memory);
    {
        std::pmr::vector<std::uint32_t> v(&adaptor);
        for (std::uint32_t i = 0; i < 4096; ++i) v.push_back(i);
        CHECK(std::accumulate(v.begin(), v.end(), std::uint64_t{0}) == std::uint64_t{4095} * 4096 / 2);
        CHECK(memory.statistics().live_allocations == 1);
    }
    CHECK(memory.statistics().live_bytes == 0);
    CHECK(memory.statistics().allocations == memory.statistics().deallocations);
}
