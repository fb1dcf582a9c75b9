// sleepable_memory on the host platform: how fast an owner falls asleep and wakes, in bytes of
// the owner per second, side by side in one run with the copy it is bounded by.
//
//   sleep/<peer>/<bytes>, wake/<peer>/<bytes>   one owner of four blocks of bytes/4, granule 2 MiB
//                                               (a GPU's); only the sleep, or only the wake, is timed
//     discard         contents dropped; the wake fills zeros
//     offload         contents copied to host memory taken at each sleep (host_memory: fresh pages,
//                     as pinning fresh memory at each sleep does on a GPU)
//     offload_cached  the same through a stream_ordered_pool over host_memory: the host memory is
//                     kept from one sleep to the next (what a caching pinned allocator gives)
//     offload_ring    through a 16 MiB staging ring into pageable host memory
//   copy/<out|in>/<bytes>                       one memcpy_async between the blocks and host memory
//                                               already touched, on a host stream: the copy
//                                               bandwidth the offload is held to (>= 80% of it)
//   copy/<out|in>_fresh/<bytes>                 the same into pages just mapped: what the kernel
//                                               charges for new pages, as a sleep into host memory
//                                               taken fresh and every wake pay on this platform
//
// One sleep and wake run before the timed ones (a cached backing is then warm, as in a loop of
// them). At the end each offload peer's throughput is printed as a ratio to the copies of the
// same size and direction. CUSTODY_BENCH_SHORT=1 (the registered `meson test --benchmark` run) keeps to 8 MiB.
#include <custody/debug/owner_scope.hpp>
#include <custody/platform/host.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/sleep/sleepable_memory.hpp>
#include <custody/staging/staging_ring.hpp>

#include "sleep_cycle.hpp"

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using custody::host::platform;
using custody::sleep::sleep_policy;
using ring_type = custody::staging::staging_ring<custody::resource::host_memory>;
using plain = custody::sleep::sleepable_memory<custody::host::vmm, custody::resource::host_memory>;
using cached = custody::sleep::sleepable_memory<custody::host::vmm,
                                                custody::pool::stream_ordered_pool<custody::resource::host_memory>>;
using ringed = custody::sleep::sleepable_memory<custody::host::vmm, custody::resource::host_memory, ring_type>;

constexpr std::size_t granule = std::size_t{2} << 20;
using custody::bench::owner_blocks;
using custody::bench::seconds;
constexpr std::size_t blocks = custody::bench::sleep_blocks;

custody::sleep::sleep_options options() { return {.granule = granule, .peers = {}}; }

ring_type& ring() {
    static ring_type r(custody::staging::ring_options{.capacity = std::size_t{16} << 20, .max_regions = 64,
                                                      .chunk_bytes = std::size_t{2} << 20, .devices = {0}});
    return r;
}

template <class Memory>
std::unique_ptr<Memory> make_memory() {
    if constexpr (std::is_same_v<Memory, ringed>) {
        return std::make_unique<Memory>(0, ring(), options());
    } else {
        return std::make_unique<Memory>(0, options());
    }
}

/// Pages no one has touched: what the kernel hands out for memory just mapped.
struct fresh_pages {
    void* p;
    std::size_t n;
    explicit fresh_pages(std::size_t bytes)
        : p(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)), n(bytes) {}
    ~fresh_pages() { ::munmap(p, n); }
    fresh_pages(const fresh_pages&) = delete;
    fresh_pages& operator=(const fresh_pages&) = delete;
};

/// One copy of `bytes` between blocks and host memory on a host stream: memory already touched
/// (Fresh = false: the bandwidth bound), or pages mapped just before and not yet touched (Fresh:
/// what the kernel charges for new pages; the page faults are in the time, the mapping is not).
template <bool In, bool Fresh>
void copy(benchmark::State& state) {
    const auto bytes = static_cast<std::size_t>(state.range(0));
    owner_blocks<plain> o(make_memory<plain>(), bytes);
    std::vector<std::unique_ptr<char[]>> host;
    for (std::size_t i = 0; i < blocks; ++i) {
        host.emplace_back(new char[o.each]);
        std::memset(host.back().get(), 1, o.each);
    }
    custody::host::stream s;
    for (auto _ : state) {
        std::vector<std::unique_ptr<fresh_pages>> fresh;
        if constexpr (Fresh) {
            for (std::size_t i = 0; i < blocks; ++i) fresh.push_back(std::make_unique<fresh_pages>(o.each));
        }
        state.SetIterationTime(seconds([&] {
            for (std::size_t i = 0; i < blocks; ++i) {
                void* target = Fresh ? fresh[i]->p : (In ? o.ptrs[i] : host[i].get());
                const void* source = In ? static_cast<const void*>(host[i].get()) : o.ptrs[i];
                platform::memcpy_async(target, source, o.each, s);
            }
            platform::synchronize(s);
        }));
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

} // namespace

int main(int argc, char** argv) {
    using custody::bench::register_sized;
    using custody::bench::sleep_cycle;
    const auto sizes = custody::bench::owner_sizes({std::int64_t{64} << 20, std::int64_t{512} << 20}, std::int64_t{8} << 20);
    register_sized("copy/out", sizes, &copy<false, false>);
    register_sized("copy/in", sizes, &copy<true, false>);
    register_sized("copy/out_fresh", sizes, &copy<false, true>);
    register_sized("copy/in_fresh", sizes, &copy<true, true>);
    custody::bench::register_cycles(sizes, &make_memory<plain>, &make_memory<cached>);
    register_sized("sleep/offload_ring", sizes, &sleep_cycle<ringed, false>, sleep_policy::offload, &make_memory<ringed>);
    register_sized("wake/offload_ring", sizes, &sleep_cycle<ringed, true>, sleep_policy::offload, &make_memory<ringed>);
    return custody::bench::run_registered(argc, argv);
}
