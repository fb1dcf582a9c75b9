// Buffers keep their owner: a buffer made under an owner (a scope, or given directly) allocates
// for it at every later allocation (resize), wherever that happens, and a move keeps it.
#include <custody/buffer/buffer.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/catch.hpp"

#include <string>
#include <utility>
#include <vector>

using namespace custody;
using namespace custody::debug;

namespace {

using tracker = tracking_resource<resource::host_memory>;
template <class T>
using host_buffer = buffer<T, host::platform, host_accessible>;

tracking_options owners_options() {
    tracking_options o;
    o.name = "owners";
    o.rank = make_rank(0, 0, 1);
    o.on_leak = policy::ignore;
    return o;
}

std::size_t live_of(const tracker& t, std::string_view owner) { return t.owner_live(owner).live_bytes; }

} // namespace

TEST_CASE("a buffer made under an owner scope grows for that owner, in another scope or in none",
          "[debug][owner][buffer]") {
    tracker t(owners_options());
    std::optional<host_buffer<float>> kv;
    {
        owner_scope s("kv_cache");
        kv.emplace(256, host::stream_view{}, t);
    }
    CHECK(owner_name(kv->owner()) == "kv_cache");
    CHECK(live_of(t, "kv_cache") == 1024);
    {
        owner_scope other("prefill");
        kv->resize(512); // grown inside another owner's scope
        CHECK(owner_name(current_owner()) == "prefill"); // the scope is as it was
    }
    CHECK(live_of(t, "kv_cache") == 2048);
    CHECK(live_of(t, "prefill") == 0);
    kv->resize(1024); // grown outside every scope
    CHECK(live_of(t, "kv_cache") == 4096);
    CHECK(live_of(t, "<untagged>") == 0);
    CHECK(current_owner() == nullptr);
    kv.reset();
    CHECK(live_of(t, "kv_cache") == 0);
}

TEST_CASE("a buffer given its owner keeps it across moves; an untagged one stays untagged",
          "[debug][owner][buffer]") {
    tracker t(owners_options());
    const owner_id weights = intern_owner("weights");
    owner_scope loading("loader"); // the explicit owner wins over the open scope
    host_buffer<int> w(100, {}, t, weights);
    CHECK(w.owner() == weights);
    CHECK(live_of(t, "weights") == 400);
    CHECK(live_of(t, "loader") == 0);

    host_buffer<int> moved(std::move(w));
    CHECK(moved.owner() == weights);
    host_buffer<int> assigned;
    assigned = std::move(moved);
    CHECK(assigned.owner() == weights);
    assigned.resize(200);
    CHECK(live_of(t, "weights") == 800);
    CHECK(live_of(t, "loader") == 0);

    host_buffer<int> scratch(10, {}, t, nullptr); // explicitly untagged, inside "loader"
    scratch.resize(20);
    CHECK(live_of(t, "<untagged>") == 80);
    CHECK(live_of(t, "loader") == 0);

    // Made under "loader" without an explicit owner: "loader"'s, also when grown elsewhere.
    host_buffer<char> staged(64, {}, t);
    CHECK(owner_name(staged.owner()) == "loader");
}

TEST_CASE("growing a buffer elsewhere does not fire the other owner's watch", "[debug][owner][buffer][watch]") {
    tracker t(owners_options());
    std::vector<watch_event> fired;
    watch w;
    w.owner = "prefill";
    w.threshold_bytes = 1000;
    w.callback = [&](const watch_event& e) { fired.push_back(e); };
    t.add_watch(w);
    host_buffer<float> kv(100, {}, t, intern_owner("kv_cache"));
    {
        owner_scope s("prefill");
        kv.resize(10000);
    }
    CHECK(fired.empty());
    CHECK(live_of(t, "kv_cache") == 40000);
}

TEST_CASE("a buffer over a resource that tracks no owner works as before", "[owner][buffer]") {
    resource::host_memory memory;
    owner_scope s("anything");
    host_buffer<int> b(16, {}, memory);
    b.resize(32);
    CHECK(b.size() == 32);
    CHECK(owner_name(b.owner()) == "anything");
}
