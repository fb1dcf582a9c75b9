// sleepable_memory under a fault at every step of a sleep and of a wake: each host allocation for
// the offload, each copy and fill, each wait, each block's create, map and set_access, each unmap.
// A step that throws leaves the owners, their contents, the counts and what the platform holds as
// they were (strong guarantee); a step that cannot be undone (an unmap, a wait after the fence) is
// reported and counted, and the wake after it still gives the right contents back.
#include "faulty_sleep.hpp"
#include "../support/host_pages.hpp"
#include "sleep_cases.hpp"

#include "../support/failure_log.hpp"
#include "../support/vmm_checks.hpp"

#include "../support/catch.hpp"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

using namespace custody_test::sleep_cases;
using namespace custody_test::faulty_sleep;

namespace {

struct pages {
    static bool mapped(const void* p) { return custody_test::host_pages::mapped(p); }
};
bool mapped_page(const void* p) { return pages::mapped(p); }

/// Two owners: "weights" (offloaded) with blocks of 1 and 3 granules, "kv" (discarded) with blocks
/// of 2 granules and of one byte.
struct scene {
    memory_type memory{0};
    custody::test::faulty_stream stream{0};
    std::size_t g = memory.granularity();
    std::vector<void*> blocks;
    std::vector<std::size_t> sizes{g, 3 * g, 2 * g, 1};
    std::vector<bool> offloaded{true, true, false, false};

    scene() {
        for (std::size_t i = 0; i < sizes.size(); ++i) {
            const char* owner = offloaded[i] ? "weights" : "kv";
            blocks.push_back(memory.allocate(stream, sizes[i], 256, custody::debug::intern_owner(owner)));
            put<P>(blocks[i], cookie(static_cast<unsigned>(i), sizes[i]));
        }
    }
    ~scene() {
        for (std::size_t i = 0; i < blocks.size(); ++i) memory.deallocate(stream, blocks[i], sizes[i], 256);
    }
    std::size_t span_of(std::size_t i) const { return (sizes[i] + g - 1) / g * g; }
    /// The spans of the blocks in the order a wake maps them (by address) or, with `sleeping`, the
    /// order a sleep unmaps them (the discarded ones by address, then the offloaded ones).
    std::vector<std::size_t> spans_in_order(bool sleeping) const {
        std::vector<std::size_t> order(blocks.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
            if (sleeping && offloaded[a] != offloaded[b]) return !offloaded[a];
            return blocks[a] < blocks[b];
        });
        std::vector<std::size_t> spans;
        for (std::size_t i : order) spans.push_back(span_of(i));
        return spans;
    }
    void sleep() { memory.sleep({{"weights", offload}, {"kv", discard}}); }
    void wake() { memory.wake({"weights", "kv"}); }
    /// Every block holds what it was given (awake) or what a wake gives back.
    void check_contents(bool woken) {
        for (std::size_t i = 0; i < blocks.size(); ++i) {
            const bytes expected = offloaded[i] || !woken ? cookie(static_cast<unsigned>(i), sizes[i]) : bytes(sizes[i], 0);
            CHECK(get<P>(blocks[i], sizes[i]) == expected);
        }
    }
    /// Rewrites the discarded owner's cookies (after a wake zeroed them).
    void refill() {
        for (std::size_t i = 0; i < blocks.size(); ++i) put<P>(blocks[i], cookie(static_cast<unsigned>(i), sizes[i]));
    }
};

/// What must not change when a step fails: the counts (not the tallies of sleeps and wakes), the
/// platform's holdings and the host memory of the offload.
struct state {
    custody::resource_statistics stats;
    std::size_t mapped;
    std::size_t asleep;
    std::size_t offloaded;
    std::size_t stuck;
    std::size_t sleeping;
    custody::test::vmm_holding held;
    std::size_t backing_live;
    friend bool operator==(const state&, const state&) = default;
};
state state_of(memory_type& m) {
    const auto d = m.detailed_statistics();
    return {m.statistics(), d.mapped_bytes, d.asleep_bytes, d.offloaded_bytes, d.stuck_bytes, d.sleeping_owners,
            custody::test::vmm_held(), m.backing().upstream().statistics().live_bytes};
}

