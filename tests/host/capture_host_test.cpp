// Graph capture on the host platform: the rules shared with CUDA (tests/support/capture_cases.hpp),
// and what only the host platform shows (its stand-in for cudaMalloc, streams destroyed mid-capture).
#include <custody/platform/host.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/capture_cases.hpp"

#include "../support/catch.hpp"

#include <atomic>

using custody::capture_mode;
using custody::capture_status;
using custody::capture_violation;
using custody::host::platform;
using ops = custody_test::capture_ops<platform>;

TEST_CASE("host capture records work and replays it at each launch", "[platform][host][capture]") {
    custody_test::case_capture_records_and_replays<platform>();
}
TEST_CASE("host capture: query_capture tells status and id", "[platform][host][capture]") {
    custody_test::case_query_capture<platform>();
}
TEST_CASE("host capture: synchronizing a capturing stream invalidates the capture", "[platform][host][capture]") {
    custody_test::case_synchronize_invalidates<platform>();
}
TEST_CASE("host capture: an event recorded in a capture cannot be queried", "[platform][host][capture]") {
    custody_test::case_captured_event<platform>();
}
TEST_CASE("host capture: a capturing stream cannot wait on an outside event", "[platform][host][capture]") {
    custody_test::case_isolation<platform>();
}
TEST_CASE("host capture: fork and join across streams", "[platform][host][capture]") {
    custody_test::case_fork_and_join<platform>();
}
TEST_CASE("host capture: an unjoined fork fails the end", "[platform][host][capture]") {
    custody_test::case_unjoined_fork<platform>();
}
TEST_CASE("host capture: ending where no capture began is refused", "[platform][host][capture]") {
    custody_test::case_end_where_not_begun<platform>();
}
TEST_CASE("host capture: the modes decide who may make unsafe calls", "[platform][host][capture]") {
    custody_test::case_capture_modes<platform>();
}
TEST_CASE("host capture: a capture not relaxed ends on its own thread", "[platform][host][capture]") {
    custody_test::case_end_from_another_thread<platform>();
}

TEST_CASE("host capture: virtual device memory is cudaMalloc: unsafe unless the thread is relaxed",
          "[platform][host][capture]") {
    custody::host::simulated_device_memory memory(0, std::size_t{1} << 20);
    custody::host::stream s;
    ops::memory m(256);
    platform::begin_capture(s, capture_mode::global);
    platform::memset_async(m.device(), 1, m.size(), s);
    CHECK_THROWS_AS(memory.allocate_sync(4096, 256), capture_violation);
    CHECK(memory.try_allocate({}, 4096, 256) == nullptr); // the growth path of a strategy sees a refusal
    CHECK(platform::query_capture(s).status == capture_status::invalidated);
    CHECK_THROWS_AS(platform::end_capture(s), capture_violation);

    platform::begin_capture(s, capture_mode::global);
    platform::memset_async(m.device(), 1, m.size(), s);
    {
        custody::host::capture_mode_guard relaxed(capture_mode::relaxed);
        void* p = memory.allocate_sync(4096, 256);
        CHECK(p != nullptr);
        memory.deallocate_sync(p, 4096, 256);
    }
    CHECK(platform::exchange_capture_mode(capture_mode::global) == capture_mode::global); // the guard restored it
    CHECK(platform::query_capture(s).status == capture_status::active);
    CHECK(platform::end_capture(s).node_count() == 1);
    CHECK(memory.used() == 0);
}

TEST_CASE("host capture: a graph launched inside a capture replays within the outer graph", "[platform][host][capture]") {
    custody::host::stream s;
    std::atomic<int> runs{0};
    platform::begin_capture(s, capture_mode::global);
    ops::bump(s, runs);
    ops::bump(s, runs);
    const platform::graph inner = platform::end_capture(s);
    platform::begin_capture(s, capture_mode::global);
    platform::launch(inner, s);
    ops::bump(s, runs);
    const platform::graph outer = platform::end_capture(s);
    CHECK(outer.node_count() == 2);
    platform::launch(outer, s);
    platform::launch(outer, s);
    platform::synchronize(s);
    CHECK(runs.load() == 6);
    platform::launch(inner, {}); // on the default stream: at once, in the calling thread
    CHECK(runs.load() == 8);
}

TEST_CASE("host capture: work enqueued on an invalidated capture is refused", "[platform][host][capture]") {
    custody::host::stream s;
    ops::memory m(64);
    platform::begin_capture(s, capture_mode::relaxed);
    CHECK(ops::violation([&] { platform::synchronize(s); }) == "cudaErrorStreamCaptureUnsupported");
    CHECK(ops::violation([&] { platform::memset_async(m.device(), 1, m.size(), s); }) ==
          "cudaErrorStreamCaptureInvalidated");
    CHECK_THROWS_AS(platform::end_capture(s), capture_violation);
}

TEST_CASE("host capture: destroying the capturing stream ends its capture", "[platform][host][capture]") {
    custody::host::event outside(0);
    {
        custody::host::stream s;
        platform::begin_capture(s, capture_mode::global);
        ops::memory m(64);
        platform::memset_async(m.device(), 1, m.size(), s);
    }
    CHECK(outside.ready()); // no capture is open any more: an event query is allowed
}

TEST_CASE("host capture: destroying a forked stream invalidates the capture", "[platform][host][capture]") {
    custody::host::stream s;
    custody::host::event fork(0);
    ops::memory m(64);
    platform::begin_capture(s, capture_mode::global);
    platform::memset_async(m.device(), 1, m.size(), s);
    fork.record(s);
    {
        custody::host::stream t;
        platform::wait(t, fork);
        CHECK(platform::is_capturing(t));
    }
    CHECK(platform::query_capture(s).status == capture_status::invalidated);
    CHECK(ops::violation([&] { static_cast<void>(platform::end_capture(s)); }) == "cudaErrorStreamCaptureInvalidated");
}

TEST_CASE("host capture: waits between two captures merge nothing", "[platform][host][capture]") {
    custody::host::stream s;
    custody::host::stream t;
    custody::host::event e(0);
    ops::memory m(64);
    platform::begin_capture(s, capture_mode::relaxed);
    platform::begin_capture(t, capture_mode::relaxed);
    platform::memset_async(m.device(), 1, m.size(), s);
    e.record(s);
    CHECK(ops::violation([&] { platform::wait(t, e); }) == "cudaErrorStreamCaptureMerge");
    CHECK(platform::query_capture(s).status == capture_status::invalidated);
    CHECK(platform::query_capture(t).status == capture_status::invalidated);
    CHECK_THROWS_AS(platform::end_capture(s), capture_violation);
    CHECK_THROWS_AS(platform::end_capture(t), capture_violation);
}
