// The cases sanitizer_check.sh runs under compute-sanitizer, one per invocation (the first
// argument), compiled with nvcc at test time. Each exits 0 when its own work went as planned; what
// the sanitizer reports about it is the script's to judge. Exits 77 without a device.
//   overflow annotated|plain  a kernel writes one byte past a 1 KiB pool block, into the first byte
//                             of its neighbour after the neighbour was given back: memory of the
//                             pool's chunk that belongs to no live block (a byte of a live neighbour
//                             would be a valid access, whatever the annotations). Exits 3 when the
//                             two blocks are not adjacent (the write would prove nothing).
//                             `plain`: pool_options::annotate = false
//   clean                     in-bounds kernels only, with the stream-ordered reuse a pool lives on:
//                             a block given back on its stream while a kernel still writes it, then
//                             handed out again on that stream and on another (after an event); a
//                             captured graph whose temporaries are given back during the capture,
//                             replayed; the staging ring's copies
//   leak                      a tracked block of owner decode/kv_cache never given back, the pool
//                             alive when the device is reset (the leak check's moment)
//   leak_at_end               the same block left out when the tracker and the pool end
#include <custody/debug/tracking_resource.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/pool/capture_scope.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/cuda_malloc.hpp>
#include <custody/staging/staging_ring.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "../support/cuda_pinned_host.hpp"
#include "../support/cuda_presence.hpp"
#include "../support/expect.hpp"

namespace {

using pool_type = custody::pool::stream_ordered_pool<custody::resource::cuda_malloc>;
using tracker_type = custody::debug::tracking_resource<pool_type>;

/// p[i] = i for i < n.
__global__ void fill(unsigned char* p, std::size_t n) {
    for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        p[i] = static_cast<unsigned char>(i);
    }
}
/// As fill, after spinning for about `cycles` clock cycles: the kernel is still running when the
/// host gives its block back.
__global__ void slow_fill(unsigned char* p, std::size_t n, long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
    for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        p[i] = static_cast<unsigned char>(i + 1);
    }
}

custody::pool::pool_options options(bool annotate) {
    custody::pool::pool_options o;
    o.annotate = annotate;
    return o;
}

int overflow(bool annotate) {
    pool_type pool(options(annotate), 0);
    custody::cuda::stream s(0);
    constexpr std::size_t n = 1024;
    auto* a = static_cast<unsigned char*>(pool.allocate(s, n, 256));
    auto* b = static_cast<unsigned char*>(pool.allocate(s, n, 256));
    const bool adjacent = a + n == b;
    std::printf("overflow: block %p, next block %p (%s); NVTX tool named: %s; annotated: %s\n", static_cast<void*>(a),
                static_cast<void*>(b), adjacent ? "adjacent" : "not adjacent",
                custody::detail::nvtx_memory::tool_named() ? "yes" : "no", annotate && custody::detail::nvtx_memory::tool_named() ? "yes" : "no");
    if (!adjacent) {
        pool.deallocate(s, b, n, 256);
        pool.deallocate(s, a, n, 256);
        return 3;
    }
    // The neighbour given back: its bytes are the pool's free memory now (cached for reuse on s), in
    // a chunk cudaMalloc still holds. Only the annotations make a write there an error.
    pool.deallocate(s, b, n, 256);
    fill<<<1, 256, 0, s.view().get()>>>(a, n + 1); // one byte too many, into no live block
    EXPECT(cudaGetLastError() == cudaSuccess);
    static_cast<void>(cudaStreamSynchronize(s.view().get())); // a sanitizer error may be reported here
    pool.deallocate(s, a, n, 256);
    return 0;
}

