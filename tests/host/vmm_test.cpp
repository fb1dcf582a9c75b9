// The virtual-memory operations of the host platform, virtual_reservation and the virtual_memory
// resource: real reservations, commits and decommits; unmapping in any order; export; and the
// strong guarantee under a fault at every operation.
#include <custody/core/failure_callback.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/resource/virtual_memory.hpp>
#include <custody/resource/virtual_reservation.hpp>

#include "../support/failure_log.hpp"
#include "../support/host_pages.hpp"
#include "../support/faulty_platform.hpp"
#include "../support/faulty_vmm.hpp"
#include "../support/vmm_checks.hpp"

#include "../support/catch.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

using custody::host::vmm;
using custody::resource::reservation_options;
using custody::test::faulty_vmm;
using custody::test::vmm_fault;
using custody::test::vmm_faults;
using custody::test::vmm_op;
using faulty_range = custody::resource::virtual_reservation<faulty_vmm>;
using faulty_memory = custody::resource::virtual_memory<faulty_vmm>;

static_assert(custody::try_allocatable_resource<custody::resource::virtual_memory<vmm>>);
static_assert(custody::resource_with_statistics<custody::resource::virtual_memory<vmm>>);
static_assert(custody::device_bound_resource<custody::resource::virtual_memory<vmm>>);
static_assert(custody::has_property<custody::resource::virtual_memory<vmm>, custody::device_accessible>);
static_assert(custody::has_property<custody::resource::virtual_memory<vmm>, custody::host_accessible>);

namespace {

const std::size_t page = vmm::page_size();

using custody_test::host_pages::protection;
using custody_test::host_pages::resident_pages;

using held = custody::test::vmm_holding;
held holding() { return custody::test::vmm_held(); }

using custody::test::failure_log;

struct fault_scope {
    fault_scope() { vmm_faults::reset(); }
    ~fault_scope() { vmm_faults::reset(); }
    fault_scope(const fault_scope&) = delete;
    fault_scope& operator=(const fault_scope&) = delete;
};

} // namespace

TEST_CASE("host vmm: a reservation is address space only until memory is mapped and made accessible", "[vmm]") {
    const std::size_t n = 16 * page;
    void* base = vmm::reserve(0, n, 64 * page);
    REQUIRE(base != nullptr);
    CHECK(custody::is_aligned(base, 64 * page));
    CHECK(protection(base) == "---p");
    CHECK(resident_pages(base, n) == 0);

    auto h = vmm::create(0, 4 * page, false);
    REQUIRE(h);
    auto* at = static_cast<std::byte*>(base) + 4 * page;
    vmm::map(at, 4 * page, *h);
    CHECK(protection(at) == "---p"); // mapped, not accessible yet
    const int devices[] = {0, 3};
    vmm::set_access(at, 4 * page, devices);
    CHECK(protection(at) == "rw-p");
    CHECK(protection(base) == "---p"); // the rest of the reservation is untouched
    std::memset(at, 0x5a, 4 * page);
    CHECK(resident_pages(at, 4 * page) == 4);

    REQUIRE(vmm::unmap(0, at, 4 * page));
    vmm::release(*h);
    CHECK(protection(at) == "---p");
    CHECK(resident_pages(at, 4 * page) == 0); // the pages went back to the system

    // Mapped again, the memory is fresh: nothing of the old contents survives.
    auto again = vmm::create(0, 4 * page, false);
    vmm::map(at, 4 * page, *again);
    vmm::set_access(at, 4 * page, devices);
    CHECK(static_cast<unsigned char>(at[0]) == 0);
    CHECK(static_cast<unsigned char>(at[4 * page - 1]) == 0);
    REQUIRE(vmm::unmap(0, at, 4 * page));
    vmm::release(*again);
    vmm::free_reservation(0, base, n);
    CHECK(protection(base).empty());
}

