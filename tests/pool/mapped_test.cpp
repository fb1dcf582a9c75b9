// The pool over an upstream that maps memory (resource::virtual_memory over host::vmm, real pages on
// the host): growth inside one address range, idle granules unmapped before new ones are mapped,
// trim and the release threshold giving memory back (resident memory, not a counter), and the
// bound with many streams.
#include <custody/platform/host.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/virtual_memory.hpp>

#include "../support/catch.hpp"
#include "../support/faulty_vmm.hpp"
#include "../support/host_pages.hpp"
#include "support.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace custody_pool_test;

namespace {

using mapped_memory = custody::resource::virtual_memory<custody::host::vmm>;
using mapped_pool = stream_ordered_pool<mapped_memory>;
constexpr std::size_t granule = 2 * MiB;

/// Reservation options with the GPU's 2 MiB granule.
custody::resource::reservation_options granules() {
    custody::resource::reservation_options o;
    o.granule = granule;
    return o;
}

/// Options without checked mode (its bookkeeping is not what these tests measure).
pool_options unchecked() {
    pool_options o;
    o.checked = false;
    return o;
}

using custody_test::host_pages::resident_pages;

/// [a, a + n) and [b, b + m) share a byte.
bool custody_test_overlap(const void* a, std::size_t n, const void* b, std::size_t m) {
    const auto x = reinterpret_cast<std::uintptr_t>(a);
    const auto y = reinterpret_cast<std::uintptr_t>(b);
    return x < y + m && y < x + n;
}

/// Whether a block of `live` overlaps the granule at `g`.
bool touched(const std::map<std::uintptr_t, std::size_t>& live, std::uintptr_t g) {
    for (const auto& [a, n] : live) {
        if (a < g + granule && g < a + n) return true;
    }
    return false;
}

/// The bytes of the granules that blocks [address, address + bytes) touch.
std::size_t granules_of(const std::map<std::uintptr_t, std::size_t>& blocks) {
    std::set<std::uintptr_t> touched;
    for (const auto& [a, n] : blocks) {
        for (std::uintptr_t g = a / granule; g <= (a + n - 1) / granule; ++g) touched.insert(g);
    }
    return touched.size() * granule;
}

} // namespace

static_assert(custody::stream_ordered_resource<mapped_pool>);
static_assert(custody::pool::detail::mapping_upstream<mapped_memory>);

TEST_CASE("over virtual memory the pool grows beside the free memory a block joins, across what were growths",
          "[pool][mapped]") {
    mapped_pool pool(unchecked(), 0, 1024 * MiB, granules());
    custody::host::stream s;
    // Two large blocks, each taken when the pool had nothing free: two growths.
    void* a = pool.allocate(s, 3 * MiB, 256);
    void* b = pool.allocate(s, 3 * MiB, 256);
    CHECK(pool.statistics().reserved_bytes == 6 * MiB); // three granules: the second block joins the first's rest
    const auto grown = pool.detailed_statistics().upstream_allocations;
    CHECK(grown >= 1);
    CHECK(pool.detailed_statistics().chunks == 0);
    CHECK(pool.detailed_statistics().map_granule == granule);
    // Freed, they are one free range: a block of both sizes together needs no new memory.
    pool.deallocate(s, a, 3 * MiB, 256);
    pool.deallocate(s, b, 3 * MiB, 256);
    void* c = pool.allocate(s, 6 * MiB, 256);
    CHECK(pool.statistics().reserved_bytes == 6 * MiB);
    CHECK(pool.detailed_statistics().upstream_allocations == grown);
    // A larger one maps only what is missing, beside them.
    pool.deallocate(s, c, 6 * MiB, 256);
    void* d = pool.allocate(s, 9 * MiB, 256);
    CHECK(d == a);
    CHECK(pool.statistics().reserved_bytes == 10 * MiB); // 9 MiB rounded to granules
    pool.deallocate(s, d, 9 * MiB, 256);
    check_accounting(pool);
}

