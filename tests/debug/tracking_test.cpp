// The tracking resource: ledger, owners, every check, policies, canaries, poison, leaks,
// snapshots, diffs and watches, on the host platform.
#include "support.hpp"

#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

#include <cmath>
#include <csignal>
#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

using namespace custody;
using namespace custody::debug;
using P = custody::host::platform;
using tracker = tracking_resource<resource::host_memory>;
using inspecting_tracker = tracking_resource<test::inspecting_upstream>;

namespace {

tracking_options quiet(std::string name = "t", int rank = 0) {
    tracking_options o;
    o.name = std::move(name);
    o.rank = make_rank(rank, rank, rank + 1);
    o.on_leak = policy::ignore;
    return o;
}

std::uintptr_t key(host::stream_view s) { return P::stream_key(s); }

/// Calls `f` and returns the tracking_error it throws (fails the test if it throws none).
template <class F>
violation caught(F&& f) {
    try {
        f();
    } catch (const tracking_error& e) {
        return e.report();
    }
    FAIL("no tracking_error was thrown");
    return {};
}

} // namespace

TEST_CASE("owner scopes nest, restore and stay on their thread", "[debug][owner]") {
    CHECK(current_owner() == nullptr);
    {
        owner_scope a("decoder");
        {
            owner_scope b("layer.3");
            owner_scope c("attn");
            CHECK(owner_name(current_owner()) == "decoder/layer.3/attn");
            CHECK(c.name() == "decoder/layer.3/attn");
            CHECK(b.name() == "decoder/layer.3");
            std::string other;
            std::thread([&] { other = std::string(owner_name(current_owner())); }).join();
            CHECK(other == "<untagged>");
        }
        CHECK(owner_name(current_owner()) == "decoder");
    }
    CHECK(current_owner() == nullptr);
    CHECK(intern_owner("x/y") == intern_owner("x/y"));
}

TEST_CASE("the ledger records owner, rank, device, stream, sequence and size", "[debug][ledger]") {
    tracker t(quiet("ledger", 3));
    host::stream s1(1);
    void* a = nullptr;
    void* b = nullptr;
    void* c = nullptr;
    {
        owner_scope scope("prefill");
        a = t.allocate(s1, 100, 64);
        b = t.allocate(s1, 200, 256, "kv_cache"); // explicit owner overrides the scope
    }
    {
        host::device_guard g(5);
        c = t.allocate_sync(50, 16);
    }
    const auto sa = t.find(a);
    const auto sb = t.find(b);
    const auto sc = t.find(c);
    REQUIRE(sa);
    REQUIRE(sb);
    REQUIRE(sc);
    CHECK(sa->owner == "prefill");
    CHECK(sb->owner == "kv_cache");
    CHECK(sc->owner == "<untagged>");
    CHECK(sa->rank == 3);
    CHECK(sa->device == 1);
    CHECK(sc->device == 5);
    CHECK(sa->stream == key(s1));
    CHECK(sc->synchronous);
    CHECK(sa->sequence == 1);
    CHECK(sb->sequence == 2);
    CHECK(sc->sequence == 3);
    CHECK(sa->bytes == 100);
    CHECK(sa->alignment == 64);
    CHECK(sb->time_ns >= sa->time_ns);
    CHECK(is_aligned(b, 256));
    CHECK(t.statistics().live_bytes == 350);
    CHECK(t.owner_live("prefill").live_bytes == 100);
    t.deallocate(s1, a, 100, 64);
    t.deallocate(s1, b, 200, 256);
    {
        host::device_guard g(5);
        t.deallocate_sync(c, 50, 16);
    }
    CHECK_FALSE(t.find(a));
    CHECK(t.statistics().live_bytes == 0);
    CHECK(t.violation_count() == 0);
}

TEST_CASE("a double free names the allocation, the first free and the second", "[debug][check]") {
    tracking_options o = quiet("df", 2);
    o.capture_stacks = true;
    inspecting_tracker t(o);
    void* p = nullptr;
    {
        owner_scope s("decode");
        p = t.allocate({}, 128, 256);
    }
    {
        owner_scope s("output");
        t.deallocate({}, p, 128, 256);
    }
    const auto upstream_before = t.upstream().statistics();
    owner_scope s("cleanup");
    const violation v = caught([&] { t.deallocate_checked({}, p, 128, 256); });
    CHECK(v.kind == violation_kind::double_free);
    CHECK(v.pointer == p);
    CHECK(v.tracker == "df");
    REQUIRE(v.has_allocated);
    CHECK(v.allocated.owner == "decode");
    CHECK(v.allocated.rank == 2);
    CHECK(v.allocated.sequence == 1);
    CHECK_FALSE(v.allocated.stack.empty());
    REQUIRE(v.has_first_free);
    CHECK(v.first_free.owner == "output");
    CHECK(v.first_free.sequence == 1);
    CHECK(v.freed.owner == "cleanup");
    CHECK(v.freed.sequence == 2);
    CHECK(v.freed.rank == 2);
    CHECK_FALSE(v.freed.stack.empty());
    CHECK(t.upstream().statistics() == upstream_before); // not forwarded
    const std::string text = v.describe();
    CHECK(text.find("double_free") != std::string::npos);
    CHECK(text.find("'decode'") != std::string::npos);
    CHECK(text.find("'output'") != std::string::npos);
    CHECK(t.violations().size() == 1);
}

