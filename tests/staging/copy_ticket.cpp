// Copying a download ticket must not compile: two owners would release one region, and one could
// read it after the other had let it be reused.
#include <custody/resource/host_memory.hpp>
#include <custody/staging/staging_ring.hpp>

#include <utility>

int main() {
    custody::staging::staging_ring<custody::resource::host_memory> ring(custody::staging::ring_options{.capacity = 1024});
    int source[4] = {1, 2, 3, 4};
    auto t = ring.stage(source, 4, custody::host::stream_view{});
#ifdef CUSTODY_COMPILE_FAIL
    auto copy = t;
    static_cast<void>(copy);
#else
    auto moved = std::move(t);
    static_cast<void>(moved);
#endif
    return 0;
}
