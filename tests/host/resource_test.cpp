// resource/: device binding, stream-ordered frees and fault injection, beyond the contract.
#include <custody/platform/host.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

using custody::host::platform;
using custody::resource::fault_injecting;
using custody::host::simulated_device_memory;

TEST_CASE("a device-bound resource allocates on its device whatever the caller has current", "[resource]") {
    simulated_device_memory r(5, 1 << 20);
    custody::host::device_guard caller(2);
    void* p = r.allocate_sync(100, 256);
    CHECK(r.device_seen_by_last_allocation() == 5);
    CHECK(platform::current_device() == 2);
    r.deallocate_sync(p, 100, 256);
    CHECK_THROWS_AS(simulated_device_memory(platform::device_count(), 1), std::invalid_argument);
}

TEST_CASE("simulated device memory enforces its capacity and returns it when frees have run", "[resource]") {
    simulated_device_memory r(0, 10000);
    custody::host::stream s;
    void* a = r.allocate(s, 6000, 256);
    CHECK_THROWS_AS(r.allocate(s, 6000, 256), custody::out_of_memory);
    CHECK(r.used() == 6000);
    {
        custody::test::stream_gate<platform> gate(s);
        r.deallocate(s, a, 6000, 256);
        CHECK(r.used() == 6000); // the free waits behind pending work
        CHECK(r.statistics().live_bytes == 0);
    }
    platform::synchronize(s);
    CHECK(r.used() == 0);
    void* b = r.allocate(s, 10000, 256);
    r.deallocate(s, b, 10000, 256);
}

TEST_CASE("fault_injecting fails the Nth call and leaves the upstream unchanged", "[resource]") {
    fault_injecting<simulated_device_memory> r(0, 1 << 20);
    custody::host::stream_view s;
    r.fail_at(3);
    void* a = r.allocate(s, 100, 256);
    void* b = r.allocate_sync(100, 256);
    const auto before = r.upstream().statistics();
    CHECK_THROWS_AS(r.allocate(s, 100, 256), custody::out_of_memory);
    CHECK(r.upstream().statistics() == before);
    CHECK(r.injected_failures() == 1);
    void* c = r.allocate(s, 100, 256); // one failure only
    CHECK(c != nullptr);
    r.fail_at(1, true);
    CHECK(r.try_allocate(s, 100, 256) == nullptr);
    CHECK(r.try_allocate(s, 100, 256) == nullptr);
    r.disarm();
    void* d = r.try_allocate(s, 100, 256);
    CHECK(d != nullptr);
    for (void* p : {a, b, c, d}) r.deallocate(s, p, 100, 256);
    CHECK(r.upstream().statistics().live_bytes == 0);
    CHECK(r.upstream().used() == 0);
}

TEST_CASE("fault_injecting enforces a byte budget on live bytes", "[resource]") {
    fault_injecting<custody::resource::host_memory> r;
    r.set_byte_budget(1000);
    void* a = r.allocate_sync(600, 64);
    CHECK_THROWS_AS(r.allocate_sync(600, 64), custody::out_of_memory);
    void* b = r.allocate_sync(400, 64);
    r.deallocate_sync(a, 600, 64);
    void* c = r.allocate_sync(600, 64);
    r.deallocate_sync(b, 400, 64);
    r.deallocate_sync(c, 600, 64);
    CHECK(r.statistics().live_bytes == 0);
}
