// staging/staging_ring.hpp on the host platform: placement, in-order reclamation, back-pressure,
// timeouts, downloads, several producers, streams and devices, destruction, and every bad input.
#include <custody/buffer/buffer.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/staging/staging_ring.hpp>

#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using custody::host::platform;
using custody::staging::ring_options;
using custody::staging::staging_statistics;
using gate = custody::test::stream_gate<platform>;

/// Forwards to a host_memory that outlives the ring, so a test sees what the ring left behind;
/// calls `on_free` before giving the ring's region back.
struct borrowed_host {
    using stream_type = custody::host::stream_view;
    custody::resource::fault_injecting<custody::resource::host_memory>* target = nullptr;
    std::function<void()> on_free;

    void* allocate(stream_type s, std::size_t b, std::size_t a) { return target->allocate(s, b, a); }
    void deallocate(stream_type s, void* p, std::size_t b, std::size_t a) noexcept { target->deallocate(s, p, b, a); }
    void* allocate_sync(std::size_t b, std::size_t a) { return target->allocate_sync(b, a); }
    void deallocate_sync(void* p, std::size_t b, std::size_t a) noexcept {
        if (on_free) on_free();
        target->deallocate_sync(p, b, a);
    }
    friend bool operator==(const borrowed_host& x, const borrowed_host& y) noexcept { return x.target == y.target; }
    friend void get_property(const borrowed_host&, custody::host_accessible) noexcept {}
};

using ring = custody::staging::staging_ring<custody::resource::host_memory>;

ring_options opts(std::size_t capacity, std::size_t regions = 64, std::size_t chunk = 0) {
    ring_options o;
    o.capacity = capacity;
    o.max_regions = regions;
    o.chunk_bytes = chunk;
    return o;
}

std::uint64_t fnv1a(std::span<const std::byte> bytes) {
    std::uint64_t h = 1469598103934665603ULL;
    for (const std::byte b : bytes) {
        h ^= static_cast<std::uint64_t>(b);
        h *= 1099511628211ULL;
    }
    return h;
}

std::vector<std::byte> random_bytes(std::mt19937_64& rng, std::size_t n) {
    std::vector<std::byte> v(n);
    for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
    return v;
}

/// Spins (yielding) until `pred` holds: for states another thread reaches without a latch we own.
template <class Pred>
void spin_until(Pred pred) {
    while (!pred()) std::this_thread::yield();
}

/// The counters a failed call must leave as they were.
bool same_state(const staging_statistics& a, const staging_statistics& b) {
    return a.bytes_in_use == b.bytes_in_use && a.bytes_in_flight == b.bytes_in_flight &&
           a.live_regions == b.live_regions && a.reservations == b.reservations && a.commits == b.commits &&
           a.downloads == b.downloads && a.cancellations == b.cancellations;
}

} // namespace

TEST_CASE("reservations are contiguous, in order, and reclaimed only in order", "[staging]") {
    ring r(opts(4096));
    REQUIRE(r.capacity() == 4096);
    custody::host::stream slow;
    custody::host::stream fast;
    std::vector<std::byte> dst(4096);

    auto a = r.reserve<std::byte>(1024);
    auto b = r.reserve<std::byte>(1024);
    auto c = r.reserve<std::byte>(2048);
    CHECK(a.offset() == 0);
    CHECK(b.offset() == 1024);
    CHECK(c.offset() == 2048);
    CHECK(b.data() == a.data() + 1024);
    CHECK_FALSE(r.try_reserve<std::byte>(1)); // full

    gate g(slow);
    r.commit(std::move(a), dst.data(), slow);        // oldest: held back by the gate
    r.commit(std::move(b), dst.data() + 1024, fast); // later: completes at once
    r.commit(std::move(c), dst.data() + 2048, fast);
    platform::synchronize(fast);
    // b and c are done, but a is older: nothing comes back before it.
    CHECK_FALSE(r.try_reserve<std::byte>(1));
    CHECK(r.statistics().bytes_in_flight == 4096);
    g.open();
    platform::synchronize(slow);
    auto d = r.reserve<std::byte>(1024);
    CHECK(d.offset() == 0); // the wrap: back at the start once the oldest returned
    CHECK(r.statistics().bytes_in_flight == 0);
}

