// sleepable_memory on cuda::vmm, on a real device: the cases shared with the host suite
// (sleep_cases.hpp), the device's free memory (cudaMemGetInfo) given back by a sleep and taken by
// the wake, a fault at every driver step of a wake and at every unmap of a sleep, and a peer's
// access after the wake. Exits 77 (skipped) without a device. Reads the device's free memory: run
// alone (meson runs it with is_parallel: false).
#include <custody/platform/cuda.hpp>
#include <custody/platform/cuda_vmm.hpp>
#include <custody/resource/pinned_host.hpp>
#include <custody/sleep/sleepable_memory.hpp>

#include "sleep_cases.hpp"

#include "../support/cuda_stream_gate.hpp"
#include "../support/failure_log.hpp"
#include "../support/faulty_vmm.hpp"
#include "../support/vmm_checks.hpp"

#include "../support/catch.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <system_error>
#include <vector>

using namespace custody_test::sleep_cases;
using custody::cuda::vmm;
using custody::sleep::sleep_options;
using cuda_memory = custody::sleep::sleepable_memory<vmm, custody::resource::pinned_host>;

static_assert(custody::stream_ordered_resource<cuda_memory>);
static_assert(custody::has_property<cuda_memory, custody::device_accessible>);
static_assert(!custody::has_property<cuda_memory, custody::host_accessible>);

namespace {

template <class F>
F driver_function(const char* symbol) {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found{};
    REQUIRE(cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found) == cudaSuccess);
    REQUIRE(found == cudaDriverEntryPointSuccess);
    return reinterpret_cast<F>(address);
}

/// The driver has physical memory mapped at `p` (cuMemRetainAllocationHandle finds one).
bool driver_maps(const void* p) {
    static const auto retain = driver_function<PFN_cuMemRetainAllocationHandle_v11000>("cuMemRetainAllocationHandle");
    static const auto release = driver_function<PFN_cuMemRelease_v10020>("cuMemRelease");
    CUmemGenericAllocationHandle h{};
    if (retain(&h, const_cast<void*>(p)) != CUDA_SUCCESS) return false;
    static_cast<void>(release(h));
    return true;
}

std::size_t free_device_memory() {
    std::size_t free = 0;
    std::size_t total = 0;
    CUSTODY_CUDA_TRY(cudaMemGetInfo(&free, &total));
    return free;
}

struct cuda_kit {
    using platform = custody::cuda::platform;
    using memory = cuda_memory;
    static std::unique_ptr<memory> make(sleep_options options) { return std::make_unique<memory>(0, std::move(options), 0); }
    static bool mapped(const void* p) { return driver_maps(p); }
};

} // namespace

TEST_CASE("cuda sleepable_memory: a round trip keeps offloaded bytes and zeroes discarded ones", "[cuda][sleep]") {
    case_round_trip<cuda_kit>();
}
TEST_CASE("cuda sleepable_memory: work still queued on a block's streams is waited for", "[cuda][sleep]") {
    case_waits_for_queued_work<cuda_kit>();
}
TEST_CASE("cuda sleepable_memory: the rules are typed errors that change nothing", "[cuda][sleep]") {
    case_rules<cuda_kit>();
}
TEST_CASE("cuda sleepable_memory: capture is refused on a block's stream and untouched elsewhere; graphs replay",
          "[cuda][sleep][capture]") {
    case_capture<cuda_kit>();
}

TEST_CASE("cuda sleepable_memory: the device's free memory shows a sleep and a wake", "[cuda][sleep]") {
    cuda_memory memory(0);
    custody::cuda::stream s(0);
    constexpr std::size_t n = std::size_t{256} << 20;
    void* kv = memory.allocate(s, n, 256, custody::debug::intern_owner("kv_cache"));
    void* weights = memory.allocate(s, n, 256, custody::debug::intern_owner("weights"));
    CUSTODY_CUDA_TRY(cudaMemsetAsync(kv, 0x11, n, s.view().get()));
    CUSTODY_CUDA_TRY(cudaMemsetAsync(weights, 0x22, n, s.view().get()));
    const std::size_t awake = free_device_memory();
    memory.sleep({{"kv_cache", discard}, {"weights", offload}});
    const std::size_t asleep = free_device_memory();
    CHECK(asleep >= awake + 2 * n - (std::size_t{32} << 20)); // both came back to the device
    memory.wake({"kv_cache", "weights"});
    CHECK(free_device_memory() + 2 * n - (std::size_t{32} << 20) <= asleep);
    CHECK(get<custody::cuda::platform>(weights, 4096) == bytes(4096, 0x22));
    CHECK(get<custody::cuda::platform>(static_cast<char*>(kv) + n - 4096, 4096) == bytes(4096, 0));
    memory.deallocate(s, kv, n, 256);
    memory.deallocate(s, weights, n, 256);
}

