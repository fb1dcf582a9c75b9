// The pool on the cuda platform: basic use, cross-stream reuse with a real event, and graph capture
// with capture-private memory (the cases of tests/support/pool_capture_cases.hpp). Exits 77
// (skipped) without a CUDA device.
#define CATCH_CONFIG_RUNNER
#include <custody/platform/cuda.hpp>
#include <custody/platform/cuda_vmm.hpp>
#include <custody/pool/capture_scope.hpp>
#include <custody/pool/stream_ordered_pool.hpp>

#include <custody/resource/cuda_async.hpp>
#include <custody/resource/cuda_malloc.hpp>
#include <custody/resource/virtual_memory.hpp>

#include "../support/catch.hpp"
#include "../support/cuda_presence.hpp"
#include "../support/pool_capture_cases.hpp"
#include "support.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
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

// ---- graph capture: the cases the host platform runs (tests/support/pool_capture_cases.hpp), with
//      real stream capture, graph launches and memset nodes ----

namespace {
pool_options capture_options() {
    pool_options o;
    o.memory_info = &platform::memory_info;
    o.device_headroom = 0;
    return o;
}
} // namespace

TEST_CASE("cuda: capture check every_call refuses an untold capture and quarantines its frees", "[pool][cuda][graph]") {
    pool_options o = capture_options();
    o.check_capture = custody::pool::capture_check::every_call;
    pool_type pool(o, 0);
    custody_test::case_every_call_check(pool);
}
TEST_CASE("cuda capture pool: replays keep private blocks intact and apart from ordinary ones", "[pool][cuda][graph]") {
    pool_type pool(capture_options(), 0);
    custody_test::case_capture_replay_cookies(pool);
}
TEST_CASE("cuda capture pool: two graphs share one private pool", "[pool][cuda][graph]") {
    pool_type pool(capture_options(), 0);
    custody_test::case_shared_pool(pool);
}
TEST_CASE("cuda capture pool: release is deferred while blocks are out, refused when nothing is held", "[pool][cuda][graph]") {
    pool_type pool(capture_options(), 0);
    custody_test::case_release_rules(pool);
}
TEST_CASE("cuda capture pool: a route abandoned by its release is ended, and trim collects its memory", "[pool][cuda][graph]") {
    pool_type pool(capture_options(), 0);
    custody_test::case_abandoned_route(pool);
}
TEST_CASE("cuda capture pool: ordinary allocations during a capture are unaffected and keep it valid", "[pool][cuda][graph]") {
    pool_type pool(capture_options(), 0);
    custody_test::case_ordinary_during_capture(pool);
}
TEST_CASE("cuda capture pool: forked streams share the capture's pool; unknown captures are refused", "[pool][cuda][graph]") {
    pool_type pool(capture_options(), 0);
    custody_test::case_forked_and_unknown_streams(pool);
}
TEST_CASE("cuda capture pool: the legacy stream, implicitly in a blocking stream's capture, is refused", "[pool][cuda][graph]") {
    pool_type pool(capture_options(), 0);
    custody::cuda::stream s(0);
    cudaStream_t blocking = nullptr;
    CUSTODY_CUDA_TRY(cudaStreamCreate(&blocking));
    custody::pool::capture_scope scope(pool, s); // a route is open: other streams are asked
    platform::begin_capture(blocking, custody::capture_mode::relaxed);
    CHECK_THROWS_AS(pool.allocate(custody::cuda::stream_view{}, 4096, 256), custody::pool::capture_error);
    void* p = pool.allocate(s, 4096, 256);
    CUSTODY_CUDA_TRY(cudaMemsetAsync(p, 1, 4096, blocking));
    static_cast<void>(platform::end_capture(blocking));
    custody::pool::captured_graph g = scope.end();
    pool.deallocate(s, p, 4096, 256);
    CUSTODY_CUDA_TRY(cudaStreamDestroy(blocking));
}