TEST_CASE("a reservation never straddles the wrap, at every offset", "[staging]") {
    constexpr std::size_t cap = 1024;
    ring r(opts(cap));
    const custody::host::stream_view inline_stream{}; // runs copies at once in this thread
    std::vector<std::byte> dst(cap);
    for (std::size_t o = 1; o < cap; ++o) {
        // A full-ring region always lands at offset 0 and leaves the head at a lap boundary.
        auto x = r.reserve<std::byte>(cap);
        REQUIRE(x.offset() == 0);
        r.commit(std::move(x), dst.data(), inline_stream);

        auto a = r.reserve<std::byte>(o);
        REQUIRE(a.offset() == 0);
        // One byte more than is left before the wrap would need a's bytes: no room while a is held.
        CHECK_FALSE(r.try_reserve<std::byte>(cap - o + 1));
        auto c = r.reserve<std::byte>(cap - o); // exactly the rest: fits up to the wrap
        REQUIRE(c.offset() == o);
        REQUIRE(c.offset() + c.size_bytes() == cap);
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::byte>(o + i);
        for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<std::byte>(o + a.size() + i);
        r.commit(std::move(a), dst.data(), inline_stream);
        r.commit(std::move(c), dst.data() + o, inline_stream);
        for (std::size_t i = 0; i < cap; ++i) REQUIRE(dst[i] == static_cast<std::byte>(o + i));

        // Next: the head sits at the wrap; a one-byte region starts the next lap at 0.
        auto d = r.reserve<std::byte>(1);
        REQUIRE(d.offset() == 0);
        d.reset();

        // And with the head at o, a region one byte too long for the rest of the lap starts at 0.
        auto e = r.reserve<std::byte>(o);
        r.commit(std::move(e), dst.data(), inline_stream);
        REQUIRE(r.reserve<std::byte>(cap - o + 1).offset() == 0);
    }
    CHECK(r.statistics().peak_bytes_in_use <= cap);
}

TEST_CASE("typed reservations keep their alignment across the wrap", "[staging]") {
    ring r(opts(1024));
    custody::host::stream s;
    std::vector<std::uint64_t> dst(128);
    auto a = r.reserve<std::byte>(3);
    auto b = r.reserve<std::uint64_t>(10);
    CHECK(b.offset() == 8);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % alignof(std::uint64_t) == 0);
    a.reset();
    std::iota(b.begin(), b.end(), std::uint64_t{7});
    r.commit(std::move(b), dst.data(), s);
    auto c = r.reserve<std::uint64_t>(128 - 11); // up to the wrap
    CHECK(c.offset() == 88);
    c.reset();
    platform::synchronize(s);
    auto d = r.reserve<std::uint64_t>(2);
    CHECK(d.offset() == 0);
    CHECK(dst[0] == 7);
    CHECK(dst[9] == 16);
}

TEST_CASE("a full ring makes a producer wait for the slow consumer, never overflow", "[staging]") {
    constexpr std::size_t cap = 4096;
    ring r(opts(cap, 64, 1024));
    custody::host::stream s;
    std::mt19937_64 rng(42);
    const auto src = random_bytes(rng, 64 * 1024);
    std::vector<std::byte> dst(src.size());

    gate g(s); // the consumer has not started
    std::thread producer([&] { r.copy_to_device(std::span<const std::byte>(src), dst.data(), s); });
    // The ring holds four chunks; the fifth must wait.
    spin_until([&] { return r.statistics().waits >= 1; });
    const auto mid = r.statistics();
    CHECK(mid.bytes_in_use == cap);
    CHECK(mid.commits == 4);
    g.open();
    producer.join();
    platform::synchronize(s);
    r.synchronize();
    const auto st = r.statistics();
    CHECK(st.commits == 64);
    CHECK(st.waits >= 1);
    CHECK(st.wait_time.count() > 0);
    CHECK(st.peak_bytes_in_use <= cap);
    CHECK(st.bytes_in_use == 0);
    CHECK(fnv1a(dst) == fnv1a(src));
}