TEST_CASE("a pointer never given is reported and not forwarded", "[debug][check]") {
    inspecting_tracker t(quiet("unknown"));
    alignas(256) static unsigned char foreign[64];
    const auto before = t.upstream().statistics();
    const violation v = caught([&] { t.deallocate_checked({}, foreign, 64, 256); });
    CHECK(v.kind == violation_kind::unknown_pointer);
    CHECK_FALSE(v.has_allocated);
    CHECK(v.freed.device == 0);
    CHECK(t.upstream().statistics() == before);
}

TEST_CASE("a pointer inside a live block is reported as interior, naming the block, and not forwarded",
          "[debug][check]") {
    inspecting_tracker t(quiet("interior"));
    owner_scope s("kv_cache");
    void* p = t.allocate({}, 1000, 256);
    const auto before = t.upstream().statistics();
    const auto tracked = t.statistics();
    void* inside = static_cast<unsigned char*>(p) + 384;
    const violation v = caught([&] { t.deallocate_checked({}, inside, 616, 256); });
    CHECK(v.kind == violation_kind::interior_pointer);
    CHECK(v.pointer == inside);
    REQUIRE(v.has_allocated);
    CHECK(v.allocated.owner == "kv_cache");
    CHECK(v.allocated.bytes == 1000);
    CHECK(v.detail.find("384 B inside") != std::string::npos);
    CHECK(t.upstream().statistics() == before);
    CHECK(t.statistics() == tracked);
    // One past the block's end is not inside it.
    void* past = static_cast<unsigned char*>(p) + 1000;
    CHECK(caught([&] { t.deallocate_checked({}, past, 8, 8); }).kind == violation_kind::unknown_pointer);
    t.deallocate({}, p, 1000, 256); // the block is intact and still frees right
    CHECK(t.statistics().live_allocations == 0);
}

TEST_CASE("a wrong size or alignment is reported, and the block can still be freed right", "[debug][check]") {
    inspecting_tracker t(quiet("size"));
    owner_scope s("weights");
    void* p = t.allocate({}, 1000, 256);
    const auto before = t.upstream().statistics();
    violation v = caught([&] { t.deallocate_checked({}, p, 999, 256); });
    CHECK(v.kind == violation_kind::wrong_size);
    CHECK(v.allocated.bytes == 1000);
    CHECK(v.freed.bytes == 999);
    CHECK(v.allocated.owner == "weights");
    CHECK(v.detail.find("999") != std::string::npos);
    v = caught([&] { t.deallocate_checked({}, p, 1000, 64); });
    CHECK(v.kind == violation_kind::wrong_alignment);
    CHECK(v.freed.alignment == 64);
    CHECK(t.upstream().statistics() == before);
    CHECK(t.find(p)); // still live
    t.deallocate_checked({}, p, 1000, 256);
    CHECK(t.upstream().statistics().live_bytes == 0);
    CHECK(t.violation_count() == 2);
}

TEST_CASE("a free on another device names both devices", "[debug][check]") {
    tracker t(quiet("dev", 1));
    host::stream on1(1);
    host::stream on2(2);
    owner_scope s("layer.0");
    void* p = t.allocate(on1, 256, 256);
    violation v = caught([&] { t.deallocate_checked(on2, p, 256, 256); });
    CHECK(v.kind == violation_kind::wrong_device);
    CHECK(v.allocated.device == 1);
    CHECK(v.freed.device == 2);
    CHECK(v.allocated.stream == key(on1));
    CHECK(v.freed.stream == key(on2));
    CHECK(v.allocated.rank == 1);
    CHECK(v.allocated.owner == "layer.0");
    t.deallocate_checked(on1, p, 256, 256);

    // Synchronously: the current device at free against the one at allocation.
    void* q = nullptr;
    {
        host::device_guard g(3);
        q = t.allocate_sync(64, 64);
    }
    {
        host::device_guard g(4);
        v = caught([&] { t.deallocate_sync_checked(q, 64, 64); });
    }
    CHECK(v.kind == violation_kind::wrong_device);
    CHECK(v.allocated.device == 3);
    CHECK(v.freed.device == 4);
    CHECK(v.freed.synchronous);
    {
        host::device_guard g(3);
        t.deallocate_sync_checked(q, 64, 64);
    }
    CHECK(t.statistics().live_allocations == 0);
}

