// platform/cuda.hpp and the cuda handles on a real device.
#include <custody/buffer/device_buffer.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/cuda_async.hpp>
#include <custody/resource/cuda_malloc.hpp>
#include <custody/resource/pinned_host.hpp>

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