TEST_CASE("reserve with a timeout ends in timeout_error and leaves the ring as it was", "[staging]") {
    ring r(opts(2048));
    custody::host::stream s;
    std::vector<std::byte> dst(2048);

    SECTION("the oldest region is a copy in flight") {
        gate g(s);
        r.commit(r.reserve<std::byte>(2048), dst.data(), s);
        const auto before = r.statistics();
        CHECK_THROWS_AS(r.reserve<std::byte>(1, std::chrono::milliseconds(1)), custody::staging::timeout_error);
        const auto after = r.statistics();
        CHECK(same_state(before, after));
        CHECK(after.timeouts == 1);
        CHECK(after.waits == before.waits + 1);
        CHECK_THROWS_AS(r.reserve<std::byte>(1, std::chrono::seconds(-1)), custody::staging::timeout_error);
        g.open();
        auto ok = r.reserve<std::byte>(1, std::chrono::hours::max()); // saturates: waits as long as it takes
        CHECK(ok.offset() == 0);
    }
    SECTION("the oldest region is a reservation nobody commits") {
        auto held = r.reserve<std::byte>(2048);
        try {
            static_cast<void>(r.reserve<std::byte>(16, std::chrono::microseconds(500)));
            FAIL("no timeout");
        } catch (const custody::staging::timeout_error& e) {
            CHECK(e.requested_bytes() == 16);
            CHECK(e.timeout() == std::chrono::microseconds(500));
        }
        CHECK(r.statistics().live_regions == 1);
        held.reset();
        CHECK(r.reserve<std::byte>(16, std::chrono::microseconds(500)).offset() == 0);
    }
    SECTION("a download waits for room with a timeout too") {
        auto held = r.reserve<std::byte>(2048);
        CHECK_THROWS_AS(r.stage(dst.data(), 8, s, std::chrono::microseconds(200)), custody::staging::timeout_error);
        CHECK(r.statistics().downloads == 0);
    }
}

TEST_CASE("a request larger than the ring is a length_error and changes nothing", "[staging]") {
    ring r(opts(1000)); // rounded up to 1024
    CHECK(r.capacity() == 1024);
    const auto before = r.statistics();
    CHECK_THROWS_AS(r.reserve<std::byte>(1025), std::length_error);
    CHECK_THROWS_AS(r.try_reserve<std::uint32_t>(257), std::length_error);
    CHECK_THROWS_AS(r.reserve<std::uint64_t>(SIZE_MAX / 4), std::length_error); // size overflow
    std::vector<std::byte> src(8);
    CHECK_THROWS_AS(r.stage(src.data(), 1025, custody::host::stream_view{}), std::length_error);
    CHECK(same_state(before, r.statistics()));
    CHECK(r.reserve<std::byte>(1024).size() == 1024); // the whole ring is fine
}

TEST_CASE("the default chunk is a quarter of the ring, at most 2 MiB", "[staging]") {
    CHECK(ring(opts(4096)).chunk_bytes() == 1024);
    CHECK(ring(opts(std::size_t{32} << 20)).chunk_bytes() == (std::size_t{2} << 20));
    CHECK(ring(opts(4096, 8, 100)).chunk_bytes() == 100);
    CHECK(ring(opts(4096, 8, 1 << 20)).chunk_bytes() == 4096);
}

TEST_CASE("copy_to_device streams transfers of any size through the ring, intact", "[staging]") {
    std::mt19937_64 rng(7);
    ring r(opts(8192, 16, 2048));
    custody::host::stream s;
    for (int round = 0; round < 40; ++round) {
        const std::size_t n = 1 + rng() % 50000;
        const auto src = random_bytes(rng, n);
        std::vector<std::byte> dst(n);
        r.copy_to_device(std::span<const std::byte>(src), std::span<std::byte>(dst), s);
        std::vector<std::byte> back(n);
        r.copy_from_device(dst.data(), std::span<std::byte>(back), s);
        REQUIRE(fnv1a(dst) == fnv1a(src));
        REQUIRE(fnv1a(back) == fnv1a(src));
    }
    r.synchronize();
    const auto st = r.statistics();
    CHECK(st.bytes_in_use == 0);
    CHECK(st.bytes_uploaded == st.bytes_downloaded);
}

