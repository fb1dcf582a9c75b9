// platform/host.hpp: worker-thread streams, events, virtual devices, device guards.
#include <custody/platform/host.hpp>

#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

#include <atomic>
#include <thread>
#include <vector>

using custody::host::platform;

TEST_CASE("host streams run work in order on their own thread", "[platform][host]") {
    custody::host::stream s;
    std::vector<int> order;
    std::thread::id worker;
    for (int i = 0; i < 100; ++i) {
        s.view().enqueue([&, i] {
            order.push_back(i);
            worker = std::this_thread::get_id();
        });
    }
    platform::synchronize(s);
    REQUIRE(order.size() == 100);
    for (int i = 0; i < 100; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
    CHECK(worker != std::this_thread::get_id());
}

TEST_CASE("host events complete exactly when the recorded work has run", "[platform][host]") {
    custody::host::stream s;
    custody::host::event e(0);
    CHECK(e.ready()); // never recorded
    {
        custody::test::stream_gate<platform> gate(s);
        e.record(s);
        CHECK_FALSE(e.ready());
        gate.open();
        e.synchronize();
        CHECK(e.ready());
    }
    e.record(custody::host::stream_view{}); // the default stream has nothing pending
    CHECK(e.ready());
}

TEST_CASE("a stream made to wait on another's event runs nothing before it", "[platform][host]") {
    custody::host::stream a;
    custody::host::stream b;
    custody::host::event e(0);
    std::atomic<int> step{0};
    int seen_by_b = -1;
    custody::test::stream_gate<platform> gate(a);
    a.view().enqueue([&] { step = 1; });
    e.record(a);
    platform::wait(b, e);
    b.view().enqueue([&] { seen_by_b = step.load(); });
    gate.open();
    platform::synchronize(b);
    CHECK(seen_by_b == 1);
}

TEST_CASE("host device guard sets and restores the thread's device; streams run on theirs", "[platform][host]") {
    REQUIRE(platform::current_device() == 0);
    {
        custody::host::device_guard g(3);
        CHECK(platform::current_device() == 3);
        custody::host::stream s; // on device 3
        CHECK(s.device() == 3);
        int seen = -1;
        s.view().enqueue([&] { seen = platform::current_device(); });
        platform::synchronize(s);
        CHECK(seen == 3);
        CHECK(platform::stream_device(s) == 3);
    }
    CHECK(platform::current_device() == 0);
    CHECK_THROWS_AS(platform::set_device(platform::device_count()), std::invalid_argument);
    CHECK_THROWS_AS(custody::host::stream(-2), std::invalid_argument);
    CHECK(platform::current_device() == 0);
}

TEST_CASE("host async copies and memsets are ordered on the stream", "[platform][host]") {
    custody::host::stream s;
    std::vector<unsigned char> a(1000, 1), b(1000, 0);
    {
        custody::test::stream_gate<platform> gate(s);
        platform::memset_async(a.data(), 7, a.size(), s);
        platform::memcpy_async(b.data(), a.data(), a.size(), s);
        CHECK(b[0] == 0); // nothing ran yet
    }
    platform::synchronize(s);
    CHECK(b[0] == 7);
    CHECK(b[999] == 7);
}

TEST_CASE("a moved-from host stream is empty and the moved-to one works", "[platform][host]") {
    custody::host::stream a;
    custody::host::stream b(std::move(a));
    CHECK(a.view().is_default()); // NOLINT(bugprone-use-after-move): checking the moved-from state
    int x = 0;
    b.view().enqueue([&] { x = 5; });
    platform::synchronize(b);
    CHECK(x == 5);
}
