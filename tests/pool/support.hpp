// Shared by the pool's test files: the names they use, the accounting identity, a pool sized so that
// each free is visible to other streams at once, and the model test that runs over either growth.
#pragma once

#include <custody/platform/host.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../nvtx/recording.hpp"
#include "../support/catch.hpp"
#include "../support/failure_log.hpp"
#include "../support/sizes.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

namespace custody_pool_test {

using custody::host::platform;
using custody::host::simulated_device_memory;
using custody::pool::pool_options;
using custody::pool::reuse_policy;
using custody::pool::stream_ordered_pool;
using custody::resource::host_memory;
namespace detail = custody::pool::detail;
using custody::test::failure_log;

using custody::test::KiB;
using custody::test::MiB;

/// The accounting identity of pool_statistics, which must hold whenever no call is in flight.
template <class Pool>
void check_accounting(const Pool& pool) {
    const auto p = pool.detailed_statistics();
    INFO("reserved " << p.totals.reserved_bytes << " live blocks " << p.live_block_bytes << " cached "
                     << p.stream_cached_bytes << " shared " << p.shared_free_bytes << " quarantined "
                     << p.quarantined_bytes);
    CHECK(p.totals.reserved_bytes == p.live_block_bytes + p.stream_cached_bytes + p.shared_free_bytes +
                                         p.quarantined_bytes + p.capture_reserved_bytes);
    CHECK(p.capture_reserved_bytes == p.capture_live_block_bytes + p.capture_free_bytes);
    CHECK(p.live_block_bytes + p.capture_live_block_bytes >= p.totals.live_bytes);
    CHECK(p.totals.live_allocations == p.totals.allocations - p.totals.deallocations);
    CHECK(p.totals.peak_reserved_bytes >= p.totals.reserved_bytes);
    CHECK(p.totals.peak_live_bytes >= p.totals.live_bytes);
}

/// Whether these tests run with NVTX's recording tool loaded (the nvtx suite runs them so).
inline bool announced_run() { return custody_nvtx_test::recording_run(); }

/// A live block of a test's model as (address, requested bytes).
template <class Block>
std::pair<std::uintptr_t, std::size_t> announced_entry(const std::pair<const std::uintptr_t, Block>& e) {
    return {e.first, e.second.bytes};
}
template <class Stream>
std::pair<std::uintptr_t, std::size_t> announced_entry(const std::tuple<void*, std::size_t, Stream>& e) {
    return {reinterpret_cast<std::uintptr_t>(std::get<0>(e)), std::get<1>(e)};
}

/// What CUDA's tools were told matches the pool: exactly the blocks of `live` are regions, with
/// their requested sizes; the heaps hold exactly the pool's reserve (for a pool that maps, its
/// address space, once it mapped anything); no call broke NVTX's rules.
/// Checked when the NVTX recording tool is loaded (the nvtx suite runs these tests with it); nothing
/// otherwise. Only one pool may be alive.
template <class Pool, class Live>
void check_announced(const Pool& pool, const Live& live) {
    if (!announced_run()) return;
    std::map<std::uintptr_t, std::size_t> expected;
    for (const auto& e : live) expected.insert(announced_entry(e));
    const custody_nvtx_test::recording r = custody_nvtx_test::read();
    for (const auto& v : r.violations) FAIL_CHECK(v);
    REQUIRE(r.violations.empty());
    REQUIRE(r.region_sizes() == expected);
    const auto d = pool.detailed_statistics();
    const std::size_t held = d.address_space_bytes == 0 ? d.totals.reserved_bytes
                             : d.upstream_allocations == 0 ? 0
                                                           : d.address_space_bytes;
    REQUIRE(r.heap_bytes() == held);
}

/// A pool of `chunks` chunks of `n` bytes whose streams record their event at every free and keep
/// no working set, so that each free is at once visible to other streams as the policy allows.
inline custody::pool::pool_options tight(custody::pool::reuse_policy policy, std::size_t n, std::size_t chunks) {
    custody::pool::pool_options o;
    o.reuse = policy;
    o.stream_working_set = 0;
    o.record_interval = 1;
    o.growth_step = n;
    o.maximum_size = n * chunks;
    return o;
}

// ---- the model test, over either growth ----------------------------------------------------------

/// Operations per seed of the model tests: CUSTODY_POOL_MODEL_OPS when set (a long run: 1000000),
/// else `fallback`, short enough for CI.
inline int model_ops(int fallback) {
    const char* env = std::getenv("CUSTODY_POOL_MODEL_OPS");
    const long n = env != nullptr ? std::strtol(env, nullptr, 10) : 0;
    return n > 0 && n <= 100000000 ? static_cast<int>(n) : fallback;
}

/// A reference model of a pool's live blocks, by address, and of the counts its statistics must
/// show: every block handed out is aligned, overlaps no live block (at its rounded size: the memory
/// really held) and gets a cookie, which must be intact when it comes back.
struct pool_model {
    struct block {
        std::size_t bytes;
        std::size_t alignment;
        unsigned char cookie;
        std::size_t slot; ///< the stream slot it was allocated on
        std::size_t span; ///< the memory it holds: its block size
    };
    std::map<std::uintptr_t, block> live;
    std::size_t live_bytes = 0;
    std::size_t peak = 0;
    std::uint64_t allocations = 0;
    std::uint64_t deallocations = 0;
    std::uint64_t failures = 0;
    bool peak_exact = true; ///< false once capture-private blocks were live (the pool's peak leaves them out)