TEST_CASE("cuda: a block the synchronous pair takes behind another stream's event is idle when it returns",
          "[pool][cuda]") {
    pool_options o;
    o.growth_step = 1 << 20;
    o.maximum_size = 1 << 20;
    o.record_interval = 1; // covered at once: the synchronous pair takes it behind a's event
    pool_type pool(o, 0);
    custody::cuda::stream a(0);
    void* p = pool.allocate(a, 1 << 20, 256);
    auto gate = std::make_unique<stream_gate>(a.view().get());
    platform::memset_async(p, 0xAA, 1 << 20, a);
    pool.deallocate(a, p, 1 << 20, 256);
    auto taken = std::async(std::launch::async, [&] { return pool.allocate_sync(1 << 20, 256); });
    // usable at once by the host: it cannot return while a's work on the block is pending
    CHECK(taken.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
    gate->open();
    void* q = taken.get();
    CHECK(q == p);
    CHECK(cudaStreamQuery(a.view().get()) == cudaSuccess);
    gate.reset();
    pool.deallocate_sync(q, 1 << 20, 256);
}

TEST_CASE("cuda: the synchronous pair while a blocking stream captures is a capture_error, the free quarantined",
          "[pool][cuda][graph]") {
    custody_pool_test::failure_log log;
    pool_options o;
    o.check_capture = custody::pool::capture_check::every_call; // a capture the pool is not told of
    pool_type pool(o, 0);
    void* before_capture = pool.allocate_sync(4096, 256);
    cudaStream_t blocking = nullptr;
    REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess); // blocking: the legacy stream syncs with it
    REQUIRE(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK_THROWS_AS(pool.allocate_sync(4096, 256), custody::pool::capture_error);
    pool.deallocate_sync(before_capture, 4096, 256);
    cudaGraph_t graph = nullptr;
    static_cast<void>(cudaStreamEndCapture(blocking, &graph));
    if (graph != nullptr) cudaGraphDestroy(graph);
    static_cast<void>(cudaGetLastError());
    cudaStreamDestroy(blocking);
    CHECK(pool.detailed_statistics().quarantined_bytes == 4096);
    CHECK(log.lines().empty());
}

TEST_CASE("cuda: the synchronous pair runs on the pool's device with another device current", "[pool][cuda]") {
    if (custody::cuda::device_count() < 2) {
        WARN("needs two devices");
        return;
    }
    custody_pool_test::failure_log log;
    pool_options o;
    o.record_interval = 1; // each free records the default stream's event
    pool_type pool(o, 0);
    custody::cuda::device_guard elsewhere(1);
    void* p = pool.allocate_sync(4096, 256);
    pool.deallocate_sync(p, 4096, 256);
    void* q = pool.allocate_sync(4096, 256);
    CHECK(q == p);
    pool.deallocate_sync(q, 4096, 256);
    CHECK(custody::cuda::current_device() == 1);
    CHECK(log.lines().empty());
}

TEST_CASE("cuda: a stream that gets a destroyed stream's handle has a key of its own", "[pool][cuda][streams]") {
    cudaStream_t handle = nullptr;
    std::uintptr_t key = 0;
    {
        custody::cuda::stream a(0);
        handle = a.view().get();
        key = platform::stream_key(a);
    }
    std::vector<custody::cuda::stream> made;
    for (int i = 0; i < 64; ++i) {
        made.emplace_back(0);
        CHECK(platform::stream_key(made.back()) != key);
        if (made.back().view().get() == handle) break;
    }
    CHECK(platform::stream_key(cudaStreamPerThread) != platform::stream_key(custody::cuda::stream_view{}));
    std::uintptr_t other_thread_key = 0;
    std::thread([&] { other_thread_key = platform::stream_key(cudaStreamPerThread); }).join();
    CHECK(other_thread_key != platform::stream_key(cudaStreamPerThread)); // one per-thread stream per thread
}

TEST_CASE("cuda: a stream of another device is refused even with a destroyed stream's handle", "[pool][cuda][streams]") {
    if (custody::cuda::device_count() < 2) {
        WARN("needs two devices");
        return;
    }
    pool_type pool(pool_options{}, 0);
    cudaStream_t handle = nullptr;
    {
        custody::cuda::stream a(0);
        void* p = pool.allocate(a, 4096, 256);
        pool.deallocate(a, p, 4096, 256);
        platform::synchronize(a);
        handle = a.view().get();
    }
    std::vector<custody::cuda::stream> made;
    for (int i = 0; i < 64; ++i) {
        made.emplace_back(1);
        CHECK_THROWS_AS(pool.allocate(made.back(), 4096, 256), std::invalid_argument);
        if (made.back().view().get() == handle) break;
    }
}

TEST_CASE("cuda: trim gives the driver pool's memory back to the device", "[pool][cuda][trim]") {
    using async_pool = stream_ordered_pool<custody::resource::cuda_async>;
    constexpr std::size_t n = std::size_t{256} << 20;
    async_pool pool(pool_options{}, 0);
    custody::cuda::stream s(0);
    void* p = pool.allocate(s, n, 256);
    pool.deallocate(s, p, n, 256);
    const auto before = platform::memory_info(0);
    CHECK(pool.trim() >= n);
    CHECK(pool.upstream().retained_bytes() == 0);
    CHECK(pool.detailed_statistics().upstream_retained_bytes == 0);
    const auto after = platform::memory_info(0);
    REQUIRE(before.has_value());
    REQUIRE(after.has_value());
    CHECK(after->free >= before->free + n); // usable by cudaMalloc, NCCL, cuBLAS again
}

TEST_CASE("cuda: a capture on a blocking stream grows its private pool over cudaMallocAsync and stays valid",
          "[pool][cuda][graph]") {
    // The legacy default stream takes part implicitly in the capture of a blocking stream: memory
    // taken on it (cudaMallocFromPoolAsync(..., 0)) would invalidate the capture.
    using async_pool = stream_ordered_pool<custody::resource::cuda_async>;
    custody_pool_test::failure_log log;
    async_pool pool(pool_options{}, 0);
    cudaStream_t blocking = nullptr;
    REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
    const custody::pool::capture_pool_id id = pool.make_capture_pool_id();
    pool.begin_allocate_to_pool(id, platform::stream_view(blocking)); // before the capture, as PyTorch
    REQUIRE(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal) == cudaSuccess);
    void* p = pool.allocate(blocking, std::size_t{6} << 20, 256); // the private pool's first chunk
    REQUIRE(p != nullptr);
    CHECK(cudaMemsetAsync(p, 0x2b, std::size_t{6} << 20, blocking) == cudaSuccess);
    CHECK(platform::query_capture(blocking).status == custody::capture_status::active);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(blocking, &graph) == cudaSuccess); // fails if the capture was broken
    pool.end_allocate_to_pool(id);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, blocking) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(blocking) == cudaSuccess);
    unsigned char last = 0;
    REQUIRE(cudaMemcpy(&last, static_cast<unsigned char*>(p) + (std::size_t{6} << 20) - 1, 1, cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    CHECK(last == 0x2b);
    pool.deallocate(blocking, p, std::size_t{6} << 20, 256);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    pool.release_pool(id);
    cudaStreamDestroy(blocking);
    CHECK(log.lines().empty());
}

TEST_CASE("cuda: a chunk taken over cudaMallocAsync is ready before a non-blocking stream uses it",
          "[pool][cuda][growth]") {
    // The driver pool reuses memory freed on the legacy stream, behind work still queued there. A
    // chunk taken on the legacy stream and handed to a non-blocking stream unordered would be written
    // by that stream before the legacy stream's work (which writes 0x11 into it) ran.
    using async_pool = stream_ordered_pool<custody::resource::cuda_async>;
    constexpr std::size_t n = std::size_t{64} << 20;
    async_pool pool(pool_options{}, 0);
    cudaStream_t quiet = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&quiet, cudaStreamNonBlocking) == cudaSuccess);
    for (int round = 0; round < 8; ++round) {
        // Work on the legacy stream: a long memset elsewhere, then one into memory of the driver pool,
        // given back to it on the legacy stream behind that work.
        void* busy = nullptr;
        void* old = nullptr;
        REQUIRE(cudaMallocAsync(&busy, std::size_t{1} << 30, nullptr) == cudaSuccess);
        REQUIRE(cudaMallocAsync(&old, 2 * n, nullptr) == cudaSuccess);
        REQUIRE(cudaMemsetAsync(busy, 0, std::size_t{1} << 30, nullptr) == cudaSuccess);
        REQUIRE(cudaMemsetAsync(old, 0x11, 2 * n, nullptr) == cudaSuccess);
        REQUIRE(cudaFreeAsync(old, nullptr) == cudaSuccess);
        REQUIRE(cudaFreeAsync(busy, nullptr) == cudaSuccess);
        // The pool grows (its chunk may be `old`'s memory) and hands a block to the quiet stream.
        void* p = pool.allocate(platform::stream_view(quiet), n, 256);
        REQUIRE(cudaMemsetAsync(p, 0x5a, 4096, quiet) == cudaSuccess);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        unsigned char first = 0;
        REQUIRE(cudaMemcpy(&first, p, 1, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(first == 0x5a);
        pool.deallocate(platform::stream_view(quiet), p, n, 256);
        REQUIRE(cudaStreamSynchronize(quiet) == cudaSuccess);
        pool.trim(); // the next round grows again
    }
    cudaStreamDestroy(quiet);
}

TEST_CASE("cuda: a capture the pool was not told of never breaks another stream's allocation", "[pool][cuda][graph]") {
    pool_options o;
    o.checked = false;
    o.record_interval = 4;
    o.growth_step = 64 * 1024;
    o.maximum_size = 64 * 1024;
    pool_type pool(o, 0);
    custody::cuda::stream s(0);
    custody::cuda::stream t(0);
    std::vector<void*> blocks;
    for (int i = 0; i < 16; ++i) blocks.push_back(pool.allocate(s, 4096, 256));
    REQUIRE(cudaStreamBeginCapture(s.view().get(), cudaStreamCaptureModeRelaxed) == cudaSuccess);
    for (void* p : blocks) pool.deallocate(s, p, 4096, 256); // no event of the pool recorded in here
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(s.view().get(), &graph) == cudaSuccess);
    cudaGraphDestroy(graph);
    std::vector<void*> taken;
    for (int i = 0; i < 8; ++i) REQUIRE_NOTHROW(taken.push_back(pool.allocate(t, 4096, 256)));
    for (void* p : taken) pool.deallocate(t, p, 4096, 256);
    REQUIRE_NOTHROW(pool.trim());
}

