// Capture-private memory with real kernels, compiled with nvcc: a decode-like step captured on one
// stream (kernels write per-block cookies that depend on a token read from device memory), replayed
// many times while ordinary allocations on another stream run their own kernels; every replay's
// cookies are checked on the host. Run it under compute-sanitizer too (docs/pool.md). Exits 77
// without a device.
#include <custody/platform/cuda.hpp>
#include <custody/pool/capture_scope.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/cuda_malloc.hpp>

#include <cstdio>
#include <cstdint>
#include <vector>

#include "../support/cuda_presence.hpp"
#include "../support/expect.hpp"

namespace {

/// out[i] = token * 1000003 + i + salt
__global__ void write_cookie(std::uint32_t* out, std::size_t n, const std::uint32_t* token, std::uint32_t salt) {
    for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        out[i] = *token * 1000003U + static_cast<std::uint32_t>(i) + salt;
    }
}
/// dst[i] = src[i] + 1
__global__ void add_one(std::uint32_t* dst, const std::uint32_t* src, std::size_t n) {
    for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        dst[i] = src[i] + 1;
    }
}

using pool_type = custody::pool::stream_ordered_pool<custody::resource::cuda_malloc>;
using platform = custody::cuda::platform;

bool check(const std::uint32_t* device, std::size_t n, std::uint32_t token, std::uint32_t salt, cudaStream_t s) {
    std::vector<std::uint32_t> host(n);
    CUSTODY_CUDA_TRY(cudaMemcpyAsync(host.data(), device, n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, s));
    CUSTODY_CUDA_TRY(cudaStreamSynchronize(s));
    for (std::size_t i = 0; i < n; ++i) {
        if (host[i] != token * 1000003U + static_cast<std::uint32_t>(i) + salt) return false;
    }
    return true;
}

int run() {
    pool_type pool(custody::pool::pool_options{}, 0);
    custody::cuda::stream s(0);
    custody::cuda::stream side(0);
    constexpr std::size_t n = 1 << 18; // 1 MiB of uint32
    auto* token = static_cast<std::uint32_t*>(pool.allocate(s, sizeof(std::uint32_t), 256)); // ordinary: the graph's input

    custody::pool::capture_scope scope(pool, s);
    auto* a = static_cast<std::uint32_t*>(pool.allocate(s, n * 4, 256));
    auto* scratch = static_cast<std::uint32_t*>(pool.allocate(s, n * 4, 256));
    write_cookie<<<64, 256, 0, s.view().get()>>>(scratch, n, token, 7);
    add_one<<<64, 256, 0, s.view().get()>>>(a, scratch, n); // a = cookie(7) + 1 = cookie(8)
    pool.deallocate(s, scratch, n * 4, 256);
    auto* b = static_cast<std::uint32_t*>(pool.allocate(s, n * 4, 256)); // reuses scratch: capture order
    EXPECT(b == scratch);
    write_cookie<<<64, 256, 0, s.view().get()>>>(b, n, token, 99);
    EXPECT(cudaGetLastError() == cudaSuccess);
    custody::pool::captured_graph graph = scope.end();

    for (std::uint32_t t = 1; t <= 100; ++t) {
        CUSTODY_CUDA_TRY(cudaMemcpyAsync(token, &t, sizeof t, cudaMemcpyHostToDevice, s.view().get()));
        auto* other = static_cast<std::uint32_t*>(pool.allocate(side, n * 4, 256)); // ordinary, another stream
        EXPECT(other + n <= a || a + n <= other);
        EXPECT(other + n <= b || b + n <= other);
        write_cookie<<<64, 256, 0, side.view().get()>>>(other, n, token, 5);
        graph.launch(s);
        EXPECT(check(a, n, t, 8, s.view().get()));
        EXPECT(check(b, n, t, 99, s.view().get()));
        CUSTODY_CUDA_TRY(cudaStreamSynchronize(side.view().get()));
        pool.deallocate(side, other, n * 4, 256);
    }
    pool.deallocate(s, a, n * 4, 256);
    pool.deallocate(s, b, n * 4, 256);
    graph.reset();
    EXPECT(pool.detailed_statistics().capture_reserved_bytes == 0);
    pool.deallocate(s, token, sizeof(std::uint32_t), 256);
    EXPECT(pool.statistics().live_allocations == 0);
    std::puts("capture_kernel_test: 100 replays with kernels kept their cookies; ordinary blocks stayed apart");
    return 0;
}

} // namespace

int main() {
    if (const int status = custody_test::cuda_gate("capture_kernel_test"); status >= 0) return status;
    return run();
}