/// One way to make a step fail, and the exception it must raise.
struct fault {
    std::string name;
    std::function<void()> arm;
    std::function<void(const std::function<void()>&)> expect_throw;
};
template <class E>
std::function<void(const std::function<void()>&)> throws() {
    return [](const std::function<void()>& f) { CHECK_THROWS_AS(f(), E); };
}

} // namespace

TEST_CASE("sleepable_memory: a sleep that fails at any step leaves every owner awake and as it was", "[sleep][faults]") {
    all_faults_reset reset;
    scene sc;
    std::vector<fault> faults;
    for (int k = 1; k <= 2; ++k) {
        faults.push_back({"offload memory " + std::to_string(k), [&, k] { sc.memory.backing().fail_at(k); },
                          throws<custody::out_of_memory>()});
        faults.push_back({"copy out " + std::to_string(k), [k] { platform_faults::copy_at = k; }, throws<platform_fault>()});
    }
    faults.push_back({"the fence", [] { platform_faults::event_synchronize = 1; }, throws<platform_fault>()});
    for (const fault& f : faults) {
        INFO(f.name);
        const state before = state_of(sc.memory);
        f.arm();
        f.expect_throw([&] { sc.sleep(); });
        all_faults_reset::reset();
        P::synchronize(sc.stream); // nothing of ours is pending on it; its deferred frees have run
        CHECK_FALSE(sc.memory.is_asleep("weights"));
        CHECK_FALSE(sc.memory.is_asleep("kv"));
        CHECK(state_of(sc.memory) == before);
        sc.check_contents(false);
    }
    // And then the same sleep succeeds.
    sc.sleep();
    CHECK(sc.memory.detailed_statistics().mapped_bytes == 0);
    sc.wake();
    sc.check_contents(true);
}

TEST_CASE("sleepable_memory: an unmap that fails in a sleep is reported and counted, and the wake restores all",
          "[sleep][faults]") {
    all_faults_reset reset;
    scene sc;
    const std::vector<std::size_t> spans = sc.spans_in_order(true);
    for (int k = 1; k <= static_cast<int>(sc.blocks.size()); ++k) {
        INFO("unmap " << k);
        custody::test::failure_log log;
        const auto held = custody::test::vmm_held();
        vmm_faults::arm(vmm_op::unmap, k);
        sc.sleep();
        all_faults_reset::reset();
        CHECK(log.lines().size() == 1);
        const auto d = sc.memory.detailed_statistics();
        CHECK(d.stuck_bytes == spans[static_cast<std::size_t>(k - 1)]);
        CHECK(d.mapped_bytes == spans[static_cast<std::size_t>(k - 1)]);
        CHECK(custody::test::vmm_held().mappings == held.mappings - static_cast<long>(sc.blocks.size()) + 1);
        CHECK(sc.memory.is_asleep("weights"));
        sc.wake();
        sc.check_contents(true);
        CHECK(sc.memory.detailed_statistics().stuck_bytes == 0);
        CHECK(sc.memory.detailed_statistics().mapped_bytes == 7 * sc.g);
        CHECK(custody::test::vmm_held() == held);
        sc.refill();
    }
}

