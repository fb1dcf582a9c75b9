// At process exit the CUDA runtime unloads and its calls fail with cudaErrorCudartUnloading; the
// driver reclaims everything, so a destructor that meets such a failure has nothing to report.
// Tested with the faulty platform, whose failures can be marked as the process exiting: the pool,
// the staging ring and the tracking resource report a failed wait at destruction, unless it is
// the process exiting.
#include <custody/debug/tracking_resource.hpp>
#include <custody/platform/platform.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/staging/staging_ring.hpp>

#include "../support/failure_log.hpp"
#include "../support/faulty_platform.hpp"
#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

using custody::test::failure_log;
using custody::test::faults_reset;
using custody::test::faulty_memory;
using custody::test::faulty_platform;
using custody::test::faulty_stream;
using custody::test::platform_fault;
using custody::test::platform_faults;

namespace {

/// Every wait on an event fails from now on, as the process exiting (or not).
void fail_every_wait(bool exiting) {
    platform_faults::exiting = exiting;
    platform_faults::event_synchronize = 1 << 20;
}

/// A pool whose stream has an event that its destruction waits for.
void destroy_pool_with_a_stream(bool exiting) {
    custody::pool::stream_ordered_pool<faulty_memory> pool(custody::pool::pool_options{}, 0);
    faulty_stream s(0);
    void* p = pool.allocate(s, 1024, 256);
    pool.deallocate(s, p, 1024, 256);
    faulty_platform::synchronize(s);
    fail_every_wait(exiting);
}

/// A staging ring with a copy in flight (finished, not yet reclaimed) when it is destroyed.
void destroy_ring_with_a_copy(bool exiting) {
    custody::staging::ring_options o;
    o.capacity = 4096;
    custody::staging::staging_ring<faulty_memory> ring(o, 0);
    faulty_stream s(0);
    const std::vector<std::byte> src(100, std::byte{7});
    std::vector<std::byte> dst(100);
    ring.copy_to_device(std::span<const std::byte>(src), dst.data(), s);
    faulty_platform::synchronize(s);
    fail_every_wait(exiting);
}

/// A tracker with a guard check waiting on a stream when it is destroyed.
void destroy_tracker_with_a_check(bool exiting) {
    custody::debug::tracking_options o;
    o.rank = custody::rank_info{};
    custody::debug::tracking_resource<faulty_memory> tracker(o, 0);
    faulty_stream s(0);
    {
        custody::test::stream_gate<custody::host::platform> gate(s.view().host_view()); // the check must wait
        void* p = tracker.allocate(s, 1024, 256);
        tracker.deallocate(s, p, 1024, 256);
    }
    faulty_platform::synchronize(s);
    fail_every_wait(exiting);
}

/// Runs `destroy` (which fails every wait its object's destruction makes) twice: as the process
/// exiting, nothing is reported; otherwise one failure is, naming `who`.
template <class Destroy>
void check_reported_unless_exiting(Destroy destroy, const std::string& who) {
    faults_reset reset;
    {
        failure_log log;
        destroy(true);
        CHECK(log.lines().empty());
    }
    failure_log log;
    destroy(false);
    REQUIRE(log.lines().size() == 1);
    CHECK_THAT(log.lines()[0], custody_test::contains(who));
}

} // namespace

TEST_CASE("the pool's destruction reports a failed wait, unless the process is exiting", "[exit]") {
    check_reported_unless_exiting(destroy_pool_with_a_stream, "stream_ordered_pool");
}

TEST_CASE("the staging ring's destruction reports a failed wait, unless the process is exiting", "[exit]") {
    check_reported_unless_exiting(destroy_ring_with_a_copy, "staging ring");
}

TEST_CASE("the tracker's destruction reports a failed wait, unless the process is exiting", "[exit]") {
    check_reported_unless_exiting(destroy_tracker_with_a_check, "guard check");
}