TEST_CASE("a free through another tracker names the tracker that owns the block", "[debug][check]") {
    tracker a(quiet("model_pool"));
    inspecting_tracker b(quiet("scratch"));
    owner_scope s("decoder/layer.7");
    void* p = a.allocate({}, 512, 256);
    const auto before = b.upstream().statistics();
    const violation v = caught([&] { b.deallocate_checked({}, p, 512, 256); });
    CHECK(v.kind == violation_kind::foreign_free);
    CHECK(v.tracker == "scratch");
    CHECK(v.other_tracker == "model_pool");
    REQUIRE(v.has_allocated);
    CHECK(v.allocated.owner == "decoder/layer.7");
    CHECK(v.allocated.bytes == 512);
    CHECK(b.upstream().statistics() == before);
    CHECK(a.find(p));
    a.deallocate({}, p, 512, 256);
    CHECK(a.violation_count() == 0);
}

TEST_CASE("a free on an unordered other stream is a hazard until ordered", "[debug][check][stream]") {
    tracker t(quiet("hazard"));
    host::stream s1(0);
    host::stream s2(0);
    owner_scope scope("prefill/attn");
    void* p = t.allocate(s1, 4096, 256);
    violation v = caught([&] { t.deallocate_checked(s2, p, 4096, 256); });
    CHECK(v.kind == violation_kind::stream_hazard);
    CHECK(v.allocated.stream == key(s1));
    CHECK(v.freed.stream == key(s2));
    CHECK(v.allocated.owner == "prefill/attn");
    CHECK(v.allocated.device == 0);
    CHECK(v.freed.device == 0);

    // order_before_free makes s2 wait for s1: now the free is right, and really ordered.
    std::atomic<bool> s1_done{false};
    {
        test::stream_gate<P> gate(s1);
        s1.view().enqueue([&] { s1_done = true; });
        t.order_before_free(p, s2);
        t.deallocate_checked(s2, p, 4096, 256);
        std::atomic<bool> seen_on_s2{false};
        s2.view().enqueue([&] { seen_on_s2 = s1_done.load(); });
        gate.open();
        P::synchronize(s2);
        CHECK(seen_on_s2.load());
    }

    // A use recorded on s2 makes a free on s1 a hazard too; declare_ordered clears it.
    void* q = t.allocate(s1, 64, 64);
    t.record_use(q, s2);
    v = caught([&] { t.deallocate_checked(s1, q, 64, 64); });
    CHECK(v.kind == violation_kind::stream_hazard);
    CHECK(v.freed.stream == key(s1));
    CHECK(v.detail.find("stream") != std::string::npos);
    t.declare_ordered(q, s1);
    t.deallocate_checked(s1, q, 64, 64);
    CHECK_THROWS_AS(t.record_use(q, s2), std::invalid_argument); // no longer live
    P::synchronize(s1);
    CHECK(t.statistics().live_allocations == 0);
}

TEST_CASE("under throw_error a violation in noexcept deallocate is thrown by the next call", "[debug][policy]") {
    tracker t(quiet("pending"));
    void* p = t.allocate({}, 64, 64);
    t.deallocate({}, p, 64, 64);
    t.deallocate({}, p, 64, 64); // noexcept: kept
    const violation v = caught([&] { static_cast<void>(t.allocate({}, 64, 64)); });
    CHECK(v.kind == violation_kind::double_free);
    CHECK(t.statistics().live_allocations == 0); // the throwing allocate allocated nothing
    t.rethrow_pending();                         // nothing left
    void* q = t.allocate({}, 64, 64);
    t.deallocate({}, q, 64, 64);
}

TEST_CASE("policies log and callback report and go on", "[debug][policy]") {
    SECTION("log") {
        test::failure_log log;
        tracking_options o = quiet("logged");
        o.on_violation = policy::log;
        tracker t(o);
        owner_scope s("output");
        void* p = t.allocate({}, 32, 32);
        t.deallocate({}, p, 16, 32);
        const auto lines = log.lines();
        REQUIRE(lines.size() == 1);
        CHECK(lines[0].find("wrong_size") != std::string::npos);
        CHECK(lines[0].find("'output'") != std::string::npos);
        t.deallocate({}, p, 32, 32);
    }
    SECTION("callback") {
        std::vector<violation> seen;
        tracking_options o = quiet("called");
        o.on_violation = policy::callback;
        o.violation_callback = [&](const violation& v) { seen.push_back(v); };
        tracker t(o);
        int x = 0;
        t.deallocate({}, &x, 4, 4);
        REQUIRE(seen.size() == 1);
        CHECK(seen[0].kind == violation_kind::unknown_pointer);
        CHECK(seen[0].pointer == &x);
    }
}