TEST_CASE("host vmm: bad devices and whole-handle mapping are refused", "[vmm]") {
    CHECK_FALSE(vmm::supported(-1));
    CHECK_FALSE(vmm::supported(custody::host::platform::device_count()));
    CHECK_THROWS_AS(vmm::granularity(-1), std::invalid_argument);
    CHECK_THROWS_AS(vmm::create(custody::host::platform::device_count(), page, false), std::invalid_argument);
    void* base = vmm::reserve(0, 4 * page, page);
    auto h = vmm::create(0, 2 * page, false);
    CHECK_THROWS_AS(vmm::map(base, page, *h), std::invalid_argument);
    vmm::map(base, 2 * page, *h);
    const int bad[] = {0, 99};
    CHECK_THROWS_AS(vmm::set_access(base, 2 * page, bad), std::invalid_argument);
    CHECK(protection(base) == "---p");
    CHECK_THROWS_AS(vmm::export_fd(*h), std::invalid_argument); // not created exportable
    REQUIRE(vmm::unmap(0, base, 2 * page));
    vmm::release(*h);
    vmm::free_reservation(0, base, 4 * page);
}

TEST_CASE("host vmm: exported memory is the same memory in another mapping, and outlives the export's owner",
          "[vmm]") {
    custody::resource::virtual_memory<vmm> r(0, 64 * page, reservation_options{.granule = 0, .exportable = true, .peers = {}});
    auto* p = static_cast<unsigned char*>(r.allocate_sync(3 * page, 256));
    std::memset(p, 0x11, 3 * page);
    p[page + 7] = 0x77;
    const int fd = r.export_fd(p + page + 7); // the granule holding that byte
    REQUIRE(fd >= 0);
    void* other = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(other != MAP_FAILED);
    auto* q = static_cast<unsigned char*>(other);
    CHECK(q[7] == 0x77);
    q[8] = 0x88; // written through the other mapping, seen through the resource's
    CHECK(p[page + 8] == 0x88);
    r.deallocate_sync(p, 3 * page, 256);
    CHECK(q[7] == 0x77); // the memory lives while someone maps it
    ::munmap(other, page);
    ::close(fd);

    custody::resource::virtual_memory<vmm> plain(0, 16 * page);
    void* b = plain.allocate_sync(page, 256);
    CHECK_THROWS_AS(plain.export_fd(b), std::invalid_argument);
    plain.deallocate_sync(b, page, 256);
}

TEST_CASE("virtual_reservation: granules map and unmap in any order with exact counts", "[vmm]") {
    fault_scope faults;
    const held before = holding();
    {
        faulty_range range(1, 64 * page + 1);
        CHECK(range.granule() == page);
        CHECK(range.reserved_bytes() == 65 * page); // rounded up to the granule
        CHECK(range.mapped_bytes() == 0);
        CHECK(range.device() == 1);
        CHECK(range.access() == std::vector<int>{1});
        CHECK(holding().reservations == before.reservations + 1);

        // 16 runs of 4 granules, mapped in order, each stamped with its number.
        auto* base = static_cast<unsigned char*>(range.base());
        for (std::size_t run = 0; run < 16; ++run) {
            REQUIRE(range.map(run * 4 * page, 4 * page));
            std::memset(base + run * 4 * page, static_cast<int>(run + 1), 4 * page);
        }
        CHECK(range.mapped_bytes() == 64 * page);
        CHECK(holding().handles == before.handles + 64);
        CHECK(holding().mappings == before.mappings + 64);

        // Every granule unmapped alone, in a shuffled order; the others keep their contents.
        std::vector<std::size_t> order(64);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), std::mt19937(7));
        std::vector<bool> gone(64, false);
        for (std::size_t k = 0; k < 32; ++k) {
            const std::size_t g = order[k];
            REQUIRE(range.unmap(g * page, page));
            gone[g] = true;
            CHECK_FALSE(range.is_mapped(g * page));
            CHECK(resident_pages(base + g * page, page) == 0);
        }
        CHECK(range.mapped_bytes() == 32 * page);
        for (std::size_t g = 0; g < 64; ++g) {
            if (!gone[g]) CHECK(base[g * page] == g / 4 + 1);
        }
        // A hole is mapped again on its own.
        REQUIRE(range.map(order[0] * page, page));
        CHECK(base[order[0] * page] == 0);
        CHECK(range.mapped_bytes() == 33 * page);
    } // destruction gives everything back
    CHECK(holding() == before);
}

