// Shared by the pool's test files: the names they use, the accounting identity, and a pool sized so
// that each free is visible to other streams at once.
#pragma once

#include <custody/platform/host.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/catch.hpp"
#include "../support/failure_log.hpp"

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>

#ifdef CUSTODY_TEST_ANNOUNCED
#include "../nvtx/recording.hpp"

#include <map>
#endif

namespace custody_pool_test {

using custody::host::platform;
using custody::host::simulated_device_memory;
using custody::pool::pool_options;
using custody::pool::reuse_policy;
using custody::pool::stream_ordered_pool;
using custody::resource::host_memory;
namespace detail = custody::pool::detail;
using custody::test::failure_log;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * 1024;

/// The accounting identity of pool_statistics, which must hold whenever no call is in flight.
template <class Pool>
void check_accounting(const Pool& pool) {
    const auto p = pool.detailed_statistics();
    INFO("reserved " << p.totals.reserved_bytes << " live blocks " << p.live_block_bytes << " cached "
                     << p.stream_cached_bytes << " shared " << p.shared_free_bytes << " quarantined "
                     << p.quarantined_bytes);
    CHECK(p.totals.reserved_bytes ==
          p.live_block_bytes + p.stream_cached_bytes + p.shared_free_bytes + p.quarantined_bytes);
    CHECK(p.live_block_bytes >= p.totals.live_bytes);
    CHECK(p.totals.live_allocations == p.totals.allocations - p.totals.deallocations);
    CHECK(p.totals.peak_reserved_bytes >= p.totals.reserved_bytes);
    CHECK(p.totals.peak_live_bytes >= p.totals.live_bytes);
}

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
/// Checked where these tests are built again with the NVTX recording tool loaded (tests/nvtx, which
/// defines CUSTODY_TEST_ANNOUNCED); nothing in the pool suite. Only one pool may be alive.
template <class Pool, class Live>
void check_announced([[maybe_unused]] const Pool& pool, [[maybe_unused]] const Live& live) {
#ifdef CUSTODY_TEST_ANNOUNCED
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
#endif
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

} // namespace custody_pool_test
