// Copying an owning handle must not compile: two handles would free one block.
#include <custody/resource/host_memory.hpp>
#include <custody/platform/host.hpp>

int main() {
    custody::host::stream s;
#ifdef CUSTODY_COMPILE_FAIL
    custody::host::stream copy = s;
    static_cast<void>(copy);
#endif
    return 0;
}
