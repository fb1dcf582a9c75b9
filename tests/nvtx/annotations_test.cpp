// What the pool, the staging ring and the tracker tell CUDA's tools through NVTX's memory API, as a
// recording tool receives it (recorder.cpp, loaded by NVTX through NVTX_INJECTION64_PATH): heaps for
// the memory taken from upstreams, regions for exactly the blocks handed out, owners as names,
// capture-private chunks as heaps of their own, everything withdrawn on trim, release and the end;
// nothing at all with annotations off. The pool's model tests run again in this program with the
// same check after every step (tests/pool/model_test.cpp, check_announced).
#include <custody/debug/tracking_resource.hpp>
#include <custody/platform/host.hpp>
#include <custody/pool/capture_scope.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>
#include <custody/staging/staging_ring.hpp>

#include "../support/catch.hpp"
#include "../support/failure_log.hpp"
#include "recording.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using custody::host::platform;
using custody::host::simulated_device_memory;
using custody::pool::pool_options;
using custody::pool::stream_ordered_pool;
using custody_nvtx_test::read;
using pool_type = stream_ordered_pool<simulated_device_memory>;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::size_t device_bytes = std::size_t{1} << 30;

/// Run directly (not by meson test), the program names the tool itself: NVTX reads the variable at
/// its first call, after main has started.
const bool tool_named = [] {
    ::setenv("NVTX_INJECTION64_PATH", CUSTODY_NVTX_RECORDER, /*overwrite=*/0);
    return true;
}();

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

/// The tool's view holds no call that broke NVTX's rules; starts each case with a clean slate.
void check_clean() {
    const auto r = read();
    for (const auto& v : r.violations) FAIL_CHECK(v);
    CHECK(r.violations.empty());
}
struct clean_slate {
    clean_slate() {
        REQUIRE(tool_named);
        REQUIRE(custody_nvtx_recorder_loaded() == 1);
        custody_nvtx_recorder_forget();
        const auto r = read();
        REQUIRE(r.heaps.empty());   // every case ends with its resources gone
        REQUIRE(r.regions.empty());
    }
    ~clean_slate() { check_clean(); }
};

/// The regions as (address -> size) that the pool's live blocks should be.
using blocks = std::map<std::uintptr_t, std::size_t>;

} // namespace

TEST_CASE("the pool's chunks are heaps and exactly its handed-out blocks are regions", "[nvtx][pool]") {
    clean_slate slate;
    pool_options o;
    o.growth_step = 2 * MiB;
    {
        pool_type pool(o, 0, device_bytes);
        custody::host::stream s;
        void* a = pool.allocate(s, 1000, 256);
        void* b = pool.allocate(s, 3 * MiB, 256);
        void* c = pool.allocate(s, 64, 256);
        auto r = read();
        CHECK(r.domains.size() == 1);
        CHECK(r.domains.front() == "custody");
        CHECK(r.region_sizes() == blocks{{address(a), 1000}, {address(b), 3 * MiB}, {address(c), 64}});
        CHECK(r.heap_bytes() == pool.statistics().reserved_bytes);
        for (const auto& [base, h] : r.heaps) CHECK(h.name == "custody stream_ordered_pool");
        for (const auto& [p, region] : r.regions) CHECK(r.heaps.contains(region.heap));

        // Given back: cached for reuse on s, and no longer live.
        pool.deallocate(s, a, 1000, 256);
        CHECK(read().region_sizes() == blocks{{address(b), 3 * MiB}, {address(c), 64}});
        // Handed out again (the same memory, another size): a region again, of the new size.
        void* a2 = pool.allocate(s, 900, 256);
        CHECK(a2 == a);
        CHECK(read().region_sizes() == blocks{{address(a2), 900}, {address(b), 3 * MiB}, {address(c), 64}});
        pool.deallocate(s, a2, 900, 256);
        pool.deallocate(s, b, 3 * MiB, 256);
        pool.deallocate(s, c, 64, 256);
        CHECK(read().regions.empty());
        CHECK_FALSE(read().heaps.empty()); // the chunks are still the pool's

        // trim gives the wholly free chunks back: their heaps are withdrawn first.
        pool.trim();
        CHECK(pool.statistics().reserved_bytes == 0);
        CHECK(read().heaps.empty());
    }
    CHECK(read().dropped.empty()); // no block was left out
}

