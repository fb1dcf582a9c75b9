// The tracking resource on the cuda platform, over plain cudaMallocAsync memory: canaries read back
// from device memory catch an overflow written by the device, poison reaches device memory, and
// the device and stream checks see real CUDA streams. Exits 77 (skipped) without a GPU.
#include <custody/debug/tracking_resource.hpp>
#include <custody/platform/cuda.hpp>

#include "../support/catch.hpp"

#include <cuda_runtime_api.h>

#include <vector>

namespace {

using P = custody::cuda::platform;

/// The smallest stream-ordered device upstream: cudaMallocAsync / cudaFreeAsync on device 0.
struct device_upstream {
    using stream_type = custody::cuda::stream_view;
    void* allocate(stream_type s, std::size_t n, std::size_t a) {
        custody::check_alignment(a);
        if (n == 0) return nullptr;
        void* p = nullptr;
        if (cudaMallocAsync(&p, n, s.get()) != cudaSuccess) {
            static_cast<void>(cudaGetLastError());
            throw custody::out_of_memory(n, a, 0, {}, "device_upstream");
        }
        return p;
    }
    void deallocate(stream_type s, void* p, std::size_t, std::size_t) noexcept {
        if (p != nullptr) CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaFreeAsync(p, s.get()));
    }
    void* allocate_sync(std::size_t n, std::size_t a) {
        void* p = allocate({}, n, a);
        CUSTODY_CUDA_TRY(cudaStreamSynchronize(nullptr));
        return p;
    }
    void deallocate_sync(void* p, std::size_t n, std::size_t a) noexcept {
        deallocate({}, p, n, a);
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaStreamSynchronize(nullptr));
    }
    int device() const noexcept { return 0; }
    friend bool operator==(const device_upstream&, const device_upstream&) noexcept { return true; }
};

using tracker = custody::debug::tracking_resource<device_upstream>;
static_assert(custody::try_allocatable_resource<tracker>);

custody::debug::tracking_options quiet() {
    custody::debug::tracking_options o;
    o.rank = custody::rank_info{};
    o.on_leak = custody::debug::policy::ignore;
    return o;
}

} // namespace

TEST_CASE("cuda: canaries read back from device memory catch a device-side overflow", "[debug][cuda]") {
    tracker t(quiet());
    custody::cuda::stream s(0);
    auto* p = static_cast<unsigned char*>(t.allocate(s, 1000, 256));
    CHECK(custody::is_aligned(p, 256));
    P::memset_async(p, 0, 1001, s); // one byte too many, written by the device
    t.deallocate(s, p, 1000, 256);
    try {
        t.check_guards();
        FAIL("the overflow was not caught");
    } catch (const custody::debug::tracking_error& e) {
        CHECK(e.kind() == custody::debug::violation_kind::buffer_overflow);
        CHECK(e.report().allocated.device == 0);
    }
}

TEST_CASE("cuda: a free on an unordered other stream is a hazard; ordering clears it", "[debug][cuda]") {
    tracker t(quiet());
    custody::cuda::stream a(0);
    custody::cuda::stream b(0);
    void* p = t.allocate(a, 4096, 256);
    CHECK_THROWS_AS(t.deallocate_checked(b, p, 4096, 256), custody::debug::tracking_error);
    t.order_before_free(p, b);
    t.deallocate_checked(b, p, 4096, 256);
    P::synchronize(b);
    CHECK(t.statistics().live_allocations == 0);
}