TEST_CASE("virtual_reservation: bad ranges are std::invalid_argument and change nothing", "[vmm]") {
    fault_scope faults;
    faulty_range range(0, 16 * page);
    REQUIRE(range.map(4 * page, 4 * page));
    const held before = holding();
    const int creates = vmm_faults::calls_of(vmm_op::create);
    CHECK_THROWS_AS(range.map(6 * page, 4 * page), std::invalid_argument);  // overlaps a mapped granule
    CHECK_THROWS_AS(range.map(page / 2, page), std::invalid_argument);      // not aligned
    CHECK_THROWS_AS(range.map(0, page + 1), std::invalid_argument);         // not whole granules
    CHECK_THROWS_AS(range.map(0, 0), std::invalid_argument);
    CHECK_THROWS_AS(range.map(12 * page, 8 * page), std::invalid_argument); // past the end
    CHECK_THROWS_AS(range.map(SIZE_MAX - page + 1, page), std::invalid_argument);
    CHECK_THROWS_AS(range.unmap(2 * page, 4 * page), std::invalid_argument); // not all mapped
    CHECK_THROWS_AS(range.is_mapped(16 * page), std::invalid_argument);
    CHECK_THROWS_AS(range.export_fd(4 * page), std::invalid_argument);       // not exportable
    CHECK(range.mapped_bytes() == 4 * page);
    CHECK(holding() == before);
    CHECK(vmm_faults::calls_of(vmm_op::create) == creates); // refused before any driver call

    CHECK_THROWS_AS(faulty_range(0, 0), std::invalid_argument);
    CHECK_THROWS_AS(faulty_range(-1, page), std::invalid_argument);
    CHECK_THROWS_AS(faulty_range(0, page, reservation_options{.granule = 3 * page, .exportable = false, .peers = {}}), std::invalid_argument);
    CHECK_THROWS_AS(faulty_range(0, page, reservation_options{.granule = page / 2, .exportable = false, .peers = {}}), std::invalid_argument);
    CHECK_THROWS_AS(faulty_range(0, page, reservation_options{.granule = 0, .exportable = false, .peers = {1, 99}}), std::invalid_argument);
    CHECK(holding() == before);
}

TEST_CASE("virtual_reservation: a map that fails at any operation leaves nothing mapped", "[vmm][faults]") {
    fault_scope faults;
    faulty_range range(0, 32 * page, reservation_options{.granule = 2 * page, .exportable = false, .peers = {2}});
    REQUIRE(range.map(0, 2 * page)); // not empty when the failures come
    custody::test::check_failed_maps_change_nothing(range, 8 * page, 4, [](const faulty_range& r) {
        CHECK(protection(static_cast<std::byte*>(r.base()) + 8 * page) == "---p");
    });
    CHECK(range.mapped_bytes() == 10 * page);
}

TEST_CASE("virtual_reservation: an unmap that fails keeps that granule mapped and counted", "[vmm][faults]") {
    fault_scope faults;
    failure_log log;
    const held before = holding();
    {
        faulty_range range(0, 8 * page);
        REQUIRE(range.map(0, 4 * page));
        vmm_faults::arm(vmm_op::unmap, 2);
        CHECK_FALSE(range.unmap(0, 4 * page));
        CHECK(range.mapped_bytes() == page);
        CHECK(range.is_mapped(page));
        CHECK_FALSE(range.is_mapped(0));
        CHECK(log.lines().size() == 1);
        REQUIRE(range.unmap(page, page)); // the driver works again: it goes
        CHECK(range.mapped_bytes() == 0);
        // A release that fails is reported; the handle is lost to the reservation, not the count.
        REQUIRE(range.map(0, page));
        vmm_faults::arm(vmm_op::release, 1);
        REQUIRE(range.unmap(0, page));
        CHECK(range.mapped_bytes() == 0);
        CHECK(log.lines().size() == 2);
        CHECK(holding().handles == before.handles + 1);
        vmm_faults::handles -= 1; // the injected release leaked it on purpose
    }
    CHECK(holding() == before);
}

