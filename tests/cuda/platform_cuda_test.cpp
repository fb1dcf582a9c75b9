// platform/cuda.hpp and the cuda handles on a real device.
#include <custody/buffer/device_buffer.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/cuda_async.hpp>
#include <custody/resource/cuda_malloc.hpp>
#include <custody/resource/pinned_host.hpp>

#include "../support/cuda_capture_ops.hpp"
#include "../support/cuda_stream_gate.hpp"

#include "../support/catch.hpp"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <stdexcept>
#include <utility>
#include <vector>

using custody::cuda::platform;

TEST_CASE("cuda events complete after the recorded work", "[cuda][platform]") {
    custody::cuda::stream s(0);
    custody::cuda::event e(0);
    {
        custody::test::stream_gate<platform> gate(s);
        e.record(s);
        CHECK_FALSE(e.ready());
        gate.open();
        e.synchronize();
    }
    CHECK(e.ready());
    CHECK(platform::stream_device(s) == 0);
    CHECK_FALSE(platform::is_capturing(s));
}

TEST_CASE("a cuda error carries the call and the error's name", "[cuda][platform]") {
    try {
        platform::set_device(10000);
        FAIL("cudaSetDevice(10000) succeeded");
    } catch (const custody::cuda_error& e) {
        CHECK(e.error_name() == "cudaErrorInvalidDevice");
        CHECK(e.call().find("cudaSetDevice") != std::string::npos);
    }
    CHECK(platform::current_device() == 0);
}

TEST_CASE("device_buffer round-trips data and frees on its stream", "[cuda][buffer]") {
    custody::resource::cuda_async device_memory(0);
    custody::resource::pinned_host pinned(0);
    custody::cuda::stream s(0);
    custody::pinned_buffer<int> host_in(1 << 16, s, pinned);
    custody::pinned_buffer<int> host_out(1 << 16, s, pinned);
    std::iota(host_in.span().begin(), host_in.span().end(), 0);
    {
        custody::device_buffer<int> d(1 << 16, s, device_memory);
        CHECK(d.device() == 0);
        platform::memcpy_async(d.data(), host_in.data(), d.size_bytes(), s);
        d.resize(1 << 17);
        platform::memcpy_async(host_out.data(), d.data(), host_out.size_bytes(), s);
        platform::synchronize(s);
    }
    for (std::size_t i = 0; i < host_out.size(); i += 997) CHECK(host_out[i] == static_cast<int>(i));
    CHECK(device_memory.statistics().live_bytes == 0);
}

TEST_CASE("device_scalar reads back what was set", "[cuda][buffer]") {
    custody::resource::cuda_malloc r(0);
    custody::cuda::stream s(0);
    custody::device_scalar<long> x(s, r);
    x.set_value(-77);
    CHECK(x.value() == -77);
}

TEST_CASE("pinned_host keeps its alignment promise up to a page, whatever cudaHostAlloc returns", "[cuda][resource]") {
    custody::resource::pinned_host memory(0);
    custody::cuda::stream s(0);
    std::vector<std::pair<void*, std::pair<std::size_t, std::size_t>>> blocks;
    for (const std::size_t alignment : {std::size_t{256}, std::size_t{512}, std::size_t{2048}, std::size_t{4096}}) {
        for (const std::size_t bytes : {std::size_t{1}, std::size_t{300}, std::size_t{4096}, std::size_t{1} << 20}) {
            auto* p = static_cast<unsigned char*>(memory.allocate(s, bytes, alignment));
            REQUIRE(p != nullptr);
            CHECK(custody::is_aligned(p, alignment));
            std::fill(p, p + bytes, static_cast<unsigned char>(0x5A)); // host-writable, all of it
            blocks.push_back({p, {bytes, alignment}});
        }
    }
    std::size_t live = 0;
    for (const auto& b : blocks) live += b.second.first;
    CHECK(memory.statistics().live_bytes == live); // the caller's bytes, not the over-allocation
    for (const auto& [p, size] : blocks) memory.deallocate(s, p, size.first, size.second);
    CHECK(memory.statistics().live_bytes == 0);
    CHECK_THROWS_AS(memory.allocate_sync(64, 8192), std::invalid_argument);
}

// ---- graph capture: the rules the host platform mirrors (tests/support/capture_cases.hpp) ----