TEST_CASE("sleepable_memory: a copy out that cannot be waited for keeps its block mapped with its contents",
          "[sleep][faults]") {
    all_faults_reset reset;
    for (int k = 1; k <= 2; ++k) { // the copy of the first, then of the second offloaded block
        INFO("copy " << k);
        scene sc;
        custody::test::failure_log log;
        platform_faults::event_wait_at = 1 + k; // the waits: the fence's, then each copy's in order
        sc.sleep();
        all_faults_reset::reset();
        CHECK(log.lines().size() == 1);
        CHECK(sc.memory.is_asleep("weights"));
        const auto d = sc.memory.detailed_statistics();
        // The kept block is one of the offloaded ones: its span stays mapped, and its host memory went back.
        CHECK((d.stuck_bytes == sc.g || d.stuck_bytes == 3 * sc.g));
        CHECK(d.offloaded_bytes == 4 * sc.g - d.stuck_bytes);
        sc.wake();
        sc.check_contents(true);
        CHECK(sc.memory.detailed_statistics().stuck_bytes == 0);
        CHECK(sc.memory.detailed_statistics().offloaded_bytes == 0);
    }
}

TEST_CASE("sleepable_memory: a wake that fails at any step leaves every owner asleep, nothing mapped, contents kept",
          "[sleep][faults]") {
    all_faults_reset reset;
    scene sc;
    sc.sleep();
    const int blocks = static_cast<int>(sc.blocks.size());
    std::vector<fault> faults;
    for (int k = 1; k <= blocks; ++k) {
        faults.push_back({"create exhausted " + std::to_string(k), [k] { vmm_faults::arm(vmm_op::create, k, vmm_fault::exhausted); },
                          throws<custody::out_of_memory>()});
        faults.push_back({"create error " + std::to_string(k), [k] { vmm_faults::arm(vmm_op::create, k); },
                          throws<std::system_error>()});
        faults.push_back({"map " + std::to_string(k), [k] { vmm_faults::arm(vmm_op::map, k); }, throws<std::system_error>()});
    }
    for (int k = 1; k <= blocks; ++k) {
        faults.push_back({"set_access " + std::to_string(k), [k] { vmm_faults::arm(vmm_op::set_access, k); },
                          throws<std::system_error>()});
    }
    for (int k = 1; k <= 2; ++k) {
        faults.push_back({"copy back " + std::to_string(k), [k] { platform_faults::copy_at = k; }, throws<platform_fault>()});
        faults.push_back({"zero fill " + std::to_string(k), [k] { platform_faults::fill_at = k; }, throws<platform_fault>()});
    }
    faults.push_back({"the wait for the copies", [] { platform_faults::stream_synchronize = 1; }, throws<platform_fault>()});
    for (const fault& f : faults) {
        INFO(f.name);
        const state before = state_of(sc.memory);
        f.arm();
        f.expect_throw([&] { sc.wake(); });
        all_faults_reset::reset();
        CHECK(sc.memory.is_asleep("weights"));
        CHECK(sc.memory.is_asleep("kv"));
        CHECK(state_of(sc.memory) == before);
        for (std::size_t i = 0; i < sc.blocks.size(); ++i) CHECK(all_unmapped<pages>(sc.blocks[i], sc.sizes[i], sc.g));
    }
    sc.wake();
    sc.check_contents(true);
}

TEST_CASE("sleepable_memory: when a failed wake cannot wait for its copies, their pages stay with the sleeping owner",
          "[sleep][faults]") {
    all_faults_reset reset;
    scene sc;
    sc.sleep();
    custody::test::failure_log log;
    const auto held = custody::test::vmm_held();
    platform_faults::stream_synchronize = 2; // the wake's wait, and its undo's
    CHECK_THROWS_AS(sc.wake(), platform_fault);
    all_faults_reset::reset();
    CHECK(log.lines().size() == 1);
    CHECK(sc.memory.is_asleep("weights"));
    const auto d = sc.memory.detailed_statistics();
    CHECK(d.stuck_bytes == 7 * sc.g); // all of it was mapped for the wake, and stays so
    CHECK(d.mapped_bytes == 7 * sc.g);
    CHECK(d.offloaded_bytes == 4 * sc.g);
    CHECK(custody::test::vmm_held().mappings == held.mappings + static_cast<long>(sc.blocks.size()));
    sc.wake(); // maps nothing more, restores and zeroes
    CHECK(custody::test::vmm_held().mappings == held.mappings + static_cast<long>(sc.blocks.size()));
    sc.check_contents(true);
    CHECK(sc.memory.detailed_statistics().stuck_bytes == 0);
}