TEST_CASE("a commit into a buffer of another stream waits for the buffer's stream first", "[staging][buffer]") {
    ring r(opts(4096));
    custody::resource::host_memory memory;
    custody::host::stream compute;
    custody::host::stream copy;
    custody::buffer<int, platform, custody::host_accessible> weights(64, compute.view(), memory);
    // Work enqueued earlier on the buffer's stream still writes its memory (a pool's block given
    // back there and handed out again is exactly this), held until the gate opens.
    gate held(compute.view());
    compute.view().enqueue([&] { std::fill(weights.data(), weights.data() + weights.size(), -1); });
    auto res = r.reserve<int>(64);
    std::iota(res.span().begin(), res.span().end(), 0);
    r.commit(std::move(res), weights, copy.view());
    custody::host::event copied;
    copied.record(copy.view());
    // Unordered, the copy would run now and the compute stream's write would land after it.
    for (int i = 0; i < 200 && !copied.ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK_FALSE(copied.ready());
    held.open();
    platform::synchronize(copy.view());
    platform::synchronize(compute.view());
    std::vector<int> expected(64);
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(std::vector<int>(weights.data(), weights.data() + weights.size()) == expected);
}

TEST_CASE("reserve and commit of random sizes keep every byte, with the source reused at once", "[staging]") {
    std::mt19937_64 rng(99);
    ring r(opts(4096, 8));
    custody::host::stream s;
    std::vector<std::uint32_t> dst(200000);
    std::vector<std::uint32_t> expected(dst.size());
    std::size_t at = 0;
    while (at < dst.size()) {
        const std::size_t n = std::min<std::size_t>(1 + rng() % 1024, dst.size() - at);
        auto res = r.reserve<std::uint32_t>(n);
        for (std::size_t i = 0; i < n; ++i) res[i] = expected[at + i] = static_cast<std::uint32_t>(rng());
        r.commit(std::move(res), std::span<std::uint32_t>(dst).subspan(at), s);
        at += n;
    }
    platform::synchronize(s);
    CHECK(dst == expected);
}

TEST_CASE("several producers on several streams and devices share one ring", "[staging]") {
    constexpr int producers = 4;
    constexpr std::size_t per_producer = 1 << 16;
    ring_options o = opts(16384, 32);
    o.devices = {0, 1, 2, 3};
    ring r(o);
    std::vector<std::vector<std::byte>> sources;
    std::vector<std::vector<std::byte>> dests(producers, std::vector<std::byte>(per_producer));
    std::mt19937_64 seed(2024);
    for (int p = 0; p < producers; ++p) sources.push_back(random_bytes(seed, per_producer));
    std::atomic<int> device_kept{0};

    std::vector<std::thread> threads;
    for (int p = 0; p < producers; ++p) {
        threads.emplace_back([&, p] {
            custody::host::stream s(p); // device p
            std::mt19937_64 rng(static_cast<std::uint64_t>(p));
            custody::host::platform::set_device(0);
            std::size_t at = 0;
            while (at < per_producer) {
                const std::size_t n = std::min<std::size_t>(1 + rng() % 3000, per_producer - at);
                auto res = r.reserve<std::byte>(n);
                std::memcpy(res.data(), sources[static_cast<std::size_t>(p)].data() + at, n);
                r.commit(std::move(res), dests[static_cast<std::size_t>(p)].data() + at, s);
                if (custody::host::platform::current_device() == 0) device_kept.fetch_add(1);
                at += n;
            }
            platform::synchronize(s);
        });
    }
    for (auto& t : threads) t.join();
    for (int p = 0; p < producers; ++p) {
        CHECK(fnv1a(dests[static_cast<std::size_t>(p)]) == fnv1a(sources[static_cast<std::size_t>(p)]));
    }
    const auto st = r.statistics();
    CHECK(device_kept.load() == static_cast<int>(st.commits)); // the caller's device is restored
    CHECK(st.bytes_uploaded == producers * per_producer);
    CHECK(st.peak_bytes_in_use <= r.capacity());
}

TEST_CASE("a copy on a device not named up front creates that device's events once", "[staging]") {
    ring r(opts(1024)); // events for the current device (0) only
    custody::host::stream s5(5);
    std::vector<int> src(16, 3);
    std::vector<int> dst(16, 0);
    r.copy_to_device(std::span<const int>(src), dst.data(), s5);
    r.copy_to_device(std::span<const int>(src), dst.data(), s5);
    r.synchronize();
    CHECK(dst == src);
}

TEST_CASE("downloads: a ticket's span is valid until it is released, and held regions are kept", "[staging]") {
    ring r(opts(1024));
    custody::host::stream s;
    std::vector<std::uint16_t> device_data(512);
    std::iota(device_data.begin(), device_data.end(), std::uint16_t{1});

    gate g(s);
    auto t = r.stage(device_data.data(), 256, s);
    CHECK_FALSE(t.ready());
    CHECK(t.size() == 256);
    g.open();
    const auto view = t.wait();
    CHECK(t.ready());
    REQUIRE(view.size() == 256);
    CHECK(view[0] == 1);
    CHECK(view[255] == 256);

    // The held region (512 bytes) stays: another 512 fit, more do not, even with the copy done.
    auto t2 = r.stage(device_data.data() + 256, 256, s);
    CHECK_FALSE(r.try_stage(device_data.data(), 1, s));
    CHECK(t2.wait()[0] == 257);
    t.release();
    CHECK_THROWS_AS(t.wait(), custody::staging::released_ticket_error);
    CHECK_THROWS_AS(t.ready(), custody::staging::released_ticket_error);
    auto t3 = r.stage(device_data.data(), 256, s); // t's region came back
    CHECK(t3.wait()[10] == 11);
    auto moved = std::move(t3);
    CHECK_THROWS_AS(t3.wait(), custody::staging::released_ticket_error); // NOLINT: use after move is the point
    CHECK(moved.wait()[0] == 1);
    const auto st = r.statistics();
    CHECK(st.downloads == 3);
    CHECK(st.try_failures == 1);
}

TEST_CASE("a released ticket whose copy has not run keeps its region until the copy ends", "[staging]") {
    ring r(opts(1024));
    custody::host::stream s;
    std::vector<std::byte> src(1024, std::byte{5});
    gate g(s);
    auto t = r.stage(src.data(), 1024, s);
    t.release();
    CHECK_FALSE(r.try_reserve<std::byte>(1)); // the copy still writes into it
    g.open();
    platform::synchronize(s);
    CHECK(r.try_reserve<std::byte>(1));
}

TEST_CASE("destruction waits for copies in flight and gives the region back", "[staging]") {
    custody::resource::fault_injecting<custody::resource::host_memory> memory;
    custody::host::stream s;
    std::vector<std::byte> dst(4096);
    std::vector<std::byte> src(4096, std::byte{0x5A});
    custody::host::event copies_done(0);
    std::atomic<bool> freed_after_copies{false};
    auto owned = std::make_unique<custody::staging::staging_ring<borrowed_host>>(
        opts(4096, 16, 1024), borrowed_host{&memory, [&] { freed_after_copies = copies_done.ready(); }});
    CHECK(memory.statistics().live_bytes == 4096);

    gate g(s);
    owned->copy_to_device(std::span<const std::byte>(src), dst.data(), s);
    copies_done.record(s);
    CHECK(owned->statistics().bytes_in_flight == 4096);
    std::thread destroyer([&] { owned.reset(); });
    g.open();
    destroyer.join();
    CHECK(freed_after_copies.load());
    CHECK(memory.statistics().live_bytes == 0);
    CHECK(dst == src);
}

TEST_CASE("bad inputs are typed errors and leave the ring unchanged", "[staging]") {
    ring r(opts(1024));
    ring other(opts(1024));
    custody::host::stream s;
    std::vector<int> small(4);
    std::vector<int> dst(64);
    const auto before = r.statistics();

    CHECK_THROWS_AS(r.reserve<int>(0), std::invalid_argument);
    CHECK_THROWS_AS(r.try_reserve<int>(0), std::invalid_argument);
    CHECK_THROWS_AS(r.reserve<int>(0, std::chrono::seconds(1)), std::invalid_argument);
    // A NaN timeout is neither a wait nor no wait: converting it to nanoseconds is undefined.
    const std::chrono::duration<double> nan_timeout(std::numeric_limits<double>::quiet_NaN());
    CHECK_THROWS_AS(r.reserve<int>(1, nan_timeout), std::invalid_argument);
    CHECK_THROWS_AS(r.stage(dst.data(), 4, s, nan_timeout), std::invalid_argument);
    CHECK_THROWS_AS(r.stage(dst.data(), 0, s), std::invalid_argument);
    CHECK_THROWS_AS(r.stage<int>(nullptr, 4, s), std::invalid_argument);
    CHECK_THROWS_AS(r.copy_to_device(std::span<const int>(), dst.data(), s), std::invalid_argument);
    CHECK_THROWS_AS(r.copy_to_device(std::span<const int>(dst), static_cast<int*>(nullptr), s), std::invalid_argument);
    CHECK_THROWS_AS(r.copy_to_device(std::span<const int>(dst), std::span<int>(small), s), std::invalid_argument);
    CHECK_THROWS_AS(r.copy_from_device(dst.data(), std::span<int>(), s), std::invalid_argument);
    CHECK_THROWS_AS(r.copy_from_device(static_cast<const int*>(nullptr), std::span<int>(small), s),
                    std::invalid_argument);
    CHECK(same_state(before, r.statistics()));

    auto res = r.reserve<int>(8);
    for (std::size_t i = 0; i < 8; ++i) res[i] = static_cast<int>(i * i);
    const auto reserved = r.statistics();
    // A destination too small, a null one: the reservation stays with the caller, still valid.
    CHECK_THROWS_AS(r.commit(std::move(res), std::span<int>(small), s), std::invalid_argument);
    CHECK_THROWS_AS(r.commit(std::move(res), static_cast<int*>(nullptr), s), std::invalid_argument);
    CHECK_THROWS_AS(other.commit(std::move(res), dst.data(), s), std::invalid_argument);
    CHECK(same_state(reserved, r.statistics()));
    REQUIRE_FALSE(res.empty());
    CHECK(res[7] == 49);
    r.commit(std::move(res), std::span<int>(dst), s);
    CHECK(res.empty()); // NOLINT: committed
    CHECK_THROWS_AS(r.commit(std::move(res), dst.data(), s), std::invalid_argument); // empty reservation
    platform::synchronize(s);
    CHECK(dst[7] == 49);

    custody::staging::staging_ring<custody::resource::host_memory>::ticket_type<int> empty_ticket;
    CHECK_THROWS_AS(empty_ticket.wait(), custody::staging::released_ticket_error);
}

TEST_CASE("a ring that cannot be built throws and leaks nothing", "[staging]") {
    using faulty = custody::resource::fault_injecting<custody::resource::host_memory>;
    CHECK_THROWS_AS(ring(opts(0)), std::invalid_argument);
    CHECK_THROWS_AS(ring(opts(1024, 0)), std::invalid_argument);
    ring_options bad_device = opts(1024);
    bad_device.devices = {platform::device_count()};
    CHECK_THROWS_AS(ring(bad_device), std::invalid_argument);
    faulty probe;
    probe.fail_at(1);
    CHECK_THROWS_AS(custody::staging::staging_ring<borrowed_host>(opts(4096), borrowed_host{&probe, {}}),
                    custody::out_of_memory);
    CHECK(probe.statistics().live_bytes == 0);
    CHECK(probe.injected_failures() == 1);
    custody::staging::staging_ring<faulty> ok(opts(1024));
    ok.upstream().fail_at(1);
    CHECK(ok.reserve<std::byte>(1024).size() == 1024); // the region was taken once, at construction
}

TEST_CASE("statistics follow regions through reserve, commit, completion and cancellation", "[staging]") {
    ring r(opts(2048, 4));
    custody::host::stream s;
    std::vector<std::byte> dst(2048);
    gate g(s);
    auto a = r.reserve<std::byte>(100);
    auto b = r.reserve<std::byte>(100);
    auto st = r.statistics();
    CHECK(st.reservations == 2);
    CHECK(st.bytes_in_use == 200);
    CHECK(st.live_regions == 2);
    CHECK(st.bytes_in_flight == 0);
    r.commit(std::move(a), dst.data(), s);
    b.reset();
    st = r.statistics();
    CHECK(st.commits == 1);
    CHECK(st.cancellations == 1);
    CHECK(st.bytes_in_flight == 100);
    CHECK(r.poll() == 0); // the copy is held by the gate
    g.open();
    platform::synchronize(s);
    CHECK(r.poll() == 2); // the copy, then the cancelled region behind it
    st = r.statistics();
    CHECK(st.bytes_in_use == 0);
    CHECK(st.bytes_in_flight == 0);
    CHECK(st.live_regions == 0);

    // Regions are bounded too: four live regions, then no room whatever the bytes.
    std::vector<ring::reservation_type<std::byte>> held;
    for (int i = 0; i < 4; ++i) held.push_back(r.reserve<std::byte>(1));
    CHECK_FALSE(r.try_reserve<std::byte>(1));
    held.erase(held.begin());
    CHECK(r.try_reserve<std::byte>(1));
}

TEST_CASE("synchronize waits for every copy enqueued so far", "[staging]") {
    ring r(opts(4096, 8, 512));
    custody::host::stream a;
    custody::host::stream b(3);
    std::vector<std::byte> src(4096, std::byte{1});
    std::vector<std::byte> d1(4096);
    std::vector<std::byte> d2(2048);
    gate ga(a);
    r.copy_to_device(std::span<const std::byte>(src).first(2048), d1.data(), a);
    r.copy_to_device(std::span<const std::byte>(src).first(2048), d2.data(), b);
    CHECK(r.statistics().bytes_in_flight == 4096);
    std::thread opener([&] { ga.open(); });
    r.synchronize();
    opener.join();
    CHECK(r.statistics().bytes_in_use == 0);
    CHECK(std::equal(d2.begin(), d2.end(), src.begin()));
    CHECK(std::equal(d1.begin(), d1.begin() + 2048, src.begin()));
}

TEST_CASE("stress: producers mix uploads, downloads, try_reserve and timeouts on one small ring", "[staging]") {
    constexpr int threads = 4;
    constexpr int steps = 400;
    ring r(opts(8192, 16));
    std::vector<std::vector<std::uint64_t>> device(threads, std::vector<std::uint64_t>(256));
    std::atomic<int> corrupt{0};
    std::atomic<int> timeouts{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            custody::host::stream s(t % 2);
            std::mt19937_64 rng(static_cast<std::uint64_t>(1000 + t));
            auto& mine = device[static_cast<std::size_t>(t)];
            for (int step = 0; step < steps; ++step) {
                const std::size_t n = 1 + rng() % mine.size();
                const std::uint64_t cookie = (static_cast<std::uint64_t>(t) << 32) | static_cast<std::uint64_t>(step);
                switch (rng() % 4) {
                case 0: { // upload, then read it back through a ticket
                    auto res = r.reserve<std::uint64_t>(n);
                    for (std::size_t i = 0; i < n; ++i) res[i] = cookie + i;
                    r.commit(std::move(res), mine.data(), s);
                    auto tk = r.stage(mine.data(), n, s);
                    const auto back = tk.wait();
                    for (std::size_t i = 0; i < n; ++i) {
                        if (back[i] != cookie + i) corrupt.fetch_add(1);
                    }
                    break;
                }
                case 1: { // try, and give it back unused
                    auto res = r.try_reserve<std::uint64_t>(n);
                    if (res) res[0] = cookie;
                    break;
                }
                case 2: { // a short timeout may or may not expire; either way the ring stays sound
                    try {
                        auto res = r.reserve<std::uint64_t>(n, std::chrono::microseconds(50));
                        for (std::size_t i = 0; i < n; ++i) res[i] = cookie ^ i;
                        r.commit(std::move(res), mine.data(), s);
                        platform::synchronize(s);
                        for (std::size_t i = 0; i < n; ++i) {
                            if (mine[i] != (cookie ^ i)) corrupt.fetch_add(1);
                        }
                    } catch (const custody::staging::timeout_error&) {
                        timeouts.fetch_add(1);
                    }
                    break;
                }
                default: { // a chunked round trip
                    std::vector<std::uint64_t> src(n, cookie);
                    std::vector<std::uint64_t> back(n);
                    r.copy_to_device(std::span<const std::uint64_t>(src), mine.data(), s);
                    r.copy_from_device(static_cast<const std::uint64_t*>(mine.data()), std::span<std::uint64_t>(back), s);
                    if (back != src) corrupt.fetch_add(1);
                    break;
                }
                }
            }
            platform::synchronize(s);
        });
    }
    for (auto& th : pool) th.join();
    r.synchronize();
    CHECK(corrupt.load() == 0);
    const auto st = r.statistics();
    CHECK(st.timeouts == static_cast<std::uint64_t>(timeouts.load()));
    CHECK(st.bytes_in_use == 0);
    CHECK(st.bytes_in_flight == 0);
    CHECK(st.peak_bytes_in_use <= r.capacity());
}