TEST_CASE("canaries catch an overflow and an underflow, on the default stream and on a stream", "[debug][canary]") {
    tracker t(quiet("canary"));
    owner_scope s("decode/logits");
    SECTION("overflow by one byte") {
        auto* p = static_cast<unsigned char*>(t.allocate({}, 100, 64));
        p[100] = 0; // one past the end
        const violation v = caught([&] { t.deallocate_checked({}, p, 100, 64); });
        CHECK(v.kind == violation_kind::buffer_overflow);
        CHECK(v.allocated.owner == "decode/logits");
        CHECK(v.detail.find("offset 100") != std::string::npos);
        CHECK(t.statistics().live_allocations == 0); // the free itself went through
    }
    SECTION("underflow") {
        auto* p = static_cast<unsigned char*>(t.allocate({}, 64, 256));
        CHECK(is_aligned(p, 256));
        p[-3] = 1;
        const violation v = caught([&] { t.deallocate_checked({}, p, 64, 256); });
        CHECK(v.kind == violation_kind::buffer_underflow);
        CHECK(v.detail.find("guard byte 3 before") != std::string::npos);
    }
    SECTION("an overflow written by work on a stream is found once the stream gets there") {
        host::stream st(2);
        auto* p = static_cast<unsigned char*>(t.allocate(st, 4096, 256));
        {
            test::stream_gate<P> gate(st);
            st.view().enqueue([p] { p[4096 + 10] = 0x00; });
            t.deallocate(st, p, 4096, 256); // does not wait for the stream
            gate.open();
        }
        const violation v = caught([&] { t.check_guards(); });
        CHECK(v.kind == violation_kind::buffer_overflow);
        CHECK(v.allocated.device == 2);
        CHECK(v.freed.stream == key(st));
    }
    SECTION("in-bounds writes are fine") {
        auto* p = static_cast<unsigned char*>(t.allocate({}, 100, 64));
        std::memset(p, 0xCB ^ 0xFF, 100);
        t.deallocate_checked({}, p, 100, 64);
        CHECK(t.violation_count() == 0);
    }
}

TEST_CASE("canaries switched off catch nothing and cost no extra bytes", "[debug][canary]") {
    tracking_options o = quiet("nocanary");
    o.canaries = false;
    tracking_resource<test::inspecting_upstream> t(o);
    auto* p = static_cast<unsigned char*>(t.allocate({}, 100, 64));
    CHECK(t.upstream().statistics().live_bytes == 100);
    p[99] = 7;
    t.deallocate_checked({}, p, 100, 64);
    CHECK(t.violation_count() == 0);
}

TEST_CASE("freed memory is poisoned with NaN bytes before it goes back upstream", "[debug][poison]") {
    SECTION("on") {
        inspecting_tracker t(quiet("poison"));
        auto* p = static_cast<float*>(t.allocate({}, 64 * sizeof(float), 256));
        for (int i = 0; i < 64; ++i) p[i] = 1.0f;
        t.deallocate({}, p, 64 * sizeof(float), 256);
        const auto bytes = t.upstream().last_freed();
        REQUIRE(bytes.size() >= 64 * sizeof(float));
        for (unsigned char b : bytes) CHECK(b == 0xFF);
        float f = 0;
        std::memcpy(&f, bytes.data(), sizeof f);
        CHECK(std::isnan(f));
    }
    SECTION("on a stream, after the stream's work") {
        inspecting_tracker t(quiet("poison-stream"));
        host::stream st(0);
        auto* p = static_cast<unsigned char*>(t.allocate(st, 256, 256));
        st.view().enqueue([p] { std::memset(p, 0x11, 256); });
        t.deallocate(st, p, 256, 256);
        P::synchronize(st);
        for (unsigned char b : t.upstream().last_freed()) CHECK(b == 0xFF);
    }
    SECTION("off") {
        tracking_options o = quiet("nopoison");
        o.poison = false;
        o.canaries = false;
        inspecting_tracker t(o);
        auto* p = static_cast<unsigned char*>(t.allocate({}, 32, 32));
        std::memset(p, 0x11, 32);
        t.deallocate({}, p, 32, 32);
        for (unsigned char b : t.upstream().last_freed()) CHECK(b == 0x11);
    }
}

// External linkage and -rdynamic (tests/debug/meson.build): the report can name these functions.
// The barrier after the call keeps it from becoming a tail call, which would leave no frame.
namespace custody_test_sites {
[[gnu::noinline]] void* allocate_from_site_a(tracker& t) {
    void* p = t.allocate({}, 10, 16);
    asm volatile("" ::: "memory");
    return p;
}
[[gnu::noinline]] void* allocate_from_site_b(tracker& t) {
    void* p = t.allocate({}, 10, 16);
    asm volatile("" ::: "memory");
    return p;
}
} // namespace custody_test_sites
using custody_test_sites::allocate_from_site_a;
using custody_test_sites::allocate_from_site_b;