TEST_CASE("virtual_reservation: reserve failures are out_of_memory or the error, holding nothing", "[vmm][faults]") {
    fault_scope faults;
    const held before = holding();
    vmm_faults::arm(vmm_op::reserve, 1, vmm_fault::exhausted);
    CHECK_THROWS_AS(faulty_range(0, 8 * page), custody::out_of_memory);
    vmm_faults::arm(vmm_op::reserve, 1, vmm_fault::error);
    CHECK_THROWS_AS(faulty_range(0, 8 * page), std::system_error);
    CHECK_THROWS_AS(faulty_range(0, SIZE_MAX - 2), custody::out_of_memory);
    CHECK(holding() == before);
    // A reservation whose range would not be freed is reported, not thrown.
    failure_log log;
    {
        faulty_range range(0, 8 * page);
        vmm_faults::arm(vmm_op::free_reservation, 1);
    }
    CHECK(log.lines().size() == 1);
    vmm_faults::reservations -= 1; // leaked on purpose by the injected failure
}

TEST_CASE("virtual_reservation: peers get access to what is mapped now and later", "[vmm]") {
    fault_scope faults;
    faulty_range range(0, 32 * page, reservation_options{.granule = 0, .exportable = false, .peers = {2, 0, 2}});
    CHECK(range.access() == std::vector<int>{0, 2});
    REQUIRE(range.map(0, 2 * page));
    REQUIRE(range.map(4 * page, page));
    REQUIRE(range.map(5 * page, page)); // adjacent to the one before: one run with it
    const int calls = vmm_faults::calls_of(vmm_op::set_access);
    CHECK_THROWS_AS(range.grant_access(99), std::invalid_argument);
    vmm_faults::arm(vmm_op::set_access, 2);
    CHECK_THROWS_AS(range.grant_access(5), std::system_error);
    CHECK(range.access() == std::vector<int>{0, 2});
    range.grant_access(5);
    CHECK(range.access() == std::vector<int>{0, 2, 5});
    // Two runs, two calls each time (the failed attempt made two as well).
    CHECK(vmm_faults::calls_of(vmm_op::set_access) == calls + 4);
    range.grant_access(2); // already there: nothing to do
    CHECK(vmm_faults::calls_of(vmm_op::set_access) == calls + 4);
}

TEST_CASE("virtual_memory: blocks take whole granules, and freeing them gives the memory back", "[vmm]") {
    custody::resource::virtual_memory<vmm> r(0, 256 * page, reservation_options{.granule = 4 * page, .exportable = false, .peers = {}});
    CHECK(r.granularity() == 4 * page);
    CHECK(r.reserved_bytes() == 256 * page);
    auto* a = static_cast<unsigned char*>(r.allocate_sync(1, 1));
    auto* b = static_cast<unsigned char*>(r.allocate_sync(4 * page + 1, 4 * page));
    CHECK(custody::is_aligned(b, 4 * page));
    CHECK(r.mapped_bytes() == 12 * page);
    CHECK(r.statistics().live_bytes == 4 * page + 2);
    CHECK(r.statistics().reserved_bytes == 12 * page);
    std::memset(b, 1, 4 * page + 1);
    CHECK(resident_pages(b, 8 * page) == 5);
    r.deallocate_sync(b, 4 * page + 1, 4 * page);
    CHECK(resident_pages(b, 8 * page) == 0);
    CHECK(r.mapped_bytes() == 4 * page);
    CHECK(r.statistics().reserved_bytes == 4 * page);
    CHECK_THROWS_AS(r.allocate_sync(8, 8 * page), std::invalid_argument); // above the granule
    const auto s = r.vmm_statistics();
    CHECK(s.reserved_bytes == 256 * page);
    CHECK(s.mapped_bytes == 4 * page);
    CHECK(s.free_bytes == 252 * page);
    CHECK(s.largest_free == 252 * page);
    r.deallocate_sync(a, 1, 1);
    CHECK(r.vmm_statistics().largest_free == 256 * page); // coalesced
}