TEST_CASE("zero bytes, a bad alignment and exhaustion announce nothing", "[nvtx][pool]") {
    clean_slate slate;
    pool_options o;
    o.growth_step = 1 * MiB;
    o.maximum_size = 4 * MiB;
    pool_type pool(o, 0, device_bytes);
    custody::host::stream s;
    CHECK(pool.allocate(s, 0, 256) == nullptr);
    CHECK_THROWS_AS(pool.allocate(s, 64, 3), std::invalid_argument);
    void* a = pool.allocate(s, 3 * MiB, 256);
    const auto before = read();
    // Exhaustion after the last resort (reclaim: wait, coalesce, give free chunks back, retry).
    CHECK_THROWS_AS(pool.allocate(s, 2 * MiB, 256), custody::out_of_memory);
    CHECK(pool.detailed_statistics().reclaims >= 1);
    const auto after = read();
    CHECK(after.region_sizes() == before.region_sizes());
    CHECK(after.region_sizes() == blocks{{address(a), 3 * MiB}});
    CHECK(after.heap_bytes() == pool.statistics().reserved_bytes);
    pool.deallocate(s, a, 3 * MiB, 256);
    pool.trim();
}

TEST_CASE("the last resort gives free chunks back and their heaps are withdrawn before", "[nvtx][pool]") {
    clean_slate slate;
    pool_options o;
    o.growth_step = 1 * MiB;
    o.growth_divisor = 0;
    o.maximum_size = 4 * MiB;
    o.reuse = custody::pool::reuse_policy::same_stream;
    pool_type pool(o, 0, device_bytes);
    custody::host::stream s;
    custody::host::stream t;
    // Four 1 MiB blocks cut up the pool on s, given back there: cached on s, useless to t.
    std::vector<void*> small;
    for (int i = 0; i < 4; ++i) small.push_back(pool.allocate(s, 1 * MiB, 256));
    for (void* p : small) pool.deallocate(s, p, 1 * MiB, 256);
    CHECK(read().regions.empty());
    // t needs 3 MiB at once: only the reclaim (wait for s, coalesce, give chunks back, grow) serves it.
    void* big = pool.allocate(t, 3 * MiB, 256);
    CHECK(pool.detailed_statistics().reclaims == 1);
    const auto r = read();
    CHECK(r.region_sizes() == blocks{{address(big), 3 * MiB}});
    CHECK(r.heap_bytes() == pool.statistics().reserved_bytes);
    pool.deallocate(t, big, 3 * MiB, 256);
    pool.trim();
    CHECK(read().heaps.empty());
}

TEST_CASE("a pool over another pool: the inner pool's blocks are what the tool sees", "[nvtx][pool]") {
    clean_slate slate;
    pool_options o;
    o.growth_step = 2 * MiB;
    stream_ordered_pool<pool_type> outer(o, o, 0, device_bytes);
    custody::host::stream s;
    void* p = outer.allocate(s, 4096, 256);
    const auto r = read();
    // The outer pool's chunk is a block of the inner pool: one region, and the outer's block in it
    // is not announced again (the tools take no region inside another).
    REQUIRE(r.regions.size() == 1);
    const auto& [chunk, region] = *r.regions.begin();
    CHECK(chunk <= address(p));
    CHECK(address(p) + 4096 <= chunk + region.size);
    CHECK(r.heap_bytes() == outer.upstream().statistics().reserved_bytes);
    outer.deallocate(s, p, 4096, 256);
    outer.trim();
    CHECK(read().regions.empty());
}