TEST_CASE("cuda sleepable_memory: a wake that fails at any driver step leaves the owner asleep, nothing mapped",
          "[cuda][sleep][faults]") {
    using faulty = custody::test::basic_faulty_vmm<vmm>;
    using custody::test::vmm_fault;
    using custody::test::vmm_faults;
    using custody::test::vmm_op;
    vmm_faults::reset();
    const auto start = custody::test::vmm_held();
    {
        custody::sleep::sleepable_memory<faulty, custody::resource::pinned_host> memory(0, sleep_options{}, 0);
        custody::cuda::stream s(0);
        const std::size_t g = memory.granularity();
        void* w = memory.allocate(s, 3 * g, 256, custody::debug::intern_owner("weights"));
        void* k = memory.allocate(s, g, 256, custody::debug::intern_owner("kv"));
        put<custody::cuda::platform>(w, cookie(1, 3 * g));
        put<custody::cuda::platform>(k, cookie(2, g));
        memory.sleep({{"weights", offload}, {"kv", discard}});
        const auto asleep = custody::test::vmm_held();
        const std::size_t free_asleep = free_device_memory();
        struct step {
            vmm_op op;
            int nth;
            vmm_fault how;
        };
        std::vector<step> steps;
        for (int n = 1; n <= 2; ++n) {
            steps.push_back({vmm_op::create, n, vmm_fault::exhausted});
            steps.push_back({vmm_op::create, n, vmm_fault::error});
            steps.push_back({vmm_op::map, n, vmm_fault::error});
        }
        steps.push_back({vmm_op::set_access, 1, vmm_fault::error});
        steps.push_back({vmm_op::set_access, 2, vmm_fault::error});
        for (const step& st : steps) {
            INFO("operation " << static_cast<int>(st.op) << ", call " << st.nth);
            vmm_faults::arm(st.op, st.nth, st.how);
            if (st.how == vmm_fault::exhausted) {
                CHECK_THROWS_AS(memory.wake({"weights", "kv"}), custody::out_of_memory);
            } else {
                CHECK_THROWS_AS(memory.wake({"weights", "kv"}), std::system_error);
            }
            vmm_faults::reset();
            CHECK(memory.is_asleep("weights"));
            CHECK(memory.is_asleep("kv"));
            CHECK(custody::test::vmm_held() == asleep);
            CHECK(free_device_memory() + (std::size_t{16} << 20) >= free_asleep);
            CHECK_FALSE(driver_maps(w));
        }
        // An unmap that fails in a sleep: that granule stays mapped, and the wake restores all.
        memory.wake({"weights", "kv"});
        custody::test::failure_log log;
        vmm_faults::arm(vmm_op::unmap, 2);
        memory.sleep({{"weights", offload}, {"kv", discard}});
        vmm_faults::reset();
        CHECK(log.lines().size() == 1);
        // The second unmap: the offloaded block's (a sleep unmaps the discarded blocks first).
        CHECK(memory.detailed_statistics().stuck_bytes == 3 * g);
        memory.wake({"weights", "kv"});
        CHECK(get<custody::cuda::platform>(w, 3 * g) == cookie(1, 3 * g));
        CHECK(get<custody::cuda::platform>(k, g) == bytes(g, 0));
        memory.deallocate(s, w, 3 * g, 256);
        memory.deallocate(s, k, g, 256);
    }
    CHECK(custody::test::vmm_held() == start);
    vmm_faults::reset();
}

TEST_CASE("cuda sleepable_memory: a peer keeps its access across a sleep and a wake", "[cuda][sleep][peers]") {
    int peer_ok = 0;
    if (custody::cuda::device_count() < 2 || cudaDeviceCanAccessPeer(&peer_ok, 1, 0) != cudaSuccess || !peer_ok) {
        WARN("no second device that can access device 0: skipped");
        return;
    }
    static const auto get_access = driver_function<PFN_cuMemGetAccess_v10020>("cuMemGetAccess");
    cuda_memory memory(0, sleep_options{.granule = 0, .peers = {1}}, 0);
    custody::cuda::stream s(0);
    void* p = memory.allocate(s, memory.granularity(), 256, custody::debug::intern_owner("weights"));
    memory.sleep({"weights"}, discard);
    memory.wake({"weights"});
    CUmemLocation peer{};
    peer.type = CU_MEM_LOCATION_TYPE_DEVICE;
    peer.id = 1;
    unsigned long long flags = 0;
    REQUIRE(get_access(&flags, &peer, reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS);
    CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    custody::cuda::stream on_peer(1);
    CUSTODY_CUDA_TRY(cudaMemsetAsync(p, 0x51, memory.granularity(), on_peer.view().get()));
    custody::cuda::platform::synchronize(on_peer);
    CHECK(get<custody::cuda::platform>(p, 4096) == bytes(4096, 0x51));
    memory.deallocate(on_peer, p, memory.granularity(), 256);
}