TEST_CASE("trim unmaps every wholly free granule: the memory goes back, what is live stays mapped",
          "[pool][mapped][trim]") {
    mapped_pool pool(unchecked(), 0, 1024 * MiB, granules());
    custody::host::stream s;
    std::mt19937 rng(11);
    std::map<std::uintptr_t, std::size_t> live;
    std::vector<std::pair<void*, std::size_t>> all;
    for (int i = 0; i < 64; ++i) {
        const std::size_t n = rng() % 3 == 0 ? (1 + rng() % 6) * MiB + rng() % 4096 : 1 + rng() % (512 * KiB);
        void* p = pool.allocate(s, n, 256);
        std::memset(p, 0x5A, n); // real pages: the process holds them now
        all.emplace_back(p, n);
    }
    // Give back every other block: many granules become wholly free, some stay shared with live ones.
    std::vector<std::pair<void*, std::size_t>> freed;
    for (std::size_t i = 0; i < all.size(); ++i) {
        if (i % 2 == 0) {
            freed.push_back(all[i]);
            pool.deallocate(s, all[i].first, all[i].second, 256);
        } else {
            live.emplace(reinterpret_cast<std::uintptr_t>(all[i].first), detail::block_size(all[i].second));
        }
    }
    platform::synchronize(s);
    // Before trim the freed blocks are still mapped and resident (the stream's cache keeps them).
    std::size_t resident_before = 0;
    for (auto [p, n] : freed) resident_before += resident_pages(p, n);
    CHECK(resident_before > 0);
    const std::size_t released = pool.trim();
    CHECK(released > 0);
    // Now only the granules that live blocks touch are mapped, and the others hold no page.
    CHECK(pool.statistics().reserved_bytes == granules_of(live));
    for (auto [p, n] : freed) {
        const auto a = reinterpret_cast<std::uintptr_t>(p);
        for (std::uintptr_t g = custody::align_up(a, granule); g + granule <= a + n; g += granule) {
            if (!touched(live, g)) CHECK(resident_pages(reinterpret_cast<void*>(g), granule) == 0);
        }
    }
    for (const auto& [a, n] : live) CHECK(*reinterpret_cast<const unsigned char*>(a) == 0x5A); // live data intact
    for (std::size_t i = 1; i < all.size(); i += 2) pool.deallocate(s, all[i].first, all[i].second, 256);
    pool.trim();
    CHECK(pool.statistics().reserved_bytes == 0);
    CHECK(pool.upstream().mapped_bytes() == 0);
    check_accounting(pool);
}

TEST_CASE("before mapping, the pool unmaps idle free granules: it maps no more than its live blocks need",
          "[pool][mapped]") {
    // A layer-by-layer pattern: whole layers of large blocks taken and given back, each layer's
    // sizes different from the last, so that free memory never fits the next layer as it is.
    mapped_pool pool(unchecked(), 0, 4096 * MiB, granules());
    custody::host::stream s;
    std::size_t peak_live = 0;
    std::size_t peak_need = 0;
    for (int layer = 0; layer < 40; ++layer) {
        std::map<std::uintptr_t, std::size_t> blocks;
        std::vector<std::pair<void*, std::size_t>> taken;
        std::size_t live = 0;
        for (int i = 0; i < 4; ++i) {
            const std::size_t n = (5 + (layer * 7 + i * 3) % 23) * MiB + 256 * static_cast<std::size_t>(layer);
            void* p = pool.allocate(s, n, 256);
            taken.emplace_back(p, n);
            blocks.emplace(reinterpret_cast<std::uintptr_t>(p), detail::block_size(n));
            live += n;
        }
        peak_live = std::max(peak_live, live);
        peak_need = std::max(peak_need, granules_of(blocks));
        for (auto [p, n] : taken) pool.deallocate(s, p, n, 256);
    }
    const auto st = pool.detailed_statistics();
    INFO("peak mapped " << st.totals.peak_reserved_bytes << ", peak live " << peak_live << ", maps "
                        << st.upstream_allocations << ", unmaps " << st.upstream_deallocations);
    // What the blocks of one layer touch, at most (what any allocator that maps granules needs)...
    CHECK(st.totals.peak_reserved_bytes <= peak_need + granule);
    // ...which is the live peak plus a granule's rounding per block.
    CHECK(st.totals.peak_reserved_bytes <= peak_live + 4 * granule);
    CHECK(st.upstream_deallocations > 0);
    check_accounting(pool);
}