TEST_CASE("annotations off: the pool tells the tool nothing", "[nvtx][pool]") {
    clean_slate slate;
    pool_options o;
    o.annotate = false;
    pool_type pool(o, 0, device_bytes);
    custody::host::stream s;
    void* p = pool.allocate(s, 4096, 256);
    const auto r = read();
    CHECK(r.heaps.empty());
    CHECK(r.regions.empty());
    pool.deallocate(s, p, 4096, 256);
}

TEST_CASE("checked mode: a bad free leaves the block announced as it was", "[nvtx][pool]") {
    clean_slate slate;
    custody::test::failure_log log;
    pool_options o;
    o.checked = true;
    pool_type pool(o, 0, device_bytes);
    custody::host::stream s;
    void* p = pool.allocate(s, 4096, 256);
    void* q = pool.allocate(s, 512, 256);
    pool.deallocate(s, p, 4096, 256);
    pool.deallocate(s, p, 4096, 256);                                      // a double free: refused
    pool.deallocate(s, static_cast<char*>(q) + 256, 256, 256);             // an interior pointer: refused
    CHECK(pool.detailed_statistics().misuses == 2);
    CHECK(read().region_sizes() == blocks{{address(q), 512}});
    pool.deallocate(s, q, 512, 256);
    CHECK(read().regions.empty());
}

TEST_CASE("capture-private chunks are heaps of their own, each one region named after its pool", "[nvtx][capture]") {
    clean_slate slate;
    pool_type pool(pool_options{}, 0, device_bytes);
    custody::host::stream s;
    custody::host::stream other;
    void* before = pool.allocate(other, 4096, 256); // ordinary
    const custody::pool::capture_pool_id id = pool.make_capture_pool_id();
    pool.begin_allocate_to_pool(id, s);
    platform::begin_capture(s, custody::capture_mode::global);
    void* kept = pool.allocate(s, 8192, 256);      // private: the graph's
    void* temp = pool.allocate(s, 1 * MiB, 256);   // private, given back within the capture
    platform::memset_async(kept, 0x11, 8192, s);
    platform::memset_async(temp, 0x22, 1 * MiB, s);
    pool.deallocate(s, temp, 1 * MiB, 256);
    void* during = pool.allocate(other, 512, 256); // ordinary, on another stream during the capture
    auto r = read();
    // The ordinary blocks are regions; the private memory is whole heaps, each one region.
    std::map<std::uintptr_t, std::size_t> ordinary;
    std::size_t private_heaps = 0;
    for (const auto& [base, h] : r.heaps) {
        if (h.name.starts_with("custody capture pool")) {
            ++private_heaps;
            CHECK(h.name == "custody capture pool {0, " + std::to_string(id.second) + "}");
            REQUIRE(r.regions.contains(base));
            CHECK(r.regions.at(base).size == h.size);
            CHECK(r.regions.at(base).name == h.name);
        }
    }
    for (const auto& [a, region] : r.regions) {
        if (!r.heaps.at(region.heap).name.starts_with("custody capture pool")) ordinary.emplace(a, region.size);
    }
    CHECK(private_heaps >= 1);
    CHECK(ordinary == blocks{{address(before), 4096}, {address(during), 512}});
    CHECK(r.heap_bytes() == pool.statistics().reserved_bytes);

    typename platform::graph g = platform::end_capture(s);
    pool.end_allocate_to_pool(id);
    platform::launch(g, s);
    platform::synchronize(s);
    pool.release_pool(id); // the graph's hold: memory goes back once `kept` is given back
    CHECK(read().heap_bytes() == pool.statistics().reserved_bytes);
    pool.deallocate(s, kept, 8192, 256);
    CHECK(pool.detailed_statistics().capture_reserved_bytes == 0);
    r = read();
    for (const auto& [base, h] : r.heaps) CHECK_FALSE(h.name.starts_with("custody capture pool"));
    CHECK(r.region_sizes() == blocks{{address(before), 4096}, {address(during), 512}});
    pool.deallocate(other, before, 4096, 256);
    pool.deallocate(other, during, 512, 256);
    CHECK(read().regions.empty());
}

