// The tracking resource's strong guarantee under faults: a stream's device query that throws (the
// faulty platform), and each allocation a call makes failing in turn (this program replaces the
// global operator new with one that can be told to fail the nth allocation of the calling thread).
#include "support.hpp"

#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/faulty_platform.hpp"
#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

#include <cstdlib>
#include <new>
#include <string>

namespace {

thread_local long allocations_before_failure = 0; // > 0: this thread's allocation number n fails
thread_local bool failure_injected = false;

} // namespace

void* operator new(std::size_t bytes) {
    if (allocations_before_failure > 0 && --allocations_before_failure == 0) {
        failure_injected = true;
        throw std::bad_alloc();
    }
    if (void* p = std::malloc(bytes != 0 ? bytes : 1)) return p;
    throw std::bad_alloc();
}
// Every other unaligned form is replaced too, so that whatever this program's deletes free came
// from malloc (a sanitizer reports a nothrow new from its own heap released by free() here).
void* operator new[](std::size_t bytes) { return ::operator new(bytes); }
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
    try {
        return ::operator new(bytes);
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}
void* operator new[](std::size_t bytes, const std::nothrow_t& tag) noexcept {
    return ::operator new(bytes, tag);
}
// Not inlined: the compiler would see free() given what operator new returned, and warn.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using namespace custody;
using namespace custody::debug;
using custody::test::faulty_memory;
using custody::test::faulty_stream;
using custody::test::platform_fault;
using custody::test::faults_reset;
using custody::test::platform_faults;

namespace {

tracking_options quiet(std::string name) {
    tracking_options o;
    o.name = std::move(name);
    o.rank = rank_info{};
    o.on_leak = policy::ignore;
    return o;
}

/// Runs `call` with the calling thread's nth allocation failing, for n = 1, 2, ... until a run
/// reaches no nth allocation; after each run calls `after(threw)`, with no allocation failing.
/// Returns the number of runs in which an allocation failed.
template <class Call, class After>
long with_each_allocation_failing(Call&& call, After&& after) {
    for (long n = 1; n < 100000; ++n) {
        failure_injected = false;
        allocations_before_failure = n;
        bool threw = false;
        try {
            call();
        } catch (const std::bad_alloc&) {
            threw = true;
        }
        allocations_before_failure = 0;
        after(threw);
        if (!failure_injected) return n - 1;
    }
    FAIL("the call never stops allocating");
    return 0;
}

} // namespace

TEST_CASE("a device query that throws while allocating leaves tracker and upstream as they were",
          "[debug][faults]") {
    faults_reset reset;
    tracking_resource<faulty_memory> t(quiet("device-query"), 0);
    faulty_stream s(0);
    const resource_statistics before = t.statistics();

    platform_faults::stream_device = 1;
    CHECK_THROWS_AS(t.allocate(s, 100, 256), platform_fault);
    CHECK(t.statistics() == before);
    CHECK(t.upstream().statistics().live_allocations == 0);

    platform_faults::stream_device = 1;
    CHECK(t.try_allocate(s, 100, 256) == nullptr);
    CHECK(t.statistics() == before);
    CHECK(t.upstream().statistics().live_allocations == 0);

    void* p = t.allocate(s, 100, 256); // nothing armed: as usual
    CHECK(t.statistics().live_allocations == 1);
    t.deallocate(s, p, 100, 256);
    CHECK(t.violation_count() == 0);
}

TEST_CASE("a device query that throws while freeing is reported, and the block still goes back",
          "[debug][faults]") {
    faults_reset reset;
    test::failure_log log;
    tracking_resource<faulty_memory> t(quiet("device-query-free"), 0);
    faulty_stream s(0);
    void* p = t.allocate(s, 100, 256);

    platform_faults::stream_device = 1;
    t.deallocate(s, p, 100, 256); // noexcept: must neither throw nor end the program
    CHECK(t.statistics().live_allocations == 0);
    CHECK(t.upstream().statistics().live_allocations == 0);
    CHECK(t.violation_count() == 0);
    CHECK_NOTHROW(t.rethrow_pending());
    const auto lines = log.lines();
    REQUIRE(lines.size() == 1);
    CHECK_THAT(lines[0], custody_test::contains("device"));
}

