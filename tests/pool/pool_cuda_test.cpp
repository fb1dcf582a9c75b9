// The pool on the cuda platform: basic use, cross-stream reuse with a real event, and graph capture
// (refused with capture_error, nothing recorded). Exits 77 (skipped) without a CUDA device.
#define CATCH_CONFIG_RUNNER
#include <custody/platform/cuda.hpp>
#include <custody/pool/cuda_memory_info.hpp>
#include <custody/pool/stream_ordered_pool.hpp>

#include <custody/resource/cuda_malloc.hpp>

#include "../support/catch.hpp"
#include "../support/cuda_presence.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

using custody::cuda::platform;
using custody::pool::pool_options;
using custody::pool::stream_ordered_pool;
using pool_type = stream_ordered_pool<custody::resource::cuda_malloc>;

namespace {

/// Holds a stream at a host function until open() is called, so that work enqueued behind it is
/// certainly pending (a test that relies on a memset still running fails when the device is fast or
/// a tool slows the host).
class stream_gate {
public:
    explicit stream_gate(cudaStream_t s) : stream_(s) {
        CUSTODY_CUDA_TRY(cudaLaunchHostFunc(s, &stream_gate::hold, &open_));
    }
    ~stream_gate() { // the host function reads open_: it must have returned before open_ goes
        open();
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaStreamSynchronize(stream_));
    }
    stream_gate(const stream_gate&) = delete;
    stream_gate& operator=(const stream_gate&) = delete;
    void open() noexcept { open_.store(true, std::memory_order_release); }

private:
    static void hold(void* flag) {
        const auto* open = static_cast<const std::atomic<bool>*>(flag);
        while (!open->load(std::memory_order_acquire)) std::this_thread::yield();
    }
    cudaStream_t stream_;
    std::atomic<bool> open_{false};
};

} // namespace

static_assert(custody::stream_ordered_resource<pool_type>);
static_assert(custody::resource_with_statistics<pool_type>);

TEST_CASE("cuda: the pool serves device memory in stream order", "[pool][cuda]") {
    pool_type pool(pool_options{}, 0);
    custody::cuda::stream s(0);
    constexpr std::size_t n = 1 << 20;
    void* p = pool.allocate(s, n, 256);
    platform::memset_async(p, 0x5a, n, s);
    std::vector<unsigned char> host(n);
    platform::memcpy_async(host.data(), p, n, s);
    platform::synchronize(s);
    CHECK(host[0] == 0x5a);
    CHECK(host[n - 1] == 0x5a);
    pool.deallocate(s, p, n, 256);
    void* q = pool.allocate(s, n, 256);
    CHECK(q == p);
    pool.deallocate(s, q, n, 256);
    CHECK(pool.statistics().live_allocations == 0);
}

TEST_CASE("cuda: follow_dependencies makes the taking stream wait on the giver's event", "[pool][cuda]") {
    pool_options o;
    o.growth_step = 1 << 20;
    o.maximum_size = 1 << 20;
    o.record_interval = 1; // the free is covered at once: b takes it behind a's event, not via the reclaim
    pool_type pool(o, 0);
    custody::cuda::stream a(0);
    custody::cuda::stream b(0);
    void* p = pool.allocate(a, 1 << 20, 256);
    stream_gate gate(a.view().get()); // a's work, and so its event, stays pending until the gate opens
    platform::memset_async(p, 0xAA, 1 << 20, a);
    pool.deallocate(a, p, 1 << 20, 256);
    void* q = pool.allocate(b, 1 << 20, 256);
    CHECK(q == p);
    CHECK(pool.detailed_statistics().dependency_waits == 1);
    platform::memset_async(q, 0x55, 1 << 20, b); // ordered after a's 0xAA by the pool's event wait
    gate.open();
    unsigned char last = 0;
    platform::memcpy_async(&last, static_cast<unsigned char*>(q) + (1 << 20) - 1, 1, b);
    platform::synchronize(b);
    CHECK(last == 0x55);
    pool.deallocate(b, q, 1 << 20, 256);
}

TEST_CASE("cuda: an allocation during graph capture is refused and records nothing", "[pool][cuda][graph]") {
    pool_options o;
    o.memory_info = &custody::pool::cuda_memory_info;
    o.device_headroom = 0;
    pool_type pool(o, 0);
    custody::cuda::stream s(0);
    void* before_capture = pool.allocate(s, 4096, 256);
    const auto before = pool.detailed_statistics();
    REQUIRE(cudaStreamBeginCapture(s.view().get(), cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK_THROWS_AS(pool.allocate(s, 4096, 256), custody::pool::capture_error);
    // Given back during capture: quarantined, never reused.
    pool.deallocate(s, before_capture, 4096, 256);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(s.view().get(), &graph) == cudaSuccess);
    if (graph != nullptr) cudaGraphDestroy(graph);
    const auto after = pool.detailed_statistics();
    CHECK(after.totals.allocations == before.totals.allocations);
    CHECK(after.quarantined_bytes == before.quarantined_bytes + 4096);
    void* p = pool.allocate(s, 4096, 256);
    CHECK(p != before_capture);
    pool.deallocate(s, p, 4096, 256);
}

int main(int argc, char** argv) {
    if (const int status = custody_test::cuda_gate("test_pool_cuda"); status >= 0) return status;
    return Catch::Session().run(argc, argv);
}