TEST_CASE("the release threshold: wholly free granules beyond it go back as they return to the shared set",
          "[pool][mapped][trim]") {
    for (const std::size_t threshold : {std::size_t{0}, 8 * MiB, SIZE_MAX}) {
        INFO("release threshold " << threshold);
        pool_options o = unchecked();
        o.release_threshold = threshold;
        o.reuse = reuse_policy::opportunistic;
        mapped_pool pool(o, 0, 1024 * MiB, granules());
        custody::host::stream a;
        custody::host::stream b;
        std::vector<void*> blocks;
        for (int i = 0; i < 16; ++i) blocks.push_back(pool.allocate(a, 2 * MiB, 256));
        for (void* p : blocks) pool.deallocate(a, p, 2 * MiB, 256);
        platform::synchronize(a);
        // b's growth takes a's idle blocks into the shared set (opportunistic reuse)...
        void* small = pool.allocate(b, 64 * MiB, 256);
        // ...and what the threshold does not keep is unmapped.
        const auto st = pool.detailed_statistics();
        const std::size_t kept = st.totals.reserved_bytes - 64 * MiB - st.stream_cached_bytes;
        if (threshold == 0) CHECK(kept == 0);
        if (threshold == 8 * MiB) CHECK(kept <= 8 * MiB);
        CHECK(st.totals.peak_reserved_bytes <= 64 * MiB + 32 * MiB); // never both a's blocks and b's new ones
        pool.deallocate(b, small, 64 * MiB, 256);
        check_accounting(pool);
    }
}

TEST_CASE("release_threshold = 0: a stream's own large blocks go back to the device as they come back",
          "[pool][mapped][trim]") {
    // One stream, layer by layer: weights taken and given back on the stream that uses them. With
    // the threshold at 0, what its frees leave wholly free is unmapped once its event says no work
    // uses it (at the next large free), not kept in the stream's cache until trim().
    pool_options o = unchecked();
    o.release_threshold = 0;
    mapped_pool pool(o, 0, 1024 * MiB, granules());
    custody::host::stream s;
    for (int layer = 0; layer < 8; ++layer) {
        std::vector<std::pair<void*, std::size_t>> weights;
        for (int i = 0; i < 12; ++i) {
            const std::size_t n = (3 + static_cast<std::size_t>((layer + i) % 5)) * MiB;
            weights.emplace_back(pool.allocate(s, n, 256), n);
        }
        for (auto [p, n] : weights) pool.deallocate(s, p, n, 256);
        // All but the last block (its event is recorded at that free) and a granule it shares.
        INFO("layer " << layer << ": mapped " << pool.statistics().reserved_bytes);
        CHECK(pool.statistics().reserved_bytes <= 10 * MiB);
        CHECK(pool.upstream().mapped_bytes() == pool.statistics().reserved_bytes);
    }
    check_accounting(pool);
}

TEST_CASE("ten streams taking turns hold no more than PyTorch's allocator on the ten-stream trace",
          "[pool][mapped][streams]") {
    // The shape of a model whose layers are streamed in: one compute stream with activations, and
    // nine copy streams, each taking a layer's weights in turn and giving them back on its own
    // stream when the layer has run (each stream frees what it allocated, as the trace does).
    pool_options o = unchecked();
    mapped_pool pool(o, 0, 16384 * MiB, granules());
    std::vector<custody::host::stream> copies(9);
    custody::host::stream compute;
    std::size_t live = 0, peak_live = 0;
    const auto take = [&](custody::host::stream_view s, std::size_t n) {
        live += n;
        peak_live = std::max(peak_live, live);
        return pool.allocate(s, n, 256);
    };
    std::vector<std::pair<void*, std::size_t>> resident; // weights kept on the device
    for (int i = 0; i < 8; ++i) resident.emplace_back(take(compute, (32 + i) * MiB), (32 + i) * MiB);
    std::vector<std::pair<void*, std::size_t>> previous;
    for (int layer = 0; layer < 96; ++layer) {
        custody::host::stream& copy = copies[static_cast<std::size_t>(layer) % copies.size()];
        std::vector<std::pair<void*, std::size_t>> weights;
        for (int w = 0; w < 6; ++w) {
            const std::size_t n = (w % 3 == 0 ? 44 : 11) * MiB + (w == 5 ? 16 * KiB : 0);
            weights.emplace_back(take(copy, n), n);
        }
        std::vector<std::pair<void*, std::size_t>> activations;
        for (int a = 0; a < 5; ++a) {
            const std::size_t n = (layer % 2 == 0 ? 24 : 40) * MiB + static_cast<std::size_t>(a) * MiB;
            activations.emplace_back(take(compute, n), n);
        }
        for (auto [p, n] : activations) {
            pool.deallocate(compute, p, n, 256);
            live -= n;
        }
        // The previous layer's weights go back on their own stream once this layer's have come in.
        custody::host::stream& before = copies[static_cast<std::size_t>(layer + 8) % copies.size()];
        for (auto [p, n] : previous) {
            pool.deallocate(before, p, n, 256);
            live -= n;
        }
        previous = std::move(weights);
    }
    const auto st = pool.detailed_statistics();
    INFO("peak mapped " << st.totals.peak_reserved_bytes << ", peak live " << peak_live << ", host waits "
                        << st.host_waits << ", stream waits " << st.dependency_waits);
    CHECK(static_cast<double>(st.totals.peak_reserved_bytes) <= 1.083 * static_cast<double>(peak_live));
    for (auto [p, n] : previous) pool.deallocate(copies[(96 + 8) % copies.size()], p, n, 256);
    for (auto [p, n] : resident) pool.deallocate(compute, p, n, 256);
    check_accounting(pool);
}

