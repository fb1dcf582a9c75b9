// A resource_ref bound to a temporary would dangle at the end of the statement: refused.
#include <custody/core/resource_ref.hpp>
#include <custody/resource/host_memory.hpp>

int main() {
    custody::resource::host_memory named;
    custody::synchronous_resource_ref ok(named);
    static_cast<void>(ok);
#ifdef CUSTODY_COMPILE_FAIL
    custody::synchronous_resource_ref dangling{custody::resource::host_memory{}};
    static_cast<void>(dangling);
#endif
    return 0;
}