    /// The bytes of a block a cookie is written to and checked in (all of small blocks).
    static constexpr std::size_t touched = 4096;

    /// Records `p`, handed out for (`n`, `alignment`) on stream slot `slot`, after checking it;
    /// `span`: the memory it holds (the pool's block size; a capture-private block's is `n` rounded
    /// to the granule).
    void handed_out(void* p, std::size_t n, std::size_t alignment, unsigned char cookie, std::size_t slot,
                    std::size_t span = 0) {
        REQUIRE(custody::is_aligned(p, alignment));
        const auto a = reinterpret_cast<std::uintptr_t>(p);
        if (span == 0) span = detail::block_size(n);
        auto next = live.lower_bound(a);
        if (next != live.end()) REQUIRE(a + span <= next->first);
        if (next != live.begin()) {
            auto prev = std::prev(next);
            REQUIRE(prev->first + prev->second.span <= a);
        }
        std::memset(p, cookie, std::min(n, touched));
        live.emplace(a, block{n, alignment, cookie, slot, span});
        live_bytes += n;
        peak = std::max(peak, live_bytes);
        ++allocations;
    }

    /// Checks the cookie of the block at `it` and forgets it (the caller gives it back).
    void given_back(std::map<std::uintptr_t, block>::iterator it) {
        const auto* bytes = reinterpret_cast<const unsigned char*>(it->first);
        bool intact = true;
        for (std::size_t i = 0; i < std::min(it->second.bytes, touched); i += 61) intact = intact && bytes[i] == it->second.cookie;
        REQUIRE(intact);
        live_bytes -= it->second.bytes;
        ++deallocations;
        live.erase(it);
    }