TEST_CASE("sleepable_memory: an unmap that fails while a failed wake is undone leaves that granule with its owner",
          "[sleep][faults]") {
    all_faults_reset reset;
    scene sc;
    sc.sleep();
    custody::test::failure_log log;
    const auto held = custody::test::vmm_held();
    vmm_faults::arm(vmm_op::create, static_cast<int>(sc.blocks.size())); // the last block: the others are undone
    vmm_faults::arm(vmm_op::unmap, 1);                                     // the undo's first unmap fails
    vmm_faults::kind = vmm_fault::error;
    CHECK_THROWS_AS(sc.wake(), std::system_error);
    all_faults_reset::reset();
    CHECK(log.lines().size() == 1);
    CHECK(sc.memory.is_asleep("kv"));
    // The undo goes last first: the block before the last in address order is the one kept.
    CHECK(sc.memory.detailed_statistics().stuck_bytes == sc.spans_in_order(false)[sc.blocks.size() - 2]);
    CHECK(custody::test::vmm_held().mappings == held.mappings + 1);
    sc.wake();
    sc.check_contents(true);
    CHECK(sc.memory.detailed_statistics().stuck_bytes == 0);
}

TEST_CASE("sleepable_memory: a block a failed wake could not undo is never copied into as it is", "[sleep][faults]") {
    all_faults_reset reset;
    scene sc;
    sc.sleep();
    custody::test::failure_log log;
    // The first block's access fails, and so does the unmap undoing its map: it stays mapped, its
    // access unknown (inaccessible on the host: a copy into it would fault).
    vmm_faults::arm(vmm_op::set_access, 1);
    vmm_faults::arm(vmm_op::unmap, 1);
    CHECK_THROWS_AS(sc.wake(), std::system_error);
    all_faults_reset::reset();
    CHECK(sc.memory.is_asleep("weights"));
    CHECK(sc.memory.detailed_statistics().stuck_bytes == sc.spans_in_order(false)[0]);
    // While it still will not unmap, the wake refuses it and changes nothing.
    vmm_faults::arm(vmm_op::unmap, 1);
    CHECK_THROWS_AS(sc.wake(), custody::error);
    all_faults_reset::reset();
    CHECK(sc.memory.is_asleep("weights"));
    CHECK(sc.memory.detailed_statistics().stuck_bytes == sc.spans_in_order(false)[0]);
    // Once it unmaps, it is mapped anew and gets its contents.
    sc.wake();
    sc.check_contents(true);
    CHECK(sc.memory.detailed_statistics().stuck_bytes == 0);
    CHECK(log.lines().size() == 2);
}

TEST_CASE("sleepable_memory: a free whose stream cannot be waited for keeps the block mapped, withheld", "[sleep][faults]") {
    all_faults_reset reset;
    custody::test::failure_log log;
    const auto held = custody::test::vmm_held();
    {
        memory_type memory(0);
        custody::test::faulty_stream s(0);
        void* p = memory.allocate(s, 3 * memory.granularity(), 256, nullptr);
        platform_faults::stream_synchronize = 1;
        memory.deallocate(s, p, 3 * memory.granularity(), 256);
        CHECK(log.lines().size() == 1);
        CHECK(mapped_page(p));
        CHECK(memory.statistics().live_allocations == 0);
        CHECK(memory.detailed_statistics().withheld_bytes == 3 * memory.granularity());
        CHECK(memory.detailed_statistics().mapped_bytes == 3 * memory.granularity());
    }
    CHECK(custody::test::vmm_held() == held); // destruction gave it back
}
