// sleepable_memory with faults a test can arm at every step: the host platform's virtual memory
// (basic_faulty_vmm: reserve, create, map, set_access, unmap, release), the faulty host platform
// (copies, fills, waits) and a backing whose allocations can fail (fault_injecting). A test file
// takes all of it with `using namespace custody_test::faulty_sleep;`.
#pragma once

#include <custody/platform/host_vmm.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/sleep/sleepable_memory.hpp>

#include "../support/faulty_platform.hpp"
#include "../support/faulty_vmm.hpp"

namespace custody_test::faulty_sleep {

using custody::test::platform_fault;
using custody::test::platform_faults;
using custody::test::vmm_fault;
using custody::test::vmm_faults;
using custody::test::vmm_op;

using P = custody::test::faulty_platform;
using vmm = custody::test::basic_faulty_vmm<custody::host::vmm, P>;
using backing = custody::resource::fault_injecting<custody::test::faulty_memory>;
using memory_type = custody::sleep::sleepable_memory<vmm, backing>;

/// Disarms every fault of the platform and of the virtual memory when a case begins and ends.
struct all_faults_reset {
    all_faults_reset() { reset(); }
    ~all_faults_reset() { reset(); }
    all_faults_reset(const all_faults_reset&) = delete;
    all_faults_reset& operator=(const all_faults_reset&) = delete;
    static void reset() {
        custody::test::vmm_faults::reset();
        custody::test::platform_faults::reset();
    }
};

} // namespace custody_test::faulty_sleep