TEST_CASE("the leak report groups live memory by owner and call stack, exactly", "[debug][leak]") {
    tracker t(quiet("leaks"));
    std::vector<std::pair<void*, std::size_t>> blocks;
    {
        owner_scope s("prefill");
        for (int i = 0; i < 3; ++i) blocks.emplace_back(t.allocate({}, 100, 64), 100);
    }
    {
        owner_scope s("decode");
        for (int i = 0; i < 2; ++i) blocks.emplace_back(t.allocate({}, 50, 64), 50);
        void* gone = t.allocate({}, 999, 64);
        t.deallocate({}, gone, 999, 64);
    }
    blocks.emplace_back(t.allocate({}, 7, 64), 7);
    const leak_report r = t.leaks();
    CHECK(r.total_bytes == 407);
    CHECK(r.total_count == 6);
    REQUIRE(r.groups.size() == 3);
    CHECK(r.groups[0].owner == "prefill");
    CHECK(r.groups[0].bytes == 300);
    CHECK(r.groups[0].count == 3);
    CHECK(r.groups[0].first_sequence == 1);
    CHECK(r.groups[1].owner == "decode");
    CHECK(r.groups[1].bytes == 100);
    CHECK(r.groups[1].count == 2);
    CHECK(r.groups[2].owner == "<untagged>");
    CHECK(r.groups[2].bytes == 7);
    CHECK(r.groups[2].devices == std::vector<int>{0});
    for (auto [p, n] : blocks) t.deallocate({}, p, n, 64);
    CHECK(t.leaks().empty());
}

TEST_CASE("with call stacks, one owner's leaks split by call site", "[debug][leak]") {
    tracking_options o = quiet("stacks");
    o.capture_stacks = true;
    tracker t(o);
    owner_scope s("cache");
    std::vector<void*> blocks;
    volatile int twice = 2; // not unrolled: one call site, twice
    for (int i = 0; i < twice; ++i) blocks.push_back(allocate_from_site_a(t));
    blocks.push_back(allocate_from_site_b(t));
    const leak_report r = t.leaks();
    REQUIRE(r.groups.size() == 2);
    CHECK(r.groups[0].owner == "cache");
    CHECK(r.groups[0].count == 2);
    CHECK(r.groups[1].count == 1);
    CHECK_FALSE(r.groups[0].stack.empty());
    CHECK(r.groups[0].stack != r.groups[1].stack);
    // Each report starts at the application's call site, not inside the tracker.
    REQUIRE_FALSE(r.groups[1].stack.empty());
    const bool a_first = r.groups[0].stack.front().find("allocate_from_site_a") != std::string::npos;
    const auto& site_a = a_first ? r.groups[0].stack : r.groups[1].stack;
    const auto& site_b = a_first ? r.groups[1].stack : r.groups[0].stack;
    CHECK_THAT(site_a.front(), custody_test::contains("allocate_from_site_a"));
    CHECK_THAT(site_b.front(), custody_test::contains("allocate_from_site_b"));
    for (void* p : blocks) t.deallocate({}, p, 10, 16);
}

TEST_CASE("leaks at destruction go to the policy and the memory goes back upstream", "[debug][leak]") {
    leak_report seen;
    {
        tracking_options o = quiet("dying", 5);
        o.on_leak = policy::callback;
        o.leak_callback = [&](const leak_report& r) { seen = r; };
        tracker t(o);
        owner_scope s("output");
        static_cast<void>(t.allocate({}, 300, 256));
        static_cast<void>(t.allocate({}, 200, 256));
    } // LeakSanitizer would fail the suite if the blocks were not given back
    CHECK(seen.rank == 5);
    CHECK(seen.total_bytes == 500);
    CHECK(seen.total_count == 2);
    REQUIRE(seen.groups.size() == 1);
    CHECK(seen.groups[0].owner == "output");

    test::failure_log log;
    {
        tracking_options o = quiet("dying-logged");
        o.on_leak = policy::log;
        tracker t(o);
        static_cast<void>(t.allocate({}, 64, 64));
    }
    const auto lines = log.lines();
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("dying-logged") != std::string::npos);
    CHECK(lines[0].find("64 B") != std::string::npos);
}

TEST_CASE("diff lists what appeared between two snapshots and did not go away", "[debug][snapshot]") {
    tracker t(quiet("snap"));
    void* base = t.allocate({}, 1000, 64, "weights");
    const snapshot a = t.snapshot();
    void* kept1 = t.allocate({}, 40, 64, "decode/kv");
    void* kept2 = t.allocate({}, 60, 64, "decode/kv");
    void* temp = t.allocate({}, 500, 64, "decode/scratch");
    void* out = t.allocate({}, 8, 64, "output");
    t.deallocate({}, temp, 500, 64);
    t.deallocate({}, base, 1000, 64); // went away: not in the diff either
    const snapshot b = t.snapshot();
    CHECK(a.entries.size() == 1);
    CHECK(b.entries.size() == 3);
    CHECK(b.live_bytes() == 108);
    const leak_report d = diff(a, b);
    CHECK(d.total_bytes == 108);
    CHECK(d.total_count == 3);
    REQUIRE(d.groups.size() == 2);
    CHECK(d.groups[0].owner == "decode/kv");
    CHECK(d.groups[0].bytes == 100);
    CHECK(d.groups[0].count == 2);
    CHECK(d.groups[1].owner == "output");
    CHECK(d.groups[1].bytes == 8);
    CHECK(diff(b, b).empty());
    for (auto [p, n] : {std::pair{kept1, 40}, std::pair{kept2, 60}, std::pair{out, 8}})
        t.deallocate({}, p, static_cast<std::size_t>(n), 64);
}