TEST_CASE("over virtual memory a seeded workload matches a reference model exactly, streams coming and going",
          "[pool][mapped][model]") {
    // The model of support.hpp (as model_test.cpp runs it growing in chunks), with fewer shards than
    // streams (max_streams 4): quiet streams' shards are retired and serve new ones. Checked mode on
    // for odd seeds; trim at the end leaves mapped only what the live blocks touch.
    for (unsigned seed : {5u, 6u, 7u, 8u}) {
        INFO("seed " << seed);
        pool_options o = unchecked();
        o.max_streams = 4;
        o.maximum_size = 96 * MiB;
        o.release_threshold = seed == 6 ? 0 : SIZE_MAX;
        o.reuse = static_cast<reuse_policy>(seed % 3);
        o.checked = seed % 2 == 1;
        mapped_pool pool(o, 0, 1024 * MiB, granules());
        run_model(pool, o, seed, model_ops(30000));
        CHECK(pool.detailed_statistics().retired_streams > 0);
        CHECK(pool.upstream().mapped_bytes() == 0);
    }
}

// ---- one owner of the range: the pool's growth, direct allocations and failed unmaps ----

TEST_CASE("a block allocated from the upstream directly is never mapped over by the pool's growth",
          "[pool][mapped][range]") {
    mapped_pool pool(unchecked(), 0, 1024 * MiB, granules());
    custody::host::stream s;
    // The upstream's own first fit, before and after the pool has grown.
    void* before = pool.upstream().allocate(s, 4 * MiB, 256);
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (int i = 0; i < 48; ++i) {
        const std::size_t n = i % 3 == 0 ? (1 + static_cast<std::size_t>(i) % 5) * MiB + 4096 : 4096 + 4096 * static_cast<std::size_t>(i);
        REQUIRE_NOTHROW(blocks.emplace_back(pool.allocate(s, n, 256), n));
        if (i == 20) blocks.emplace_back(pool.upstream().allocate(s, 6 * MiB, 256), 6 * MiB + 1); // marked direct
    }
    for (const auto& [p, n] : blocks) {
        CHECK_FALSE(custody_test_overlap(p, detail::block_size(n), before, 4 * MiB));
    }
    for (const auto& [p, n] : blocks) {
        if (n == 6 * MiB + 1) {
            pool.upstream().deallocate(s, p, 6 * MiB, 256);
        } else {
            pool.deallocate(s, p, n, 256);
        }
    }
    pool.upstream().deallocate(s, before, 4 * MiB, 256);
    pool.trim();
    CHECK(pool.statistics().reserved_bytes == 0);
    check_accounting(pool);
}

TEST_CASE("a granule the upstream could not unmap at trim is never mapped over again", "[pool][mapped][range]") {
    using faulty_pool = stream_ordered_pool<custody::resource::virtual_memory<custody::test::faulty_vmm>>;
    using custody::test::vmm_faults;
    vmm_faults::reset();
    failure_log log;
    {
        faulty_pool pool(unchecked(), 0, 1024 * MiB, granules());
        custody::host::stream s;
        const auto round = [&] {
            std::vector<std::pair<void*, std::size_t>> blocks;
            for (int i = 0; i < 8; ++i) blocks.emplace_back(pool.allocate(s, 3 * MiB, 256), 3 * MiB);
            for (int i = 0; i < 8; ++i) blocks.emplace_back(pool.allocate(s, 64 * KiB, 256), 64 * KiB);
            for (const auto& [p, n] : blocks) pool.deallocate(s, p, n, 256);
        };
        round();
        vmm_faults::arm(custody::test::vmm_op::unmap, 1); // the first granule trim unmaps stays mapped
        pool.trim();
        CHECK(vmm_faults::injected == 1);
        CHECK_FALSE(log.lines().empty());
        for (int i = 0; i < 4; ++i) REQUIRE_NOTHROW(round()); // no growth over the granule kept
        check_accounting(pool);
        pool.trim();
    }
    vmm_faults::reset();
}