TEST_CASE("a block of the ordinary pool given back during a capture is withdrawn", "[nvtx][capture]") {
    clean_slate slate;
    pool_type pool(pool_options{}, 0, device_bytes);
    custody::host::stream s;
    void* p = pool.allocate(s, 4096, 256);
    {
        custody::pool::capture_scope scope(pool, s);
        pool.deallocate(s, p, 4096, 256); // quarantined: never reused
        CHECK(read().regions.empty());
        CHECK(pool.detailed_statistics().quarantined_bytes == 4096);
        static_cast<void>(scope.end());
    }
    CHECK(read().heap_bytes() == pool.statistics().reserved_bytes);
}

TEST_CASE("the tracker names each block after its owner, cut to what the tools take", "[nvtx][debug]") {
    clean_slate slate;
    custody::debug::tracking_options o;
    o.on_leak = custody::debug::policy::ignore;
    custody::debug::tracking_resource<pool_type> tracker(o, pool_options{}, 0, device_bytes);
    custody::host::stream s;
    void* kv = tracker.allocate(s, 4096, 256, "decode/kv_cache");
    void* untagged = tracker.allocate(s, 100, 256);
    const std::string long_name(60, 'x');
    void* long_owned = tracker.allocate(s, 100, 256, long_name);
    void* odd = tracker.allocate(s, 100, 256, "tab\there");
    const auto r = read();
    CHECK(r.regions.size() == 4);
    // The region is the pool's block: the user's bytes with the tracker's guards around them.
    std::map<std::string, std::size_t> names;
    for (const auto& [a, region] : r.regions) ++names[region.name];
    CHECK(names == std::map<std::string, std::size_t>{{"decode/kv_cache", 1}, {"<untagged>", 1},
                                                      {std::string(49, 'x'), 1}, {"tab?here", 1}});
    tracker.deallocate(s, kv, 4096, 256);
    tracker.deallocate(s, untagged, 100, 256);
    tracker.deallocate(s, long_owned, 100, 256);
    tracker.deallocate(s, odd, 100, 256);
    CHECK(read().regions.empty());
}

TEST_CASE("the tracker over a plain upstream names the allocation itself", "[nvtx][debug]") {
    clean_slate slate;
    custody::debug::tracking_options o;
    o.canaries = false;
    custody::debug::tracking_resource<custody::resource::host_memory> tracker(o);
    custody::host::stream s;
    void* p = tracker.allocate(s, 256, 256, "prefill/activations");
    const auto r = read();
    CHECK(r.heaps.empty());
    REQUIRE(r.named.contains(address(p)));
    CHECK(r.named.at(address(p)) == "prefill/activations");
    tracker.deallocate(s, p, 256, 256);
}

TEST_CASE("annotations off: the tracker names nothing", "[nvtx][debug]") {
    clean_slate slate;
    custody::debug::tracking_options o;
    o.annotate = false;
    o.canaries = false;
    custody::debug::tracking_resource<custody::resource::host_memory> tracker(o);
    custody::host::stream s;
    void* p = tracker.allocate(s, 256, 256, "prefill/activations");
    CHECK(read().named.empty());
    tracker.deallocate(s, p, 256, 256);
}

