// The plans of a sleep and of a wake over many owners: matching the blocks to the k owners named
// costs O(n + k), counted in the comparisons and hashes of owner names it makes (a count, not a
// time), and stays the same per owner from a few hundred owners to thousands.
#include <custody/debug/owner_scope.hpp>
#include <custody/platform/host.hpp>
#include <custody/sleep/detail/block_ledger.hpp>
#include <custody/sleep/detail/sleep_plan.hpp>

#include "../support/catch.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

/// An owner id that counts every comparison and hash made of it.
struct counted_owner {
    static inline std::size_t operations = 0;
    custody::debug::owner_id id = nullptr;

    counted_owner() = default;
    explicit counted_owner(custody::debug::owner_id i) noexcept : id(i) {}
    operator custody::debug::owner_id() const noexcept { return id; } // NOLINT: its name, for messages
    friend bool operator==(const counted_owner& a, const counted_owner& b) noexcept {
        ++operations;
        return a.id == b.id;
    }
};

/// An address range that maps nothing: the ledger only asks where it is and what it holds.
struct unmapped_range {
    std::uintptr_t at;
    [[nodiscard]] void* base() const noexcept { return reinterpret_cast<void*>(at); }
    [[nodiscard]] std::size_t span() const noexcept { return 4096; }
    [[nodiscard]] std::size_t mapped_bytes() const noexcept { return 4096; }
};

} // namespace

template <>
struct std::hash<counted_owner> {
    std::size_t operator()(const counted_owner& o) const noexcept {
        ++counted_owner::operations;
        return std::hash<custody::debug::owner_id>{}(o.id);
    }
};

namespace {

using P = custody::host::platform;
using ledger_type = custody::sleep::detail::block_ledger<unmapped_range, P::stream_view, counted_owner>;

/// Owner names, comparisons and hashes made to plan the sleep, then the wake, of k owners of one
/// block each (with as many blocks of an owner not named between them).
struct counts {
    std::size_t sleep;
    std::size_t wake;
};
counts operations_for(std::size_t k) {
    ledger_type ledger;
    std::vector<std::string> names;
    for (std::size_t i = 0; i < 2 * k; ++i) {
        names.push_back(i % 2 == 0 ? "plan-owner-" + std::to_string(i / 2) : "plan-bystander");
        ledger_type::block_type b;
        b.range = std::make_unique<unmapped_range>(unmapped_range{0x10000 + i * 4096});
        b.bytes = 4096;
        b.owner = counted_owner(custody::debug::intern_owner(names.back()));
        b.uses.push_back({P::stream_view{}, 0});
        ledger.add(std::move(b));
    }
    std::vector<custody::sleep::owner_sleep> request;
    std::vector<std::string_view> owners;
    for (std::size_t i = 0; i < k; ++i) {
        owners.emplace_back(names[2 * i]);
        request.push_back({owners.back(), i % 3 == 0 ? custody::sleep::sleep_policy::offload
                                                     : custody::sleep::sleep_policy::discard});
    }

    counted_owner::operations = 0;
    const auto sleep = custody::sleep::detail::plan_sleep<P>(ledger, request, {});
    const std::size_t sleep_operations = counted_owner::operations;
    REQUIRE(sleep.blocks.size() == k);
    for (std::size_t i = 0; i < k; ++i) {
        REQUIRE(sleep.owners[sleep.slots[i]].first == sleep.blocks[i]->owner);
        REQUIRE(sleep.policies[i] == request[sleep.slots[i]].policy);
    }
    for (const auto& [id, policy] : sleep.owners) ledger.fell_asleep(ledger.owner(id), policy, 0);

    counted_owner::operations = 0;
    const auto wake = custody::sleep::detail::plan_wake(ledger, owners);
    const std::size_t wake_operations = counted_owner::operations;
    REQUIRE(wake.blocks.size() == k);
    return {sleep_operations, wake_operations};
}

} // namespace

TEST_CASE("sleepable_memory: planning a sleep and a wake of k owners costs O(k) comparisons", "[sleep][plan]") {
    const counts few = operations_for(500);
    const counts many = operations_for(8000);
    INFO("sleep: " << few.sleep << " then " << many.sleep << "; wake: " << few.wake << " then " << many.wake);
    // A handful per owner and per block, whatever k is: no owner is compared with every other.
    CHECK(many.sleep <= 24 * 8000);
    CHECK(many.wake <= 16 * 8000);
    CHECK(many.sleep * 500 <= few.sleep * 8000 * 3 / 2);
    CHECK(many.wake * 500 <= few.wake * 8000 * 3 / 2);
}
