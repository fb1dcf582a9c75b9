// sleepable_memory on the host platform, for real: the pages of a sleeping owner leave the process
// (mincore, /proc), contents come back byte for byte or as zeros, work still queued is waited for,
// the rules, capture and replay (sleep_cases.hpp, shared with the GPU suite), offload through a
// staging ring, and the same access (peers) after a wake.
#include <custody/platform/host.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/sleep/sleepable_memory.hpp>
#include <custody/staging/staging_ring.hpp>

#include "../support/host_pages.hpp"
#include "sleep_cases.hpp"

#include "../support/catch.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace custody_test::sleep_cases;
using custody::sleep::sleep_options;
using host_memory_type = custody::sleep::sleepable_memory<custody::host::vmm, custody::resource::host_memory>;

static_assert(custody::stream_ordered_resource<host_memory_type>);
static_assert(custody::resource_with_statistics<host_memory_type>);
static_assert(custody::has_property<host_memory_type, custody::device_accessible>);
static_assert(custody::has_property<host_memory_type, custody::host_accessible>);

namespace {

using custody_test::host_pages::process_resident;
using custody_test::host_pages::protection;
using custody_test::host_pages::resident_bytes;
const std::size_t page = custody::host::vmm::page_size();

struct host_kit {
    using platform = custody::host::platform;
    using memory = host_memory_type;
    static std::unique_ptr<memory> make(sleep_options options) { return std::make_unique<memory>(0, std::move(options)); }
    static bool mapped(const void* p) { return custody_test::host_pages::mapped(p); }
};

/// host::vmm that logs which devices each set_access granted, to see what a wake grants.
struct access_log_vmm : custody::host::vmm {
    static inline std::mutex mutex;
    static inline std::vector<std::pair<const void*, std::vector<int>>> grants;
    static void set_access(void* ptr, std::size_t bytes, std::span<const int> devices) {
        custody::host::vmm::set_access(ptr, bytes, devices);
        std::lock_guard lock(mutex);
        grants.emplace_back(ptr, std::vector<int>(devices.begin(), devices.end()));
    }
    static std::vector<int> last_grant(const void* p) {
        std::lock_guard lock(mutex);
        for (auto it = grants.rbegin(); it != grants.rend(); ++it) {
            if (it->first == p) return it->second;
        }
        return {};
    }
};
static_assert(custody::virtual_memory_operations<access_log_vmm>);

} // namespace

TEST_CASE("sleepable_memory: a round trip keeps offloaded bytes and zeroes discarded ones", "[sleep]") {
    case_round_trip<host_kit>();
}
TEST_CASE("sleepable_memory: work still queued on a block's streams is waited for, not cut off", "[sleep]") {
    case_waits_for_queued_work<host_kit>();
}
TEST_CASE("sleepable_memory: the rules are typed errors that change nothing", "[sleep]") { case_rules<host_kit>(); }
TEST_CASE("sleepable_memory: capture is refused on a block's stream and untouched elsewhere; graphs replay after the wake",
          "[sleep][capture]") {
    case_capture<host_kit>();
}

TEST_CASE("sleepable_memory: a sleeping owner's pages leave the process and come back at the wake", "[sleep]") {
    host_kit::memory memory(0);
    custody::host::stream s;
    const std::size_t n = std::size_t{32} << 20;
    void* kv = memory.allocate(s, n, 256, custody::debug::intern_owner("kv_cache"));
    void* weights = memory.allocate(s, n, 256, custody::debug::intern_owner("weights"));
    std::memset(kv, 0x5A, n);
    std::memset(weights, 0x3C, n);
    REQUIRE(resident_bytes(kv, n) == n);
    REQUIRE(resident_bytes(weights, n) == n);

    const std::size_t before = process_resident();
    memory.sleep({"kv_cache"}, discard);
    const std::size_t after = process_resident();
    CHECK(resident_bytes(kv, n) == 0);
    CHECK(protection(kv) == "---p");
    // The process gave the pages back: at least three quarters of them, whatever else it touched.
    CHECK(before > after);
    CHECK(before - after >= n / 4 * 3);

    memory.sleep({"weights"}, offload);
    CHECK(resident_bytes(weights, n) == 0); // the contents now live in host memory of the backing
    CHECK(memory.detailed_statistics().offloaded_bytes == n);

    memory.wake({"kv_cache", "weights"});
    CHECK(resident_bytes(kv, n) == n); // zeroed: written, so resident
    const auto* w = static_cast<const unsigned char*>(weights);
    const auto* k = static_cast<const unsigned char*>(kv);
    CHECK(std::all_of(w, w + n, [](unsigned char c) { return c == 0x3C; }));
    CHECK(std::all_of(k, k + n, [](unsigned char c) { return c == 0; }));
    memory.deallocate(s, kv, n, 256);
    memory.deallocate(s, weights, n, 256);
}