TEST_CASE("watches fire on a threshold and on growth across consecutive snapshots", "[debug][watch]") {
    tracker t(quiet("watched", 1));
    std::vector<watch_event> events;
    watch w;
    w.what = watch::subject::owner;
    w.owner = "decode/kv";
    w.threshold_bytes = 1000;
    w.callback = [&](const watch_event& e) { events.push_back(e); };
    const int id = t.add_watch(w);
    watch d;
    d.what = watch::subject::device;
    d.device = 0;
    d.growth_snapshots = 3;
    d.callback = [&](const watch_event& e) { events.push_back(e); };
    const int growth_id = t.add_watch(d);

    std::vector<void*> kv;
    for (int i = 0; i < 4; ++i) kv.push_back(t.allocate({}, 300, 64, "decode/kv")); // 1200 > 1000 at the 4th
    REQUIRE(events.size() == 1);
    CHECK(events[0].watch_id == id);
    CHECK(events[0].subject == "owner 'decode/kv'");
    CHECK(events[0].owner == "decode/kv");
    CHECK(events[0].device == -1);
    CHECK(events[0].live_bytes == 1200);
    CHECK(events[0].rank == 1);
    CHECK_FALSE(events[0].growth);
    kv.push_back(t.allocate({}, 300, 64, "decode/kv")); // still above: no second alarm
    CHECK(events.size() == 1);
    for (int i = 0; i < 3; ++i) {
        t.deallocate({}, kv.back(), 300, 64);
        kv.pop_back();
    } // 600: re-armed by the second sample that finds it at or below 1000 (the first's step began above)
    static_cast<void>(t.snapshot());
    static_cast<void>(t.snapshot());
    kv.push_back(t.allocate({}, 300, 64, "decode/kv"));
    kv.push_back(t.allocate({}, 300, 64, "decode/kv")); // 1200 again
    REQUIRE(events.size() == 2);
    CHECK(events[1].live_bytes == 1200);

    // Growth: a slow leak seen by snapshots. First snapshot sets the base.
    std::vector<void*> leak;
    static_cast<void>(t.snapshot());
    for (int i = 0; i < 3; ++i) {
        leak.push_back(t.allocate({}, 10, 64, "slow_leak"));
        static_cast<void>(t.snapshot());
    }
    REQUIRE(events.size() == 3);
    CHECK(events[2].watch_id == growth_id);
    CHECK(events[2].growth);
    CHECK(events[2].consecutive_growths == 3);
    CHECK(events[2].subject == "device 0");
    CHECK(events[2].owner.empty());
    CHECK(events[2].device == 0);
    static_cast<void>(t.snapshot()); // no growth: streak resets, nothing fires
    CHECK(events.size() == 3);
    CHECK(t.remove_watch(id));
    CHECK_FALSE(t.remove_watch(id));
    for (void* p : kv) t.deallocate({}, p, 300, 64);
    for (void* p : leak) t.deallocate({}, p, 10, 64);
    CHECK_THROWS_AS(t.add_watch(watch{}), std::invalid_argument);
}

TEST_CASE("bad arguments change nothing", "[debug][errors]") {
    tracker t(quiet("args"));
    void* held = t.allocate({}, 10, 16);
    const auto before = t.statistics();
    CHECK_THROWS_AS(t.allocate({}, 10, 3), std::invalid_argument);
    CHECK_THROWS_AS(t.allocate({}, SIZE_MAX - 8, 16), std::bad_alloc);
    CHECK_THROWS_AS(t.allocate({}, std::size_t{1} << 50, 16), custody::out_of_memory);
    CHECK(t.statistics() == before);
    CHECK(t.leaks().total_count == 1);
    tracking_options o;
    o.guard_bytes = 1000;
    CHECK_THROWS_AS(tracker(o), std::invalid_argument);
    tracking_options bad_rank;
    bad_rank.rank = rank_info{3, 0, 2, -1, "caller"};
    CHECK_THROWS_AS(tracker(bad_rank), custody::rank_error);
    t.deallocate({}, held, 10, 16);
}