TEST_CASE("ring_index: placement, the wrap, in-order reclamation, slots and pins", "[staging][detail]") {
    using custody::staging::detail::region_state;
    custody::staging::detail::ring_index idx(1024, 3);
    auto a = idx.place(600, 8);
    REQUIRE(a);
    CHECK(a->offset == 0);
    auto b = idx.place(300, 256); // aligned up from 600 to 768: would cross the wrap, so no room yet
    CHECK_FALSE(b);
    b = idx.place(300, 8);
    REQUIRE(b);
    CHECK(b->offset == 600);
    CHECK(idx.bytes_in_use() == 900);
    CHECK_FALSE(idx.place(200, 1)); // 124 bytes left before the wrap, and a's bytes after it
    idx.reclaim_oldest();            // a
    auto c = idx.place(200, 1);      // skips the 124-byte tail: starts the next lap at 0
    REQUIRE(c);
    CHECK(c->offset == 0);
    CHECK(idx.bytes_in_use() == 300 + 124 + 200);
    auto d = idx.place(1, 1);
    REQUIRE(d);
    CHECK_FALSE(idx.place(1, 1)); // three slots live
    idx.reclaim_oldest();         // b
    idx.reclaim_oldest();         // c
    idx.reclaim_oldest();         // d
    CHECK(idx.empty());
    CHECK(idx.bytes_in_use() == 0);
    // Empty, head mid-lap: a full-ring request restarts at the next lap.
    auto e = idx.place(1024, 1);
    REQUIRE(e);
    CHECK(e->offset == 0);
    idx.reclaim_oldest();
    // A pinned slot is not reused until unpinned, even with bytes to spare.
    idx.at(idx.oldest_slot()).pins = 0;
    auto f = idx.place(8, 1);
    REQUIRE(f);
    idx.at(f->slot).pins = 1;
    idx.reclaim_oldest();
    CHECK(idx.empty());
    CHECK(idx.place(8, 1)); // next slot: free
    CHECK(idx.place(8, 1));
    CHECK(idx.live_regions() == 2);
    CHECK_FALSE(idx.place(8, 1)); // the next slot is f's, still pinned
    CHECK(idx.at(f->slot).state == region_state::cancelled);
    idx.at(f->slot).pins = 0;
    CHECK(idx.place(8, 1));
}