TEST_CASE("each allocation of allocate failing in turn leaves tracker and upstream as they were",
          "[debug][faults]") {
    tracking_options o = quiet("allocate-sweep");
    o.capture_stacks = true;
    tracking_resource<resource::host_memory> t(o);
    int alarms = 0;
    watch w;
    w.owner = "sweep";
    w.threshold_bytes = 1;
    w.callback = [&](const watch_event&) { ++alarms; };
    t.add_watch(std::move(w));
    host::stream s;
    const resource_statistics before = t.statistics();

    void* p = nullptr;
    const long failed = with_each_allocation_failing([&] { p = t.allocate(s, 100, 256, "sweep"); },
                                                     [&](bool threw) {
                                                         if (threw) {
                                                             CHECK(t.statistics() == before);
                                                             CHECK(t.upstream().statistics().live_allocations == 0);
                                                             return;
                                                         }
                                                         CHECK(t.statistics().live_allocations == 1);
                                                         t.deallocate(s, p, 100, 256);
                                                         host::platform::synchronize(s);
                                                     });
    CHECK(failed > 0);
    CHECK(t.upstream().statistics().live_allocations == 0);
    CHECK(t.violation_count() == 0);
}

TEST_CASE("each allocation of try_allocate failing in turn gives null or a block, never a leak",
          "[debug][faults]") {
    tracking_resource<resource::host_memory> t(quiet("try-sweep"));
    host::stream s;
    void* p = nullptr;
    const long failed = with_each_allocation_failing([&] { p = t.try_allocate(s, 100, 256); },
                                                     [&](bool threw) {
                                                         CHECK_FALSE(threw);
                                                         if (p == nullptr) {
                                                             CHECK(t.statistics().live_allocations == 0);
                                                             CHECK(t.upstream().statistics().live_allocations == 0);
                                                             return;
                                                         }
                                                         t.deallocate(s, p, 100, 256);
                                                     });
    CHECK(failed > 0);
    host::platform::synchronize(s);
    CHECK(t.upstream().statistics().live_allocations == 0);
}

TEST_CASE("each allocation of a free failing in turn neither throws nor loses the block", "[debug][faults]") {
    test::failure_log log; // what could not be done is reported, not thrown
    tracking_resource<resource::host_memory> t(quiet("free-sweep"));
    host::stream s;
    void* pending = nullptr; // freed on a stream: its guard check is done and waits for the next free
    void* p = nullptr;
    const auto prepare = [&] {
        pending = t.allocate(s, 64, 256);
        p = t.allocate(s, 100, 256);
        {
            test::stream_gate<host::platform> gate(s); // the check cannot be done at once
            t.deallocate(s, pending, 64, 256);
        }
        host::platform::synchronize(s);
    };
    prepare();
    const long failed = with_each_allocation_failing([&] { t.deallocate(s, p, 100, 256); },
                                                     [&](bool threw) {
                                                         CHECK_FALSE(threw);
                                                         CHECK(t.statistics().live_allocations == 0);
                                                         t.check_guards();
                                                         host::platform::synchronize(s);
                                                         CHECK(t.upstream().statistics().live_allocations == 0);
                                                         prepare();
                                                     });
    CHECK(failed > 0);
    t.deallocate(s, p, 100, 256);
    t.check_guards();
    CHECK(t.violation_count() == 0);
}

TEST_CASE("each allocation of a bad free failing in turn neither throws nor forwards it", "[debug][faults]") {
    test::failure_log log;
    tracking_options o = quiet("bad-free-sweep");
    o.on_violation = policy::log;
    tracking_resource<resource::host_memory> t(o);
    host::stream s;
    void* p = t.allocate(s, 100, 256);
    t.deallocate(s, p, 100, 256);
    void* live = t.allocate(s, 128, 256); // the interior-pointer search walks the live blocks
    const long failed = with_each_allocation_failing(
        [&] {
            t.deallocate(s, p, 100, 256);                                   // a double free
            t.deallocate(s, static_cast<char*>(live) + 8, 120, 256); // an interior pointer
        },
        [&](bool threw) {
            CHECK_FALSE(threw);
            CHECK(t.statistics().live_allocations == 1);
            CHECK(t.upstream().statistics().live_allocations == 1);
        });
    CHECK(failed > 0);
    CHECK(t.violation_count() > 0);
    t.deallocate(s, live, 128, 256);
}