TEST_CASE("the tracker over a virtual device forwards its device and exhaustion", "[debug]") {
    tracking_resource<host::simulated_device_memory> t(quiet("vdm"), 3, std::size_t{1} << 20);
    CHECK(t.device() == 3);
    void* p = t.allocate({}, 1000, 256);
    CHECK(t.upstream().used() == align_up(64, 256) + 1000 + 64);
    try {
        static_cast<void>(t.allocate({}, std::size_t{2} << 20, 256));
        FAIL("no out_of_memory");
    } catch (const out_of_memory& e) {
        CHECK(e.requested() == (std::size_t{2} << 20));
        CHECK(e.device() == 3);
    }
    t.deallocate({}, p, 1000, 256);
}

TEST_CASE("8 threads with their own owners allocate and free through one tracker", "[debug][threads]") {
    tracker t(quiet("threads"));
    constexpr int threads = 8;
    std::latch start(threads);
    std::vector<std::thread> pool;
    std::vector<void*> kept(threads);
    for (int i = 0; i < threads; ++i) {
        pool.emplace_back([&, i] {
            owner_scope s("worker." + std::to_string(i));
            start.arrive_and_wait();
            for (int k = 0; k < 200; ++k) {
                void* p = t.allocate({}, 64 + static_cast<std::size_t>(k), 64);
                t.deallocate({}, p, 64 + static_cast<std::size_t>(k), 64);
            }
            kept[static_cast<std::size_t>(i)] = t.allocate({}, static_cast<std::size_t>(i + 1) * 10, 64);
        });
    }
    for (auto& th : pool) th.join();
    const leak_report r = t.leaks();
    CHECK(r.total_count == threads);
    for (int i = 0; i < threads; ++i) {
        CHECK(r.owner_totals("worker." + std::to_string(i)).first == static_cast<std::size_t>(i + 1) * 10);
    }
    CHECK(t.violation_count() == 0);
    for (int i = 0; i < threads; ++i) t.deallocate({}, kept[static_cast<std::size_t>(i)], static_cast<std::size_t>(i + 1) * 10, 64);
    CHECK(t.statistics().allocations == threads * 201);
}

TEST_CASE("try_allocate records like allocate and returns null when the upstream is exhausted", "[debug]") {
    tracking_resource<host::simulated_device_memory> t(quiet("try"), 1, std::size_t{1} << 16);
    owner_scope s("prefill");
    void* p = t.try_allocate({}, 1000, 256);
    REQUIRE(p != nullptr);
    CHECK(t.find(p)->owner == "prefill");
    const auto before = t.statistics();
    CHECK(t.try_allocate({}, std::size_t{1} << 20, 256) == nullptr);
    CHECK(t.try_allocate({}, 0, 256) == nullptr);
    CHECK(t.statistics() == before);
    t.deallocate({}, p, 1000, 256);
}

TEST_CASE("the oldest remembered frees are forgotten beyond remembered_frees", "[debug][check]") {
    tracking_options o = quiet("ring");
    o.remembered_frees = 2;
    tracker t(o);
    std::vector<void*> blocks;
    for (int i = 0; i < 3; ++i) blocks.push_back(t.allocate({}, 64, 64)); // three distinct addresses
    for (void* p : blocks) t.deallocate({}, p, 64, 64);
    // The first free was forgotten: its second free can only be an unknown pointer.
    CHECK(caught([&] { t.deallocate_checked({}, blocks[0], 64, 64); }).kind == violation_kind::unknown_pointer);
    const violation v = caught([&] { t.deallocate_checked({}, blocks[2], 64, 64); });
    CHECK(v.kind == violation_kind::double_free);
    CHECK(v.first_free.sequence == 3);

    tracking_options none = quiet("none");
    none.remembered_frees = 0;
    tracker u(none);
    void* p = u.allocate({}, 64, 64);
    u.deallocate({}, p, 64, 64);
    CHECK(caught([&] { u.deallocate_checked({}, p, 64, 64); }).kind == violation_kind::unknown_pointer);
}

TEST_CASE("the tracker is a custody resource", "[debug]") {
    static_assert(try_allocatable_resource<tracker>);
    static_assert(resource_with_statistics<tracker>);
    static_assert(device_bound_resource<tracker>);
    static_assert(has_property<tracker, host_accessible> && !has_property<tracker, device_accessible>);
    static_assert(has_property<tracking_resource<host::simulated_device_memory>, device_accessible>);
    tracker a(quiet("a"));
    tracker b(quiet("b"));
    CHECK(a == a);
    CHECK_FALSE(a == b);
    CHECK(a.device() == -1);
}