TEST_CASE("a block never given back is still a region, with its owner, when the pool ends", "[nvtx][debug]") {
    clean_slate slate;
    custody::test::failure_log log; // the pool reports the leak
    custody::debug::tracking_options o;
    o.on_leak = custody::debug::policy::ignore;
    o.release_leaks = false; // the block stays out of the pool: a leak, as compute-sanitizer sees one
    std::uintptr_t leaked = 0;
    {
        custody::debug::tracking_resource<pool_type> tracker(o, pool_options{}, 0, device_bytes);
        custody::host::stream s;
        void* kept = tracker.allocate(s, 4096, 256, "decode/kv_cache");
        void* freed = tracker.allocate(s, 4096, 256, "decode/logits");
        tracker.deallocate(s, freed, 4096, 256);
        leaked = address(kept);
    }
    const auto r = read();
    CHECK(r.heaps.empty());
    CHECK(r.regions.empty());
    REQUIRE(r.dropped.size() == 1); // left in its heap when the heap was withdrawn
    CHECK(r.dropped.front().name == "decode/kv_cache");
    CHECK(r.dropped.front().address <= leaked);
    CHECK(leaked < r.dropped.front().address + r.dropped.front().size);
    CHECK_FALSE(log.lines().empty());
}

TEST_CASE("the staging ring is a heap and each region is announced until it comes back", "[nvtx][staging]") {
    clean_slate slate;
    using ring = custody::staging::staging_ring<custody::resource::host_memory>;
    custody::staging::ring_options o;
    o.capacity = 64 * KiB;
    o.max_regions = 8;
    std::vector<std::byte> destination(64 * KiB);
    std::vector<std::byte> source(4 * KiB, std::byte{7});
    {
        ring r(o);
        custody::host::stream s;
        auto held = read();
        REQUIRE(held.heaps.size() == 1);
        CHECK(held.heaps.begin()->second.size == r.capacity());
        CHECK(held.heaps.begin()->second.name == "custody staging_ring");

        auto upload = r.reserve<std::byte>(1000);
        auto unused = r.reserve<std::byte>(300);
        CHECK(read().region_sizes() ==
              blocks{{address(upload.data()), 1000}, {address(unused.data()), 300}});
        unused.reset(); // given back unused: withdrawn at once
        CHECK(read().region_sizes() == blocks{{address(upload.data()), 1000}});
        const auto upload_address = address(upload.data());
        r.commit(std::move(upload), destination.data(), s); // in flight: still the copy's
        auto ticket = r.stage(source.data(), source.size(), s);
        CHECK(read().region_sizes() == blocks{{upload_address, 1000}, {address(ticket.wait().data()), 4 * KiB}});
        r.synchronize(); // the upload is done and reclaimed; the download is held by its ticket
        CHECK(read().region_sizes() == blocks{{address(ticket.wait().data()), 4 * KiB}});
        ticket = {};
        r.synchronize();
        CHECK(read().regions.empty());
        auto last = r.reserve<std::byte>(64);
        r.commit(std::move(last), destination.data(), s); // reclaimed by the destructor
    }
    CHECK(read().heaps.empty());
    CHECK(read().regions.empty());
}

TEST_CASE("threads allocating and freeing on their streams: regions end equal to nothing", "[nvtx][threads]") {
    clean_slate slate;
    pool_options o;
    o.growth_step = 1 * MiB;
    pool_type pool(o, 0, device_bytes);
    std::vector<std::thread> workers;
    for (int t = 0; t < 4; ++t) {
        workers.emplace_back([&pool, t] {
            custody::host::stream s;
            std::mt19937 rng(static_cast<unsigned>(t));
            std::vector<std::pair<void*, std::size_t>> mine;
            for (int i = 0; i < 2000; ++i) {
                if (mine.size() < 16 && rng() % 2 == 0) {
                    const std::size_t n = rng() % 8 == 0 ? MiB + rng() % MiB : 1 + rng() % (16 * KiB);
                    mine.emplace_back(pool.allocate(s, n, 256), n);
                } else if (!mine.empty()) {
                    const std::size_t k = rng() % mine.size();
                    pool.deallocate(s, mine[k].first, mine[k].second, 256);
                    mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(k));
                }
            }
            for (auto [p, n] : mine) pool.deallocate(s, p, n, 256);
        });
    }
    for (auto& w : workers) w.join();
    const auto r = read();
    CHECK(r.regions.empty());
    CHECK(r.heap_bytes() == pool.statistics().reserved_bytes);
    pool.trim();
    CHECK(read().heaps.empty());
}