TEST_CASE("cuda capture records work and replays it at each launch", "[cuda][platform][capture]") {
    custody_test::case_capture_records_and_replays<platform>();
}
TEST_CASE("cuda capture: query_capture tells status and id", "[cuda][platform][capture]") {
    custody_test::case_query_capture<platform>();
}
TEST_CASE("cuda capture: synchronizing a capturing stream invalidates the capture", "[cuda][platform][capture]") {
    custody_test::case_synchronize_invalidates<platform>();
}
TEST_CASE("cuda capture: an event recorded in a capture cannot be queried", "[cuda][platform][capture]") {
    custody_test::case_captured_event<platform>();
}
TEST_CASE("cuda capture: a capturing stream cannot wait on an outside event", "[cuda][platform][capture]") {
    custody_test::case_isolation<platform>();
}
TEST_CASE("cuda capture: fork and join across streams", "[cuda][platform][capture]") {
    custody_test::case_fork_and_join<platform>();
}
TEST_CASE("cuda capture: an unjoined fork fails the end", "[cuda][platform][capture]") {
    custody_test::case_unjoined_fork<platform>();
}
TEST_CASE("cuda capture: ending where no capture began is refused", "[cuda][platform][capture]") {
    custody_test::case_end_where_not_begun<platform>();
}
TEST_CASE("cuda capture: the modes decide who may make unsafe calls", "[cuda][platform][capture]") {
    custody_test::case_capture_modes<platform>();
}
TEST_CASE("cuda capture: a capture not relaxed ends on its own thread", "[cuda][platform][capture]") {
    custody_test::case_end_from_another_thread<platform>();
}

TEST_CASE("cuda capture: the legacy stream reports a blocking stream's capture as its own", "[cuda][platform][capture]") {
    cudaStream_t blocking = nullptr;
    CUSTODY_CUDA_TRY(cudaStreamCreate(&blocking)); // synchronizes with the legacy stream
    void* p = nullptr;
    CUSTODY_CUDA_TRY(cudaMalloc(&p, 256));
    platform::begin_capture(blocking, custody::capture_mode::relaxed);
    CUSTODY_CUDA_TRY(cudaMemsetAsync(p, 1, 256, blocking));
    const custody::capture_info legacy = platform::query_capture(custody::cuda::stream_view{});
    CHECK(legacy.status == custody::capture_status::active); // cudaErrorStreamCaptureImplicit
    CHECK(legacy.id == 0);
    CHECK(platform::is_capturing(custody::cuda::stream_view{}));
    CHECK(cudaGetLastError() == cudaSuccess); // the implicit answer leaves no error behind
    const custody::cuda::graph g = platform::end_capture(blocking);
    CHECK(g.node_count() == 1);
    CHECK_FALSE(platform::is_capturing(custody::cuda::stream_view{}));
    CUSTODY_CUDA_TRY(cudaStreamDestroy(blocking));
    CUSTODY_CUDA_TRY(cudaFree(p));
}

TEST_CASE("cuda capture: cudaMalloc is unsafe in a capture unless the thread is relaxed", "[cuda][platform][capture]") {
    custody::cuda::stream s(0);
    custody_test::capture_ops<platform>::memory m(256);
    void* p = nullptr;
    platform::begin_capture(s, custody::capture_mode::global);
    platform::memset_async(m.device(), 1, m.size(), s);
    CHECK(cudaMalloc(&p, 4096) == cudaErrorStreamCaptureUnsupported);
    static_cast<void>(cudaGetLastError());
    CHECK(platform::query_capture(s).status == custody::capture_status::invalidated);
    CHECK_THROWS_AS(platform::end_capture(s), custody::cuda_error);

    platform::begin_capture(s, custody::capture_mode::global);
    platform::memset_async(m.device(), 1, m.size(), s);
    {
        custody::cuda::capture_mode_guard relaxed(custody::capture_mode::relaxed);
        REQUIRE(cudaMalloc(&p, 4096) == cudaSuccess);
    }
    CHECK(platform::exchange_capture_mode(custody::capture_mode::global) == custody::capture_mode::global);
    CHECK(platform::query_capture(s).status == custody::capture_status::active);
    CHECK(platform::end_capture(s).node_count() == 1);
    CUSTODY_CUDA_TRY(cudaFree(p));
}
