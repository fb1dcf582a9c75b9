// resource/recorded_streams.hpp: a block used on a side stream is reused only after that stream's
// work, over the stream-ordered pool on the host platform.
#include <custody/core/detail/layers.hpp>
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/recorded_streams.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

#include <cstddef>

namespace {

using custody::host::platform;
using pool_type = custody::pool::stream_ordered_pool<custody::host::simulated_device_memory>;
using adaptor = custody::resource::recorded_streams<pool_type>;

constexpr std::size_t block = 4096;
constexpr std::size_t capacity = std::size_t{8} << 20;

custody::pool::pool_options small_pool() {
    custody::pool::pool_options o;
    o.maximum_size = capacity;
    o.device_headroom = 0;
    return o;
}

/// The adaptor over a small pool, the stream blocks are allocated and freed on, and a side stream.
struct setting {
    adaptor r{small_pool(), 0, capacity};
    custody::host::stream a;
    custody::host::stream side;
};

} // namespace

TEST_CASE("without a recorded stream, a block freed on its stream is reused there at once", "[resource][record]") {
    adaptor r(small_pool(), 0, capacity);
    custody::host::stream a;
    void* p = r.allocate(a, block, 256);
    r.deallocate(a, p, block, 256);
    void* q = r.allocate(a, block, 256);
    CHECK(q == p); // what makes the next case meaningful: the pool would hand p out again
    r.deallocate(a, q, block, 256);
    platform::synchronize(a);
}

TEST_CASE("a block recorded on a busy stream is not reused until that stream's work is done", "[resource][record]") {
    setting t;
    auto& [r, a, side] = t;
    void* p = r.allocate(a, block, 256);
    {
        custody::test::stream_gate<platform> gate(side); // the side stream still uses p
        r.record(p, side);
        r.deallocate(a, p, block, 256);
        CHECK(r.held_blocks() == 1);
        CHECK(r.held_bytes() == block);
        void* q = r.allocate(a, block, 256);
        CHECK(q != p);
        r.deallocate(a, q, block, 256);
        CHECK(r.held_blocks() == 1);
    }
    platform::synchronize(side);
    CHECK(r.release_completed() == 1);
    CHECK(r.held_blocks() == 0);
    void* again = r.allocate(a, block, 256); // given back on a: reusable there now
    CHECK((again == p || r.statistics().live_allocations == 1));
    r.deallocate(a, again, block, 256);
    platform::synchronize(a);
}

TEST_CASE("recording the free's own stream, or a stream twice, holds nothing more", "[resource][record]") {
    adaptor r(small_pool(), 0, capacity);
    custody::host::stream a;
    void* p = r.allocate(a, block, 256);
    r.record(p, a);
    r.record(p, a);
    r.deallocate(a, p, block, 256);
    CHECK(r.held_blocks() == 0);
    CHECK(r.allocate(a, block, 256) == p);
    r.deallocate(a, p, block, 256);
    platform::synchronize(a);
}

TEST_CASE("an allocation that finds the memory held waits for the side stream instead of failing", "[resource][record]") {
    setting t;
    auto& [r, a, side] = t;
    void* big = r.allocate(a, capacity - (std::size_t{1} << 20), 256);
    r.record(big, side);
    {
        custody::test::stream_gate<platform> gate(side);
        r.deallocate(a, big, capacity - (std::size_t{1} << 20), 256);
        CHECK(r.held_blocks() == 1);
    } // the gate opens: the side stream may finish at any time from here
    void* again = r.allocate(a, capacity - (std::size_t{1} << 20), 256);
    CHECK(again != nullptr);
    CHECK(r.held_blocks() == 0);
    r.deallocate(a, again, capacity - (std::size_t{1} << 20), 256);
    platform::synchronize(a);
}

TEST_CASE("trim gives held blocks back before trimming the pool", "[resource][record]") {
    setting t;
    auto& [r, a, side] = t;
    void* p = r.allocate(a, std::size_t{2} << 20, 256);
    r.record(p, side);
    r.deallocate(a, p, std::size_t{2} << 20, 256);
    static_cast<void>(r.trim());
    CHECK(r.held_blocks() == 0);
    CHECK(r.statistics().reserved_bytes == 0);
    CHECK(r.statistics().live_bytes == 0);
}

TEST_CASE("while a capture is routed through the pool, held blocks' events are neither queried nor recorded",
          "[resource][record][graph]") {
    setting t;
    auto& [r, a, side] = t;
    custody::host::stream captured;
    // Held before the capture, for the side stream's work: what allocate and release would query.
    void* early = r.allocate(a, block, 256);
    custody::test::stream_gate<platform> gate(side);
    r.record(early, side);
    r.deallocate(a, early, block, 256);
    REQUIRE(r.held_blocks() == 1);

    const custody::pool::capture_pool_id id = r.upstream().make_capture_pool_id();
    r.upstream().begin_allocate_to_pool(id, captured); // as PyTorch: the route opens first
    platform::begin_capture(captured, custody::capture_mode::global);
    CHECK(custody::detail::capture_underway(r));
    void* inside = r.allocate(captured, block, 256); // an event query here would break the capture
    platform::memset_async(inside, 0x3c, block, captured);
    r.record(inside, side);                // the side stream uses it too
    r.deallocate(captured, inside, block, 256); // held, its event deferred: recorded on side now,
    CHECK(r.held_blocks() == 2);                // it could never be waited for by the replay
    CHECK(r.release_held() == 0);               // no host wait during the capture
    CHECK(r.trim() == 0);
    custody::host::graph graph = platform::end_capture(captured); // throws if the capture was broken
    r.upstream().end_allocate_to_pool(id);
    CHECK_FALSE(custody::detail::capture_underway(r));
    CHECK(graph.node_count() == 1);

    gate.open();
    CHECK(r.release_held() == 2); // the deferred event is recorded, then waited for with the other
    CHECK(r.held_blocks() == 0);
    CHECK(r.held_bytes() == 0);
    graph = custody::host::graph{};
    r.upstream().release_pool(id);
    platform::synchronize(side);
    platform::synchronize(a);
}

TEST_CASE("a block freed during a capture waits, after it, for the work its side stream had then",
          "[resource][record][graph]") {
    setting t;
    auto& [r, a, side] = t;
    custody::host::stream captured;
    const custody::pool::capture_pool_id id = r.upstream().make_capture_pool_id();
    r.upstream().begin_allocate_to_pool(id, captured);
    platform::begin_capture(captured, custody::capture_mode::global);
    void* inside = r.allocate(captured, block, 256);
    r.record(inside, side);
    r.deallocate(captured, inside, block, 256);
    custody::host::graph graph = platform::end_capture(captured);
    r.upstream().end_allocate_to_pool(id);
    {
        custody::test::stream_gate<platform> gate(side); // work the side stream has once the capture ended
        void* other = r.allocate(a, block, 256);         // records the deferred event, behind the gate
        CHECK(r.held_blocks() == 1);
        CHECK(r.release_completed() == 0); // the side stream's work is not done
        r.deallocate(a, other, block, 256);
    }
    platform::synchronize(side);
    CHECK(r.release_completed() == 1);
    graph = custody::host::graph{};
    r.upstream().release_pool(id);
    platform::synchronize(a);
}
