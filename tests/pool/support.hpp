// Shared by the pool's test files: the accounting identity, a failure log, and a pool sized so that
// each free is visible to other streams at once.
#pragma once

#include <custody/core/report.hpp>
#include <custody/pool/pool_options.hpp>

#include "../support/catch.hpp"

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace custody_pool_test {

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

/// Collects what the pool reports through custody::report_failure.
struct failure_log {
    static std::vector<std::string>& lines() {
        static std::vector<std::string> l;
        return l;
    }
    static std::mutex& mutex() {
        static std::mutex m;
        return m;
    }
    static void callback(std::string_view message) noexcept {
        std::lock_guard lock(mutex());
        try {
            lines().emplace_back(message);
        } catch (...) {
        }
    }
    failure_log() {
        lines().clear();
        previous_ = custody::set_failure_callback(&callback);
    }
    ~failure_log() { custody::set_failure_callback(previous_); }
    failure_log(const failure_log&) = delete;
    failure_log& operator=(const failure_log&) = delete;
    custody::failure_callback previous_;
};


/// A pool of `chunks` chunks of `n` bytes whose streams record their event at every free, so that
/// each free is at once visible to other streams as the policy allows.
inline custody::pool::pool_options tight(custody::pool::reuse_policy policy, std::size_t n, std::size_t chunks) {
    custody::pool::pool_options o;
    o.reuse = policy;
    o.record_interval = 1;
    o.growth_step = n;
    o.maximum_size = n * chunks;
    return o;
}

} // namespace custody_pool_test