TEST_CASE("a single block may take more than half of the reservation", "[pool][mapped][range]") {
    // The pool claims three quarters of the range and gives large blocks three quarters of its
    // claim: one block of up to 9/16 of the reservation (docs/pool.md, sizing the reservation).
    mapped_pool pool(unchecked(), 0, 1024 * MiB, granules());
    custody::host::stream s;
    void* p = pool.allocate(s, 576 * MiB, 256);
    CHECK(p != nullptr);
    pool.deallocate(s, p, 576 * MiB, 256);
    check_accounting(pool);
}

// ---- exhaustion, whatever the size or the cause ----

namespace {

/// The host's memory and swap, from /proc/meminfo; 0 when unknown.
std::size_t host_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key;
    std::size_t kib = 0;
    std::size_t total = 0;
    std::string unit;
    while (in >> key >> kib >> unit) {
        if (key == "MemTotal:" || key == "SwapTotal:") total += kib * 1024;
    }
    return total;
}

/// Whether the kernel refuses to commit more than the host has (heuristic or strict overcommit).
bool commit_is_limited() {
    std::ifstream in("/proc/sys/vm/overcommit_memory");
    int mode = 1;
    return static_cast<bool>(in >> mode) && mode != 1;
}

/// A request the pool cannot serve is out_of_memory, counted once in failures, and leaves the live
/// blocks and counters as they were.
template <class Pool>
void check_refused(Pool& pool, custody::host::stream_view s, std::size_t n) {
    INFO("request " << n);
    const auto before = pool.detailed_statistics();
    CHECK_THROWS_AS(pool.allocate(s, n, 256), custody::out_of_memory);
    const auto after = pool.detailed_statistics();
    CHECK(after.failures == before.failures + 1);
    CHECK(after.totals.live_bytes == before.totals.live_bytes);
    CHECK(after.totals.live_allocations == before.totals.live_allocations);
    CHECK(after.totals.allocations == before.totals.allocations);
    CHECK(after.live_block_bytes == before.live_block_bytes);
    check_accounting(pool);
}

} // namespace

TEST_CASE("requests of any size the pool cannot serve are out_of_memory, counted, and change nothing",
          "[pool][mapped][oom]") {
    const std::size_t sizes[] = {std::size_t{1} << 40, std::size_t{1} << 47, std::size_t{1} << 62,
                                 (std::size_t{1} << 63) - 1, SIZE_MAX / 2 + 1, SIZE_MAX - 255, SIZE_MAX};
    SECTION("growing by mapping") {
        mapped_pool pool(unchecked(), 0, 1024 * MiB, granules());
        custody::host::stream s;
        void* keep = pool.allocate(s, 3 * MiB, 256);
        void* small = pool.allocate(s, 4096, 256);
        for (const std::size_t n : sizes) check_refused(pool, s, n);
        pool.deallocate(s, small, 4096, 256);
        pool.deallocate(s, keep, 3 * MiB, 256);
        void* again = pool.allocate(s, 3 * MiB, 256); // the pool still serves
        pool.deallocate(s, again, 3 * MiB, 256);
    }
    SECTION("growing in chunks") {
        stream_ordered_pool<host_memory> pool(unchecked());
        custody::host::stream s;
        void* keep = pool.allocate(s, 3 * MiB, 256);
        for (const std::size_t n : sizes) check_refused(pool, s, n);
        pool.deallocate(s, keep, 3 * MiB, 256);
    }
}

TEST_CASE("a request larger than the host's memory is out_of_memory after the last resort, not a system error",
          "[pool][mapped][oom]") {
    const std::size_t host = host_memory_bytes();
    if (host == 0 || !commit_is_limited()) {
        WARN("not checked: the kernel commits any size here (overcommit_memory = 1)");
        return;
    }
    const std::size_t n = custody::align_up(host + host / 2, granule);
    mapped_pool pool(unchecked(), 0, 4 * n, granules()); // address space only
    custody::host::stream s;
    void* keep = pool.allocate(s, 3 * MiB, 256);
    const auto before = pool.detailed_statistics();
    check_refused(pool, s, n);
    CHECK(pool.detailed_statistics().reclaims == before.reclaims + 1);
    CHECK(pool.upstream().mapped_bytes() == pool.statistics().reserved_bytes);
    pool.deallocate(s, keep, 3 * MiB, 256);
}
