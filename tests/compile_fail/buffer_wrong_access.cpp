// A buffer of host-indexable memory cannot be made from a resource whose memory the host cannot
// read: freeing or reading through the wrong kind of resource is a compile error.
#include <custody/buffer/buffer.hpp>
#include <custody/platform/host.hpp>
#include <custody/resource/simulated_device_memory.hpp>

int main() {
    custody::host::simulated_device_memory device_memory(0, 1 << 20);
    custody::buffer<int, custody::host::platform, custody::device_accessible> ok(4, {}, device_memory);
    static_cast<void>(ok);
#ifdef CUSTODY_COMPILE_FAIL
    custody::buffer<int, custody::host::platform, custody::host_accessible> host_view(4, {}, device_memory);
    static_cast<void>(host_view);
#endif
    return 0;
}
