// interop/pmr.hpp: std::pmr containers over custody resources.
#include <custody/interop/pmr.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/catch.hpp"

#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <new>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

using custody::interop::pmr_adaptor;
using custody::resource::fault_injecting;
using custody::resource::host_memory;

TEST_CASE("a std::pmr::vector draws from and gives back to a custody resource", "[interop][pmr]") {
    host_memory memory;
    pmr_adaptor adaptor(memory);
    {
        std::pmr::vector<std::uint64_t> v(&adaptor);
        for (std::uint64_t i = 0; i < 1000; ++i) v.push_back(i);
        CHECK(std::accumulate(v.begin(), v.end(), std::uint64_t{0}) == 999 * 1000 / 2);
        const auto live = memory.statistics();
        CHECK(live.live_allocations == 1);
        CHECK(live.live_bytes >= 1000 * sizeof(std::uint64_t));
        CHECK(live.allocations > 1); // the vector grew through the resource
    }
    const auto after = memory.statistics();
    CHECK(after.live_bytes == 0);
    CHECK(after.live_allocations == 0);
    CHECK(after.allocations == after.deallocations);
}

TEST_CASE("pmr_adaptor honours the requested alignment", "[interop][pmr]") {
    host_memory memory;
    pmr_adaptor adaptor(memory);
    for (std::size_t alignment : {std::size_t{1}, std::size_t{16}, std::size_t{256}, std::size_t{4096}}) {
        void* p = adaptor.allocate(100, alignment);
        CHECK(reinterpret_cast<std::uintptr_t>(p) % alignment == 0);
        adaptor.deallocate(p, 100, alignment);
    }
    CHECK(memory.statistics().live_bytes == 0);
}

TEST_CASE("pmr_adaptor serves zero bytes with a distinct pointer and takes it back", "[interop][pmr]") {
    host_memory memory;
    pmr_adaptor adaptor(memory);
    void* a = adaptor.allocate(0, 8);
    void* b = adaptor.allocate(0, 8);
    CHECK(a != nullptr);
    CHECK(a != b);
    CHECK(memory.statistics().live_allocations == 2);
    adaptor.deallocate(a, 0, 8);
    adaptor.deallocate(b, 0, 8);
    CHECK(memory.statistics().live_allocations == 0);
}

TEST_CASE("exhaustion propagates as std::bad_alloc and leaves the resource unchanged", "[interop][pmr]") {
    fault_injecting<host_memory> memory;
    pmr_adaptor adaptor(memory);
    std::pmr::vector<int> v(&adaptor);
    v.reserve(16);
    const auto before = memory.statistics();
    memory.fail_at(1);
    CHECK_THROWS_AS(v.reserve(1 << 20), std::bad_alloc);
    CHECK(v.capacity() == 16);
    CHECK(memory.statistics() == before);
    v.reserve(64); // the next call succeeds again
    CHECK(v.capacity() >= 64);
}

TEST_CASE("a bad alignment is std::invalid_argument and changes nothing", "[interop][pmr]") {
    host_memory memory;
    pmr_adaptor adaptor(memory);
    CHECK_THROWS_AS(adaptor.allocate(64, 3), std::invalid_argument);
    CHECK_THROWS_AS(adaptor.allocate(64, 8192), std::invalid_argument);
    CHECK(memory.statistics() == custody::resource_statistics{});
}

TEST_CASE("pmr_adaptor equality follows the adapted resources", "[interop][pmr]") {
    host_memory a;
    host_memory b; // host_memory resources are interchangeable
    fault_injecting<host_memory> f;
    pmr_adaptor pa(a);
    pmr_adaptor pb(b);
    pmr_adaptor pf(f);
    pmr_adaptor pf2(f);
    CHECK(pa == pb);
    CHECK(pf == pf2);
    CHECK_FALSE(pa == static_cast<std::pmr::memory_resource&>(pf));
    CHECK_FALSE(pa == *std::pmr::new_delete_resource());
    // Memory from one adaptor given back through an equal one.
    std::pmr::string s("a string long enough to leave the small buffer", &pa);
    std::pmr::string t(std::move(s), &pb);
    CHECK(t.size() > 40);
}
