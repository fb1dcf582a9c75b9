// Checks of a virtual_reservation under faults, shared by the host and cuda suites.
#pragma once

#include "faulty_vmm.hpp"

#include "catch.hpp"

#include <cstddef>
#include <system_error>
#include <vector>

namespace custody::test {

/// What basic_faulty_vmm holds now.
struct vmm_holding {
    long reservations;
    long handles;
    long mappings;
    friend bool operator==(const vmm_holding&, const vmm_holding&) = default;
};
inline vmm_holding vmm_held() {
    return {vmm_faults::reservations.load(), vmm_faults::handles.load(), vmm_faults::mappings.load()};
}

/// Maps `granules` granules at `offset` of `range` (a virtual_reservation over basic_faulty_vmm, not
/// mapped there) with a fault at each create (as exhaustion and as an error), each map and the
/// set_access in turn: every attempt fails, and leaves the mapped bytes, the physical allocations
/// and the mappings as they were; `after_each(range)` adds the platform's own checks. Then the
/// same map succeeds.
template <class Range, class AfterEach>
void check_failed_maps_change_nothing(Range& range, std::size_t offset, std::size_t granules, AfterEach after_each) {
    struct step {
        vmm_op op;
        int nth;
        vmm_fault how;
    };
    std::vector<step> steps;
    for (int k = 1; k <= static_cast<int>(granules); ++k) {
        steps.push_back({vmm_op::create, k, vmm_fault::exhausted});
        steps.push_back({vmm_op::create, k, vmm_fault::error});
        steps.push_back({vmm_op::map, k, vmm_fault::error});
    }
    steps.push_back({vmm_op::set_access, 1, vmm_fault::error});
    const std::size_t bytes = granules * range.granule();
    for (const step& s : steps) {
        INFO("operation " << static_cast<int>(s.op) << ", call " << s.nth);
        const vmm_holding before = vmm_held();
        const std::size_t mapped = range.mapped_bytes();
        vmm_faults::arm(s.op, s.nth, s.how);
        if (s.how == vmm_fault::exhausted) {
            CHECK_FALSE(range.map(offset, bytes));
        } else {
            CHECK_THROWS_AS(range.map(offset, bytes), std::system_error);
        }
        CHECK(vmm_faults::injected == 1);
        vmm_faults::reset();
        CHECK(range.mapped_bytes() == mapped);
        CHECK(vmm_held() == before);
        for (std::size_t g = 0; g < granules; ++g) CHECK_FALSE(range.is_mapped(offset + g * range.granule()));
        after_each(range);
    }
    REQUIRE(range.map(offset, bytes));
    CHECK(range.mapped_bytes() >= bytes);
}

} // namespace custody::test
