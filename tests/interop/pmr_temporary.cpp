// Compile-fail: an adaptor bound to a temporary resource would dangle at the end of the statement.
#include <custody/interop/pmr.hpp>
#include <custody/resource/host_memory.hpp>

int main() {
#ifdef CUSTODY_COMPILE_FAIL
    custody::interop::pmr_adaptor adaptor(custody::resource::host_memory{});
#else
    custody::resource::host_memory memory;
    custody::interop::pmr_adaptor adaptor(memory);
#endif
    return adaptor.is_equal(adaptor) ? 0 : 1;
}
