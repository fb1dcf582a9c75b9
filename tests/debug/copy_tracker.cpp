// Copying a tracking resource must not compile: two ledgers would each believe they own the
// same blocks. Compiles cleanly without CUSTODY_COMPILE_FAIL (the control).
#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/host_memory.hpp>

int main() {
    custody::debug::tracking_resource<custody::resource::host_memory> tracker;
#ifdef CUSTODY_COMPILE_FAIL
    auto copy = tracker;
    static_cast<void>(copy);
#endif
    return tracker.statistics().live_allocations == 0 ? 0 : 1;
}