int clean() {
    pool_type pool(options(true), 0);
    custody::cuda::stream s(0);
    custody::cuda::stream t(0);
    constexpr std::size_t n = 1 << 20;
    // Stream order: given back while its kernel still runs, handed out again on the same stream.
    auto* a = static_cast<unsigned char*>(pool.allocate(s, n, 256));
    slow_fill<<<64, 256, 0, s.view().get()>>>(a, n, 200'000'000LL);
    pool.deallocate(s, a, n, 256);
    auto* again = static_cast<unsigned char*>(pool.allocate(s, n, 256));
    std::printf("clean: reused on its stream: %s\n", again == a ? "yes" : "no");
    fill<<<64, 256, 0, s.view().get()>>>(again, n);
    // Another stream takes it after waiting on s's event (follow_dependencies).
    pool.deallocate(s, again, n, 256);
    pool.trim(); // covers the block: it may now serve t
    auto* other = static_cast<unsigned char*>(pool.allocate(t, n, 256));
    fill<<<64, 256, 0, t.view().get()>>>(other, n);
    pool.deallocate(t, other, n, 256);

    // A graph whose temporary is given back during the capture and reused by the next allocation:
    // every replay writes both.
    {
        custody::pool::capture_scope scope(pool, s);
        auto* temp = static_cast<unsigned char*>(pool.allocate(s, n, 256));
        fill<<<64, 256, 0, s.view().get()>>>(temp, n);
        pool.deallocate(s, temp, n, 256);
        auto* kept = static_cast<unsigned char*>(pool.allocate(s, n, 256));
        fill<<<64, 256, 0, s.view().get()>>>(kept, n);
        custody::pool::captured_graph graph = scope.end();
        for (int i = 0; i < 3; ++i) graph.launch(s);
        EXPECT(cudaStreamSynchronize(s.view().get()) == cudaSuccess);
        pool.deallocate(s, kept, n, 256);
    }

    // The staging ring: uploads and a download through pinned memory.
    {
        custody::staging::ring_options o;
        o.capacity = 1 << 20;
        custody::staging::staging_ring<custody::test::cuda_pinned_host> ring(o);
        auto* device = static_cast<unsigned char*>(pool.allocate(s, 4096, 256));
        std::vector<unsigned char> host(4096, 3);
        ring.copy_to_device(std::span<const unsigned char>(host), device, s);
        auto ticket = ring.stage(device, 4096, s);
        EXPECT(ticket.wait()[0] == 3);
        ticket = {};
        ring.synchronize();
        pool.deallocate(s, device, 4096, 256);
    }
    EXPECT(cudaStreamSynchronize(s.view().get()) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(t.view().get()) == cudaSuccess);
    EXPECT(cudaGetLastError() == cudaSuccess);
    std::puts("clean: done");
    return 0;
}

custody::debug::tracking_options leaking() {
    custody::debug::tracking_options o;
    o.canaries = false;  // the region is then the block itself: 4096 bytes
    o.on_leak = custody::debug::policy::ignore;
    o.release_leaks = false;
    return o;
}

int leak() {
    // Never destroyed: the pool still holds the block when the device is reset.
    auto* tracker = new tracker_type(leaking(), custody::pool::pool_options{}, 0);
    custody::cuda::stream s(0);
    void* p = tracker->allocate(s, 4096, 256, "decode/kv_cache");
    fill<<<1, 256, 0, s.view().get()>>>(static_cast<unsigned char*>(p), 4096);
    EXPECT(cudaStreamSynchronize(s.view().get()) == cudaSuccess);
    std::printf("leak: %p of decode/kv_cache left out\n", p);
    EXPECT(cudaDeviceReset() == cudaSuccess);
    std::_Exit(0); // the tracker and the pool must not run after the reset
}

int leak_at_end() {
    {
        tracker_type tracker(leaking(), custody::pool::pool_options{}, 0);
        custody::cuda::stream s(0);
        void* p = tracker.allocate(s, 4096, 256, "decode/kv_cache");
        std::printf("leak_at_end: %p of decode/kv_cache left out\n", p);
    }
    EXPECT(cudaDeviceReset() == cudaSuccess);
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    if (const int status = custody_test::cuda_gate("sanitizer_cases"); status >= 0) return status;
    const char* which = argc > 1 ? argv[1] : "";
    const char* how = argc > 2 ? argv[2] : "";
    if (std::strcmp(which, "overflow") == 0) return overflow(std::strcmp(how, "plain") != 0);
    if (std::strcmp(which, "clean") == 0) return clean();
    if (std::strcmp(which, "leak") == 0) return leak();
    if (std::strcmp(which, "leak_at_end") == 0) return leak_at_end();
    std::fprintf(stderr, "usage: sanitizer_cases overflow annotated|plain | clean | leak | leak_at_end\n");
    return 2;
}
