// Compile-fail: std::pmr over memory the host cannot touch is refused at compile time.
#include <custody/interop/pmr.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

int main() {
#ifdef CUSTODY_COMPILE_FAIL
    custody::host::simulated_device_memory memory(0, 1 << 20);
#else
    custody::resource::host_memory memory;
#endif
    custody::interop::pmr_adaptor adaptor(memory);
    return adaptor.is_equal(adaptor) ? 0 : 1;
}
