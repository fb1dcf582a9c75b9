// Copying an owning handle must not compile: two handles would give back one block.
#include <custody/buffer/buffer.hpp>
#include <custody/platform/host.hpp>
#include <custody/resource/host_memory.hpp>

int main() {
    custody::resource::host_memory r;
    custody::buffer<int, custody::host::platform, custody::host_accessible> a(4, {}, r);
#ifdef CUSTODY_COMPILE_FAIL
    auto b = a;
    static_cast<void>(b);
#endif
    return 0;
}