TEST_CASE("threads freeing through each other's trackers get foreign_free reports and no deadlock",
          "[debug][threads][check]") {
    tracking_options oa = quiet("A");
    oa.on_violation = policy::ignore;
    tracking_options ob = quiet("B");
    ob.on_violation = policy::ignore;
    tracker a(oa);
    tracker b(ob);
    constexpr int threads = 4;
    constexpr int rounds = 100;
    std::latch start(threads);
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) {
        pool.emplace_back([&, i] {
            tracker& mine = i % 2 == 0 ? a : b;
            tracker& other = i % 2 == 0 ? b : a;
            start.arrive_and_wait();
            for (int k = 0; k < rounds; ++k) {
                void* p = mine.allocate({}, 128, 64);
                other.deallocate({}, p, 128, 64); // wrong tracker: reported, not forwarded
                mine.deallocate({}, p, 128, 64);  // right one
            }
        });
    }
    for (auto& th : pool) th.join();
    CHECK(a.violation_count() == threads / 2 * rounds);
    CHECK(b.violation_count() == threads / 2 * rounds);
    for (const violation& v : a.violations()) {
        CHECK(v.kind == violation_kind::foreign_free);
        CHECK(v.other_tracker == "B");
    }
    CHECK(a.statistics().live_allocations == 0);
    CHECK(b.statistics().live_allocations == 0);
}

namespace {
/// Hands out one static block, again and again: two trackers over it see the same address.
struct one_block_upstream {
    using stream_type = host::stream_view;
    alignas(256) static inline unsigned char block[1024];
    static inline std::atomic<bool> taken{false};
    void* allocate(stream_type, std::size_t bytes, std::size_t alignment) {
        check_alignment(alignment);
        if (bytes == 0) return nullptr;
        if (bytes > sizeof block || taken.exchange(true)) throw out_of_memory(bytes, alignment, -1, {}, "one_block");
        return block;
    }
    void deallocate(stream_type, void* p, std::size_t, std::size_t) noexcept {
        if (p != nullptr) taken = false;
    }
    void* allocate_sync(std::size_t n, std::size_t a) { return allocate({}, n, a); }
    void deallocate_sync(void* p, std::size_t n, std::size_t a) noexcept { deallocate({}, p, n, a); }
    friend bool operator==(const one_block_upstream&, const one_block_upstream&) noexcept { return true; }
};
} // namespace

TEST_CASE("a wrong-tracker free at an address this tracker once freed is still a foreign free", "[debug][check]") {
    tracking_options o = quiet("first");
    o.canaries = false;
    tracking_resource<one_block_upstream> first(o);
    o.name = "second";
    tracking_resource<one_block_upstream> second(o);
    void* p = first.allocate({}, 96, 64);
    first.deallocate({}, p, 96, 64); // remembered by `first`
    void* q = second.allocate({}, 96, 64, "decode");
    REQUIRE(q == p);
    violation v;
    try {
        first.deallocate_checked({}, p, 96, 64);
        FAIL("no violation");
    } catch (const tracking_error& e) {
        v = e.report();
    }
    CHECK(v.kind == violation_kind::foreign_free);
    CHECK(v.other_tracker == "second");
    CHECK(v.allocated.owner == "decode");
    CHECK(second.find(p));
    second.deallocate({}, q, 96, 64);
    // Once `second` gave it back too, a free through `first` is a double free of its own block.
    try {
        first.deallocate_checked({}, p, 96, 64);
        FAIL("no violation");
    } catch (const tracking_error& e) {
        CHECK(e.kind() == violation_kind::double_free);
    }
}

// ---- policy::abort ---------------------------------------------------------------------------------

namespace {

/// Runs tests/debug/abort_worker with `mode`, stderr to a file; returns (terminating signal or 0,
/// what it wrote to stderr).
std::pair<int, std::string> run_abort_worker(const char* mode) {
    char path[] = "/tmp/custody-abort-XXXXXX";
    const int fd = ::mkstemp(path);
    REQUIRE(fd >= 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fd, 2);
    char worker[] = CUSTODY_ABORT_WORKER;
    char* argv[] = {worker, const_cast<char*>(mode), nullptr};
    pid_t pid = 0;
    const int spawned = ::posix_spawn(&pid, worker, &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(spawned == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    std::string err;
    char buffer[4096];
    ::lseek(fd, 0, SEEK_SET);
    for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) err.append(buffer, static_cast<std::size_t>(n));
    ::close(fd);
    ::unlink(path);
    return {WIFSIGNALED(status) ? WTERMSIG(status) : 0, err};
}

} // namespace

TEST_CASE("policy::abort reports the violation, then aborts", "[debug][policy]") {
    const auto [signal, err] = run_abort_worker("violation");
    CHECK(signal == SIGABRT);
    CHECK(err.find("double_free") != std::string::npos);
    CHECK(err.find("'planted'") != std::string::npos);
}

TEST_CASE("policy::abort on leaks reports the live blocks at destruction, then aborts", "[debug][policy]") {
    const auto [signal, err] = run_abort_worker("leak");
    CHECK(signal == SIGABRT);
    CHECK(err.find("planted") != std::string::npos);
    CHECK(err.find("512") != std::string::npos);
}
