// buffer/: owning handles remember device, stream and resource, and give memory back there.
#include <custody/buffer/buffer.hpp>
#include <custody/platform/host.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/checking_resource.hpp"
#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

#include <numeric>
#include <vector>

using custody::host::platform;
template <class T>
using host_buffer = custody::buffer<T, platform, custody::host_accessible>;
template <class T>
using dev_buffer = custody::buffer<T, platform, custody::device_accessible>;

TEST_CASE("a buffer frees on its device and stream and restores the caller's device", "[buffer]") {
    custody::test::checking_resource r(4);
    custody::host::stream s(4);
    {
        custody::host::device_guard caller(1);
        dev_buffer<float> b(1000, s, r);
        CHECK(b.size() == 1000);
        CHECK(b.size_bytes() == 4000);
        CHECK(b.device() == 4);
        CHECK(b.stream() == s.view());
        CHECK(custody::is_aligned(b.data(), 256));
        CHECK(platform::current_device() == 1); // construction restored it
        custody::host::device_guard elsewhere(6);
    } // destroyed while device 1 is current
    CHECK(platform::current_device() == 0);
    const auto calls = r.calls();
    REQUIRE(calls.size() == 2);
    CHECK(calls[0].allocate);
    CHECK(calls[0].current_device == 4);
    CHECK_FALSE(calls[1].allocate);
    CHECK(calls[1].current_device == 4);
    CHECK(calls[1].stream == s.view());
    CHECK(calls[1].bytes == 4000);
    CHECK(r.violations().empty());
    CHECK(r.live_blocks() == 0);
}

TEST_CASE("moving a buffer moves ownership; the moved-from one frees nothing", "[buffer]") {
    custody::test::checking_resource r(0);
    host_buffer<int> a(10, {}, r);
    int* p = a.data();
    host_buffer<int> b(std::move(a));
    CHECK(b.data() == p);
    CHECK(a.data() == nullptr); // NOLINT(bugprone-use-after-move): the moved-from state is specified
    CHECK(a.empty());           // NOLINT(bugprone-use-after-move)
    host_buffer<int> c(5, {}, r);
    c = std::move(b); // c's old block is given back, b's is taken over
    CHECK(c.data() == p);
    CHECK(r.live_blocks() == 1);
    c.reset();
    CHECK(r.live_blocks() == 0);
    CHECK(r.violations().empty());
}

TEST_CASE("resize keeps the prefix, is stream-ordered and strong on failure", "[buffer]") {
    custody::resource::fault_injecting<custody::resource::host_memory> r;
    custody::host::stream s;
    host_buffer<int> b(100, s, r);
    platform::synchronize(s);
    std::iota(b.span().begin(), b.span().end(), 0);
    b.resize(200);
    platform::synchronize(s);
    REQUIRE(b.size() == 200);
    for (int i = 0; i < 100; ++i) CHECK(b[static_cast<std::size_t>(i)] == i);
    b.resize(50);
    platform::synchronize(s);
    CHECK(b.size() == 50);
    CHECK(b[49] == 49);
    int* before = b.data();
    r.fail_at(1);
    CHECK_THROWS_AS(b.resize(1000), custody::out_of_memory);
    CHECK(b.data() == before);
    CHECK(b.size() == 50);
    CHECK(b[49] == 49);
    b.resize(0);
    CHECK(b.empty());
    platform::synchronize(s);
    CHECK(r.statistics().live_bytes == 0);
}

TEST_CASE("bad buffer requests give typed errors and leak nothing", "[buffer]") {
    custody::host::simulated_device_memory r(2, 1 << 20);
    CHECK_THROWS_AS(dev_buffer<double>(SIZE_MAX / 4, {}, r), std::length_error);
    CHECK_THROWS_AS(dev_buffer<double>(1 << 20, {}, r), custody::out_of_memory);
    CHECK(r.statistics().live_bytes == 0);
    CHECK(r.used() == 0);
    dev_buffer<double> empty(0, {}, r);
    CHECK(empty.data() == nullptr);
    CHECK(empty.device() == 2);
}

TEST_CASE("a scalar copies values in and out on its stream", "[buffer]") {
    custody::host::simulated_device_memory r(3, 1 << 20);
    custody::host::stream s(3);
    custody::scalar<double, platform> x(s, r);
    x.set_value(2.5);
    CHECK(x.value() == 2.5);
    CHECK(x.device() == 3);
    CHECK(r.statistics().live_allocations == 1);
}

TEST_CASE("a buffer's memory is reused on its stream only after work enqueued before the free", "[buffer]") {
    custody::resource::host_memory r;
    custody::host::stream s;
    std::vector<int> seen;
    {
        custody::test::stream_gate<platform> gate(s);
        host_buffer<int> b(4, s, r);
        int* p = b.data();
        s.view().enqueue([p] { p[0] = 42; });
        s.view().enqueue([p, &seen] { seen.push_back(p[0]); });
    } // freed while the work above is pending: the free is ordered after it
    platform::synchronize(s);
    REQUIRE(seen.size() == 1);
    CHECK(seen[0] == 42);
}