TEST_CASE("sleepable_memory: offload through a staging ring keeps pinned memory to the ring's size", "[sleep][staging]") {
    using ring_type = custody::staging::staging_ring<custody::resource::host_memory>;
    using ringed = custody::sleep::sleepable_memory<custody::host::vmm, custody::resource::host_memory, ring_type>;
    ring_type ring(custody::staging::ring_options{.capacity = 64 << 10, .max_regions = 8, .chunk_bytes = 16 << 10, .devices = {0}});
    ringed memory(0, ring);
    custody::host::stream s;
    const std::size_t n = 300 * 1024 + 17; // many chunks, a ragged end
    const auto owner = custody::debug::intern_owner("weights");
    void* a = memory.allocate(s, n, 256, owner);
    void* b = memory.allocate(s, 4096, 256, owner);
    std::memcpy(a, cookie(11, n).data(), n);
    std::memcpy(b, cookie(12, 4096).data(), 4096);
    {
        custody::test::stream_gate<custody::host::platform> gate(s); // a write still queued
        custody::host::platform::memset_async(b, 0x77, 100, s);
        std::thread opener([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            gate.open();
        });
        memory.sleep({"weights"}, offload);
        opener.join();
    }
    CHECK(resident_bytes(a, n) == 0);
    CHECK(ring.statistics().bytes_downloaded >= n + 4096);
    memory.wake({"weights"});
    CHECK(bytes(static_cast<unsigned char*>(a), static_cast<unsigned char*>(a) + n) == cookie(11, n));
    bytes expect_b = cookie(12, 4096);
    std::fill(expect_b.begin(), expect_b.begin() + 100, 0x77);
    CHECK(bytes(static_cast<unsigned char*>(b), static_cast<unsigned char*>(b) + 4096) == expect_b);
    CHECK(ring.statistics().bytes_uploaded >= n + 4096);
    memory.deallocate(s, a, n, 256);
    memory.deallocate(s, b, 4096, 256);
}

TEST_CASE("sleepable_memory: a wake grants the same devices as the allocation did, peers granted later included",
          "[sleep][peers]") {
    using logged = custody::sleep::sleepable_memory<access_log_vmm, custody::resource::host_memory>;
    logged memory(0, sleep_options{.granule = 0, .peers = {2, 3, 2, 0}});
    custody::host::stream s;
    void* p = memory.allocate(s, 3 * page, 256, custody::debug::intern_owner("weights"));
    void* q = memory.allocate(s, page, 256, custody::debug::intern_owner("weights"));
    CHECK(access_log_vmm::last_grant(p) == std::vector<int>{0, 2, 3});
    memory.sleep({"weights"}, discard);
    memory.grant_access(5); // while asleep: given at the wake
    memory.wake({"weights"});
    CHECK(access_log_vmm::last_grant(p) == std::vector<int>{0, 2, 3, 5});
    CHECK(access_log_vmm::last_grant(q) == std::vector<int>{0, 2, 3, 5});
    void* r = memory.allocate(s, page, 256, custody::debug::intern_owner("weights"));
    CHECK(access_log_vmm::last_grant(r) == std::vector<int>{0, 2, 3, 5});
    CHECK_THROWS_AS(memory.grant_access(99), std::invalid_argument);
    CHECK_THROWS_AS(logged(0, sleep_options{.granule = 0, .peers = {99}}), std::invalid_argument);
    CHECK_THROWS_AS(logged(0, sleep_options{.granule = page * 3, .peers = {}}), std::invalid_argument);
    CHECK_THROWS_AS(logged(42), std::invalid_argument);
    for (void* x : {p, q, r}) memory.deallocate(s, x, 0, 256);
}

TEST_CASE("sleepable_memory: the contract's edge cases", "[sleep]") {
    host_kit::memory memory(0);
    CHECK(memory.allocate_sync(0, 256) == nullptr);
    memory.deallocate_sync(nullptr, 0, 256);
    CHECK_THROWS_AS(memory.allocate_sync(64, 3), std::invalid_argument);
    CHECK_THROWS_AS(memory.allocate_sync(64, 2 * page), std::invalid_argument);
    void* p = memory.allocate_sync(1, page);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % page == 0);
    CHECK(memory.statistics().live_bytes == 1);
    CHECK(memory.statistics().reserved_bytes == page);
    CHECK_THROWS_AS(memory.record(static_cast<char*>(p) + 1, custody::host::stream_view{}), std::invalid_argument);
    CHECK_THROWS_AS(memory.allocate_sync(SIZE_MAX - 10, 256), custody::out_of_memory);
    CHECK(memory.statistics().live_allocations == 1);
    // More than the host has: the address space is there, the kernel's commit is not (unless it
    // commits whatever is asked: overcommit_memory 1). Exhaustion all the same, nothing changed.
    if (custody_test::host_pages::overcommit_mode() != 1) {
        const auto before = memory.statistics();
        CHECK_THROWS_AS(memory.allocate_sync(std::size_t{1} << 44, 256), custody::out_of_memory);
        CHECK(memory.statistics() == before);
        CHECK(memory.detailed_statistics().mapped_bytes == page);
    }
    memory.deallocate_sync(p, 1, page);
    CHECK(memory.statistics() == custody::resource_statistics{0, 1, 0, page, 0, 1, 1});
}