TEST_CASE("virtual_memory: exhaustion of address space or of memory is out_of_memory and changes nothing",
          "[vmm][faults]") {
    fault_scope faults;
    faulty_memory r(0, 16 * page);
    void* held_block = r.allocate_sync(4 * page, 256);
    const auto stats = r.statistics();
    const auto vstats = r.vmm_statistics();
    try {
        static_cast<void>(r.allocate_sync(13 * page, 256));
        FAIL("13 pages fit in 12");
    } catch (const custody::out_of_memory& e) {
        CHECK_THAT(std::string(e.what()), custody_test::contains("largest free range"));
    }
    CHECK(r.try_allocate({}, 13 * page, 256) == nullptr);
    CHECK(r.try_allocate({}, SIZE_MAX, 256) == nullptr);
    for (vmm_op op : {vmm_op::create, vmm_op::map, vmm_op::set_access}) {
        for (vmm_fault how : {vmm_fault::exhausted, vmm_fault::error}) {
            if (how == vmm_fault::exhausted && op != vmm_op::create) continue;
            const int nth = op == vmm_op::set_access ? 1 : 2; // one set_access per block, the rest per granule
            vmm_faults::arm(op, nth, how);
            if (how == vmm_fault::exhausted) {
                CHECK_THROWS_AS(r.allocate_sync(3 * page, 256), custody::out_of_memory);
            } else {
                CHECK_THROWS_AS(r.allocate_sync(3 * page, 256), std::system_error);
                vmm_faults::reset();
                vmm_faults::arm(op, nth, how);
                CHECK(r.try_allocate({}, 3 * page, 256) == nullptr);
            }
            vmm_faults::reset();
            CHECK(r.statistics() == stats);
            const auto now = r.vmm_statistics();
            CHECK(now.mapped_bytes == vstats.mapped_bytes);
            CHECK(now.free_bytes == vstats.free_bytes);
            CHECK(now.largest_free == vstats.largest_free);
        }
    }
    void* p = r.allocate_sync(12 * page, 256); // everything that is left, still whole
    r.deallocate_sync(p, 12 * page, 256);
    r.deallocate_sync(held_block, 4 * page, 256);
    CHECK(r.vmm_statistics().largest_free == 16 * page);
}

TEST_CASE("virtual_memory: a block whose unmap fails is never handed out again", "[vmm][faults]") {
    fault_scope faults;
    failure_log log;
    const held before = holding();
    {
        faulty_memory r(0, 8 * page);
        auto* a = static_cast<unsigned char*>(r.allocate_sync(2 * page, 256));
        vmm_faults::arm(vmm_op::unmap, 1);
        r.deallocate_sync(a, 2 * page, 256);
        CHECK(r.statistics().live_allocations == 0);
        CHECK(r.vmm_statistics().withheld_bytes == 2 * page);
        CHECK(r.mapped_bytes() == page); // the granule that would not go
        std::vector<std::pair<unsigned char*, std::size_t>> blocks;
        while (void* p = r.try_allocate({}, page, 256)) blocks.emplace_back(static_cast<unsigned char*>(p), page);
        CHECK(blocks.size() == 6);
        for (auto [p, n] : blocks) CHECK((p + n <= a || p >= a + 2 * page));
        for (auto [p, n] : blocks) r.deallocate_sync(p, n, 256);
    } // the destructor unmaps the withheld granule too
    CHECK(holding() == before);
    CHECK(log.lines().size() == 1);
}