namespace {
using vmm_memory = custody::resource::virtual_memory<custody::cuda::vmm>;
using vmm_pool = stream_ordered_pool<vmm_memory>;
} // namespace

TEST_CASE("cuda: the pool that maps serves captures from chunks apart from its range, and grows after them",
          "[pool][cuda][graph][mapped]") {
    if (!custody::cuda::vmm::supported(0)) return;
    {
        vmm_pool pool(pool_options{}, 0, std::size_t{16} << 30);
        custody_test::case_capture_replay_cookies(pool);
    }
    {
        vmm_pool pool(pool_options{}, 0, std::size_t{16} << 30);
        custody_test::case_ordinary_during_capture(pool);
    }
}

TEST_CASE("cuda: an exportable reservation maps in the granule of exportable memory", "[pool][cuda][mapped]") {
    if (!custody::cuda::vmm::exportable(0)) return;
    custody::resource::reservation_options r;
    r.exportable = true;
    vmm_pool pool(pool_options{}, 0, std::size_t{4} << 30, r);
    CHECK(pool.upstream().granularity() % custody::cuda::vmm::granularity(0, true) == 0);
    custody::cuda::stream s(0);
    void* p = pool.allocate(s, std::size_t{3} << 20, 256);
    REQUIRE(cudaMemsetAsync(p, 0x42, std::size_t{3} << 20, s.view().get()) == cudaSuccess);
    platform::synchronize(s);
    pool.deallocate(s, p, std::size_t{3} << 20, 256);
}

int main(int argc, char** argv) {
    if (const int status = custody_test::cuda_gate("test_pool_cuda"); status >= 0) return status;
    return Catch::Session().run(argc, argv);
}
