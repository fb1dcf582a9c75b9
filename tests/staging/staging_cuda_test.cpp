// staging/staging_ring.hpp on the cuda platform: uploads and downloads through pinned memory,
// back-pressure against real copies, several devices. Exits 77 (skipped) without a device.
#include <custody/platform/cuda.hpp>
#include <custody/staging/staging_ring.hpp>

#include "../support/cuda_pinned_host.hpp"

#include "../support/catch.hpp"
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

namespace {

using custody::cuda::platform;
using ring = custody::staging::staging_ring<custody::test::cuda_pinned_host>;

custody::staging::ring_options opts(std::size_t capacity, std::size_t chunk = 0) {
    custody::staging::ring_options o;
    o.capacity = capacity;
    o.chunk_bytes = chunk;
    return o;
}

/// Device memory for a test, freed on its device.
template <class T>
struct device_array {
    T* ptr = nullptr;
    std::size_t count;
    int device;
    device_array(std::size_t n, int d) : count(n), device(d) {
        custody::cuda::device_guard g(d);
        CUSTODY_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T)));
        // cudaMemset runs on the legacy default stream, which custody's non-blocking streams do not
        // wait for: finish it before a test copies into the array on such a stream.
        CUSTODY_CUDA_TRY(cudaMemset(ptr, 0, n * sizeof(T)));
        CUSTODY_CUDA_TRY(cudaDeviceSynchronize());
    }
    ~device_array() {
        custody::cuda::device_guard g(device);
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFree(ptr));
    }
    device_array(const device_array&) = delete;
    device_array& operator=(const device_array&) = delete;
};

} // namespace

TEST_CASE("cuda: reserve, fill, commit and read back through tickets", "[staging][cuda]") {
    ring r(opts(1 << 20));
    custody::cuda::stream s(0);
    device_array<std::uint32_t> dev(4096, 0);
    auto res = r.reserve<std::uint32_t>(4096);
    std::iota(res.begin(), res.end(), 1U);
    r.commit(std::move(res), dev.ptr, s);
    auto t = r.stage(dev.ptr, 4096, s);
    const auto back = t.wait();
    REQUIRE(back.size() == 4096);
    CHECK(back[0] == 1);
    CHECK(back[4095] == 4096);
    t.release();
    CHECK_THROWS_AS(t.wait(), custody::staging::released_ticket_error);
}

TEST_CASE("cuda: transfers larger than the ring arrive intact", "[staging][cuda]") {
    ring r(opts(1 << 20, 256 << 10));
    custody::cuda::stream s(0);
    std::mt19937_64 rng(5);
    for (std::size_t n : {std::size_t{1}, std::size_t{4097}, std::size_t{3} << 20, (std::size_t{9} << 20) + 13}) {
        std::vector<std::byte> src(n);
        for (auto& b : src) b = static_cast<std::byte>(rng());
        device_array<std::byte> dev(n, 0);
        r.copy_to_device(std::span<const std::byte>(src), dev.ptr, s);
        std::vector<std::byte> back(n);
        r.copy_from_device(static_cast<const std::byte*>(dev.ptr), std::span<std::byte>(back), s);
        REQUIRE(back == src);
    }
    r.synchronize();
    CHECK(r.statistics().bytes_in_use == 0);
}

TEST_CASE("cuda: every device gets its copies on its own streams", "[staging][cuda]") {
    const int devices = platform::device_count();
    custody::staging::ring_options o = opts(4 << 20);
    for (int d = 0; d < devices; ++d) o.devices.push_back(d);
    ring r(o);
    for (int d = 0; d < devices; ++d) {
        custody::cuda::stream s(d);
        device_array<int> dev(1 << 16, d);
        std::vector<int> src(1 << 16);
        std::iota(src.begin(), src.end(), d * 1000);
        r.copy_to_device(std::span<const int>(src), dev.ptr, s);
        std::vector<int> back(src.size());
        r.copy_from_device(static_cast<const int*>(dev.ptr), std::span<int>(back), s);
        CHECK(back == src);
        CHECK(platform::current_device() == 0); // the caller's device is restored
    }
}

TEST_CASE("cuda: a full ring times out, then recovers", "[staging][cuda]") {
    ring r(opts(1 << 20));
    custody::cuda::stream s(0);
    auto held = r.reserve<std::byte>(1 << 20);
    CHECK_THROWS_AS(r.reserve<std::byte>(1, std::chrono::milliseconds(1)), custody::staging::timeout_error);
    held.reset();
    CHECK(r.try_reserve<std::byte>(1));
}
