// sleepable_memory on a GPU: how fast an owner falls asleep and wakes, in bytes of the owner per
// second, side by side in one run with the copy it is bounded by.
//
//   sleep/<peer>/<bytes>, wake/<peer>/<bytes>   one owner of four blocks of bytes/4 (the device's
//                                               granule); only the sleep, or only the wake, is timed
//     discard         contents dropped (cuMemUnmap + cuMemRelease); the wake maps and zero-fills.
//                     vLLM's figure to beat: 47.4 GiB released in 0.31 s on an A100
//     offload         contents copied to pinned memory taken at each sleep (pinned_host:
//                     cudaHostAlloc pins fresh pages every time)
//     offload_cached  the pinned memory kept from one sleep to the next (a stream_ordered_pool over
//                     pinned_host, as PyTorch's caching host allocator keeps its pinned blocks)
//   copy/<out|in>/<bytes>                       cudaMemcpyAsync between the blocks and pinned memory
//                                               already allocated: the offload is held to >= 80% of it
//
// At the end each offload peer is printed as a ratio to the copy of its direction and size.
// CUSTODY_BENCH_SHORT=1 keeps to 64 MiB. Exits 77 without a device.
#include <custody/debug/owner_scope.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/platform/cuda_vmm.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/pinned_host.hpp>
#include <custody/sleep/sleepable_memory.hpp>

#include "sleep_cycle.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

using custody::cuda::platform;
using plain = custody::sleep::sleepable_memory<custody::cuda::vmm, custody::resource::pinned_host>;
using cached = custody::sleep::sleepable_memory<custody::cuda::vmm,
                                                custody::pool::stream_ordered_pool<custody::resource::pinned_host>>;
using custody::bench::owner_blocks;
using custody::bench::seconds;

template <class Memory>
std::unique_ptr<Memory> make_memory() {
    return std::make_unique<Memory>(0);
}

template <bool In>
void copy(benchmark::State& state) {
    const auto bytes = static_cast<std::size_t>(state.range(0));
    owner_blocks<plain> o(make_memory<plain>(), bytes);
    custody::resource::pinned_host pinned(0);
    std::vector<void*> host;
    for (std::size_t i = 0; i < custody::bench::sleep_blocks; ++i) host.push_back(pinned.allocate_sync(o.each, 256));
    custody::cuda::stream s(0);
    for (auto _ : state) {
        state.SetIterationTime(seconds([&] {
            for (std::size_t i = 0; i < host.size(); ++i) {
                if constexpr (In) {
                    platform::memcpy_async(o.ptrs[i], host[i], o.each, s);
                } else {
                    platform::memcpy_async(host[i], o.ptrs[i], o.each, s);
                }
            }
            platform::synchronize(s);
        }));
    }
    for (void* p : host) pinned.deallocate_sync(p, o.each, 256);
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

} // namespace

int main(int argc, char** argv) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("no CUDA device: skipped\n");
        return 77;
    }
    using custody::bench::register_sized;
    const auto sizes = custody::bench::owner_sizes({std::int64_t{1} << 30, std::int64_t{8} << 30}, std::int64_t{64} << 20);
    register_sized("copy/out", sizes, &copy<false>);
    register_sized("copy/in", sizes, &copy<true>);
    custody::bench::register_cycles(sizes, &make_memory<plain>, &make_memory<cached>);
    return custody::bench::run_registered(argc, argv);
}