TEST_CASE("virtual_memory: a seeded run of allocations and frees keeps every block and every count exact",
          "[vmm]") {
    fault_scope faults;
    const held before = holding();
    {
        faulty_memory r(0, 1024 * page);
        std::mt19937 rng(20261123);
        struct block {
            unsigned char* p;
            std::size_t n;
            unsigned char cookie;
        };
        std::vector<block> live;
        std::size_t live_bytes = 0;
        std::size_t live_span = 0;
        std::size_t failures = 0;
        for (int i = 0; i < 20000; ++i) {
            if (live.empty() || rng() % 2 == 0) {
                const std::size_t n = 1 + rng() % (8 * page);
                auto* p = static_cast<unsigned char*>(r.try_allocate({}, n, 256));
                if (p == nullptr) {
                    ++failures;
                    continue;
                }
                const auto cookie = static_cast<unsigned char>(i);
                p[0] = cookie;
                p[n - 1] = cookie;
                live.push_back({p, n, cookie});
                live_bytes += n;
                live_span += custody::align_up(n, page);
            } else {
                const std::size_t k = rng() % live.size();
                const block b = live[k];
                REQUIRE(b.p[0] == b.cookie);
                REQUIRE(b.p[b.n - 1] == b.cookie);
                r.deallocate_sync(b.p, b.n, 256);
                live[k] = live.back();
                live.pop_back();
                live_bytes -= b.n;
                live_span -= custody::align_up(b.n, page);
            }
            if (i % 1000 == 0) {
                REQUIRE(r.statistics().live_bytes == live_bytes);
                REQUIRE(r.mapped_bytes() == live_span);
                REQUIRE(holding().mappings - before.mappings == static_cast<long>(live_span / page));
                const auto s = r.vmm_statistics();
                REQUIRE(s.free_bytes + live_span == s.reserved_bytes);
            }
        }
        CHECK(r.statistics().live_allocations == live.size());
        INFO("failed allocations " << failures);
        for (const block& b : live) r.deallocate_sync(b.p, b.n, 256);
        CHECK(r.mapped_bytes() == 0);
        CHECK(r.vmm_statistics().largest_free == 1024 * page);
    }
    CHECK(holding() == before);
}

namespace {
/// host::vmm's operations, for memory whose streams are the faulty platform's.
struct vmm_on_faulty_platform : vmm {
    using platform_type = custody::test::faulty_platform;
};
} // namespace

TEST_CASE("virtual_memory: a block whose stream cannot be waited for stays mapped and is never reused",
          "[vmm][faults]") {
    using custody::test::platform_faults;
    custody::test::faults_reset reset;
    failure_log log;
    custody::resource::virtual_memory<vmm_on_faulty_platform> r(0, 8 * page);
    custody::test::faulty_stream stream(0);
    auto* a = static_cast<unsigned char*>(r.allocate(stream, 2 * page, 256));
    platform_faults::stream_synchronize = 1;
    r.deallocate(stream, a, 2 * page, 256); // its work may still run: unmapping would fault it
    CHECK(log.lines().size() == 1);
    CHECK(r.statistics().live_allocations == 0);
    CHECK(r.mapped_bytes() == 2 * page); // still mapped: the stream's work can still use it
    a[0] = 1;
    CHECK(r.vmm_statistics().withheld_bytes == 2 * page);
    CHECK(r.vmm_statistics().free_bytes == 6 * page);
    // The process exiting is not reported.
    void* b = r.allocate(stream, page, 256);
    platform_faults::stream_synchronize = 1;
    platform_faults::exiting = true;
    r.deallocate(stream, b, page, 256);
    CHECK(log.lines().size() == 1);
    CHECK(r.vmm_statistics().withheld_bytes == 3 * page);
}
