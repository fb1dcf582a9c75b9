// resource/detail/leaf.hpp: the statistics of interchangeable leaf resources when one instance gives
// back a block that an equal instance handed out.
#include <custody/platform/host.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/catch.hpp"

#include <cstddef>

using custody::resource::host_memory;

namespace {

// No figure of a leaf may ever read as a wrapped-around count: every live figure stays within what
// was handed out through the instance.
void check_sane(const custody::resource_statistics& s) {
    CHECK(s.live_bytes <= s.peak_live_bytes);
    CHECK(s.reserved_bytes == s.live_bytes);
    CHECK(s.live_allocations <= s.allocations);
}

} // namespace

TEST_CASE("a leaf that frees an equal leaf's block keeps statistics that never wrap", "[resource][leaf]") {
    host_memory a;
    host_memory b;
    REQUIRE(a == b); // documented as interchangeable: b may give back a's blocks
    void* p = a.allocate_sync(1000, 256);
    b.deallocate_sync(p, 1000, 256);

    const auto sb = b.statistics();
    CHECK(sb.live_bytes == 0);
    CHECK(sb.live_allocations == 0);
    CHECK(sb.reserved_bytes == 0);
    CHECK(sb.allocations == 0);
    CHECK(sb.deallocations == 1);
    check_sane(sb);

    // The giver cannot know the block came back elsewhere: its figures stay as handed out.
    const auto sa = a.statistics();
    CHECK(sa.live_bytes == 1000);
    CHECK(sa.live_allocations == 1);
    CHECK(sa.deallocations == 0);
    check_sane(sa);
}

TEST_CASE("a foreign block given back does not eat into the receiver's own live blocks", "[resource][leaf]") {
    host_memory a;
    host_memory b;
    void* own = b.allocate_sync(300, 64);
    void* foreign = a.allocate_sync(1000, 64);
    b.deallocate_sync(foreign, 1000, 64); // more bytes than b has live
    auto s = b.statistics();
    CHECK(s.live_bytes <= 300);
    check_sane(s);
    b.deallocate_sync(own, 300, 64);
    s = b.statistics();
    CHECK(s.live_bytes == 0);
    CHECK(s.live_allocations == 0);
    CHECK(s.deallocations == 2);
    check_sane(s);
}

TEST_CASE("stream-ordered frees of foreign blocks keep statistics sane too", "[resource][leaf]") {
    host_memory a;
    host_memory b;
    custody::host::stream s;
    for (int i = 0; i < 8; ++i) {
        void* p = a.allocate(s, 128, 64);
        b.deallocate(s, p, 128, 64);
    }
    custody::host::platform::synchronize(s);
    check_sane(b.statistics());
    CHECK(b.statistics().live_bytes == 0);
    CHECK(b.statistics().deallocations == 8);
    CHECK(a.statistics().live_allocations == 8);
}
