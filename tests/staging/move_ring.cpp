// Moving a staging ring must not compile: reservations and tickets point at it.
#include <custody/resource/host_memory.hpp>
#include <custody/staging/staging_ring.hpp>

#include <utility>

int main() {
    custody::staging::staging_ring<custody::resource::host_memory> ring(custody::staging::ring_options{.capacity = 1024});
#ifdef CUSTODY_COMPILE_FAIL
    auto other = std::move(ring);
    static_cast<void>(other);
#else
    static_cast<void>(ring.capacity());
#endif
    return 0;
}