    /// The pool's counts are the model's, exactly.
    template <class Pool>
    void check(const Pool& pool, std::size_t maximum) const {
        const auto s = pool.statistics();
        REQUIRE(s.live_bytes == live_bytes);
        REQUIRE(s.live_allocations == live.size());
        REQUIRE(s.allocations == allocations);
        REQUIRE(s.deallocations == deallocations);
        if (peak_exact) {
            REQUIRE(s.peak_live_bytes == peak);
        } else {
            REQUIRE(s.peak_live_bytes <= peak);
        }
        REQUIRE(s.reserved_bytes <= maximum);
    }
};

/// A seeded workload of `ops` operations through `pool` (options `o`), checked against a
/// pool_model after every operation: allocations of every size and alignment up to a page on up
/// to six streams and the default stream, each stream destroyed and made anew now and then (its
/// blocks given back on others later), blocks given back on their own stream or another, trims,
/// and now and then a capture routed into a private pool (three blocks, released at once, given
/// back later like any other; not where NVTX is recorded, whose check takes every live block for a
/// region of its own).
template <class Pool>
void run_model(Pool& pool, const pool_options& o, unsigned seed, int ops) {
    using stream = custody::host::stream;
    std::vector<std::optional<stream>> streams(6);
    const auto stream_at = [&](std::size_t slot) -> custody::host::stream_view {
        if (slot == streams.size()) return custody::host::stream_view{}; // the default stream
        if (!streams[slot]) streams[slot].emplace();
        return streams[slot]->view();
    };
    pool_model m;
    std::mt19937_64 rng(seed);
    for (int op = 0; op < ops; ++op) {
        const unsigned dice = static_cast<unsigned>(rng() % 1000);
        const std::size_t slot = rng() % (streams.size() + 1);
        if (dice < 540 || m.live.empty()) {
            const unsigned kind = static_cast<unsigned>(rng() % 10);
            const std::size_t n = kind < 6 ? 1 + rng() % 2048 : kind < 9 ? 1 + rng() % (512 * KiB) : MiB + rng() % (5 * MiB);
            const std::size_t alignment = std::size_t{1} << (rng() % 13);
            try {
                void* p = pool.allocate(stream_at(slot), n, alignment);
                m.handed_out(p, n, alignment, static_cast<unsigned char>(rng()), slot);
            } catch (const custody::out_of_memory&) {
                ++m.failures;
            }
        } else if (dice < 990) {
            auto it = m.live.begin();
            std::advance(it, static_cast<std::ptrdiff_t>(rng() % m.live.size()));
            // On its own stream when that one still lives (sometimes another), else on this slot's.
            const std::size_t own = it->second.slot;
            const bool alive = own == streams.size() || streams[own].has_value();
            const std::size_t on = alive && rng() % 4 != 0 ? own : slot;
            const std::uintptr_t address = it->first;
            const std::size_t bytes = it->second.bytes;
            const std::size_t alignment = it->second.alignment;
            m.given_back(it);
            pool.deallocate(stream_at(on), reinterpret_cast<void*>(address), bytes, alignment);
        } else if (dice < 995) {
            if (slot < streams.size()) streams[slot].reset(); // destroyed: its blocks come back on others later
        } else if (dice < 998) {
            pool.trim();
        } else if (!announced_run()) {
            // A capture routed into a private pool, on a stream of the model's (its capture is not
            // begun: the route claims the stream without asking the platform).
            const std::size_t cap = rng() % streams.size();
            const custody::pool::capture_pool_id id = pool.make_capture_pool_id();
            pool.begin_allocate_to_pool(id, stream_at(cap));
            for (int i = 0; i < 3; ++i) {
                const std::size_t n = 1 + rng() % (256 * KiB);
                try {
                    void* p = pool.allocate(stream_at(cap), n, 256);
                    m.handed_out(p, n, 256, static_cast<unsigned char>(rng()), cap, custody::align_up(n, detail::granule));
                    m.peak_exact = false;
                } catch (const custody::out_of_memory&) {
                    ++m.failures;
                }
            }
            pool.end_allocate_to_pool(id);
            pool.release_pool(id); // its memory goes back once its blocks have
        }
        if (op % 2000 == 0) check_accounting(pool);
        if (op % 97 == 0) check_announced(pool, m.live);
        m.check(pool, o.maximum_size + pool.detailed_statistics().capture_reserved_bytes);
    }
    CHECK(pool.detailed_statistics().failures == m.failures);
    check_accounting(pool);
    for (const auto& [a, b] : m.live) pool.deallocate(stream_at(0), reinterpret_cast<void*>(a), b.bytes, b.alignment);
    pool.trim();
    CHECK(pool.statistics().reserved_bytes == 0);
}

} // namespace custody_pool_test
