// Copying a reservation must not compile: two owners would commit (or give back) one region.
#include <custody/resource/host_memory.hpp>
#include <custody/staging/staging_ring.hpp>

#include <utility>

int main() {
    custody::staging::staging_ring<custody::resource::host_memory> ring(custody::staging::ring_options{.capacity = 1024});
    auto r = ring.reserve<int>(4);
#ifdef CUSTODY_COMPILE_FAIL
    auto copy = r;
    static_cast<void>(copy);
#else
    auto moved = std::move(r);
    static_cast<void>(moved);
#endif
    return 0;
}
