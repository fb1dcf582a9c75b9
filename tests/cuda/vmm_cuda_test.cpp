// platform/cuda_vmm.hpp, virtual_reservation and virtual_memory on a real device: memory that
// really goes back to the device, granules unmapped in any order, a fault at every driver step,
// exported granules imported as the same memory, and peer access.
#include <custody/platform/cuda.hpp>
#include <custody/platform/cuda_vmm.hpp>
#include <custody/resource/virtual_memory.hpp>
#include <custody/resource/virtual_reservation.hpp>

#include "../support/faulty_vmm.hpp"
#include "../support/vmm_checks.hpp"

#include "../support/catch.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <random>
#include <vector>

using custody::cuda::vmm;
using custody::resource::reservation_options;
using custody::resource::virtual_memory;
using custody::resource::virtual_reservation;

static_assert(custody::try_allocatable_resource<virtual_memory<vmm>>);
static_assert(custody::has_property<virtual_memory<vmm>, custody::device_accessible>);
static_assert(!custody::has_property<virtual_memory<vmm>, custody::host_accessible>);

namespace {

std::size_t free_device_memory(int device) {
    custody::cuda::device_guard guard(device);
    std::size_t free = 0;
    std::size_t total = 0;
    CUSTODY_CUDA_TRY(cudaMemGetInfo(&free, &total));
    return free;
}

/// Every byte of [p, p+n) on the device equals `value`.
bool device_holds(const void* p, std::size_t n, unsigned char value) {
    std::vector<unsigned char> host(n);
    CUSTODY_CUDA_TRY(cudaMemcpy(host.data(), p, n, cudaMemcpyDefault));
    return std::all_of(host.begin(), host.end(), [&](unsigned char c) { return c == value; });
}

} // namespace

TEST_CASE("cuda vmm: device 0 supports virtual memory, with a power-of-two granularity", "[cuda][vmm]") {
    REQUIRE(vmm::supported(0));
    const std::size_t g = vmm::granularity(0);
    CHECK(custody::is_pow2(g));
    CHECK(g >= 4096);
    CHECK_FALSE(vmm::supported(-1));
    CHECK_FALSE(vmm::supported(custody::cuda::device_count()));
}

TEST_CASE("cuda virtual_memory: blocks are device memory, and freeing one returns it to the device",
          "[cuda][vmm]") {
    virtual_memory<vmm> r(0, std::size_t{4} << 30);
    constexpr std::size_t block = std::size_t{512} << 20;
    const std::size_t before = free_device_memory(0);
    void* p = r.allocate_sync(block, 256);
    CHECK(r.mapped_bytes() == block);
    CHECK(free_device_memory(0) + block * 9 / 10 <= before); // the driver really handed it out
    CUSTODY_CUDA_TRY(cudaMemset(p, 0x3c, block));
    CHECK(device_holds(static_cast<unsigned char*>(p) + block - 4096, 4096, 0x3c));
    r.deallocate_sync(p, block, 256);
    CHECK(r.mapped_bytes() == 0);
    CHECK(free_device_memory(0) + (std::size_t{32} << 20) >= before); // and really took it back
}

TEST_CASE("cuda virtual_reservation: granules unmap in any order and the others keep their contents",
          "[cuda][vmm]") {
    virtual_reservation<vmm> range(0, std::size_t{1} << 30);
    const std::size_t g = range.granule();
    auto* base = static_cast<unsigned char*>(range.base());
    REQUIRE(range.map(0, 8 * g));
    for (std::size_t i = 0; i < 8; ++i) CUSTODY_CUDA_TRY(cudaMemset(base + i * g, static_cast<int>(i + 1), g));
    std::vector<std::size_t> order(8);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(3));
    for (std::size_t k = 0; k < 4; ++k) REQUIRE(range.unmap(order[k] * g, g));
    CHECK(range.mapped_bytes() == 4 * g);
    for (std::size_t k = 4; k < 8; ++k) {
        CHECK(device_holds(base + order[k] * g, g, static_cast<unsigned char>(order[k] + 1)));
    }
    REQUIRE(range.map(order[0] * g, g)); // a hole maps again
    CUSTODY_CUDA_TRY(cudaMemset(base + order[0] * g, 0x7f, g));
    CHECK(device_holds(base + order[0] * g, g, 0x7f));
}

TEST_CASE("cuda virtual_reservation: a map that fails at any driver step leaves nothing mapped",
          "[cuda][vmm][faults]") {
    using faulty = custody::test::basic_faulty_vmm<vmm>;
    custody::test::vmm_faults::reset();
    const custody::test::vmm_holding start = custody::test::vmm_held();
    {
        virtual_reservation<faulty> range(0, std::size_t{256} << 20);
        const std::size_t g = range.granule();
        REQUIRE(range.map(0, g));
        const std::size_t free_before = free_device_memory(0);
        custody::test::check_failed_maps_change_nothing(range, 4 * g, 4, [&](const virtual_reservation<faulty>&) {
            CHECK(free_device_memory(0) + (std::size_t{16} << 20) >= free_before); // nothing kept by the driver
        });
        CUSTODY_CUDA_TRY(cudaMemset(static_cast<unsigned char*>(range.base()) + 4 * g, 1, 4 * g));
        CUSTODY_CUDA_TRY(cudaDeviceSynchronize());
    }
    CHECK(custody::test::vmm_held() == start);
    custody::test::vmm_faults::reset();
}

TEST_CASE("cuda virtual_memory: an exported granule imports and maps as the same memory", "[cuda][vmm]") {
    if (!vmm::exportable(0)) {
        WARN("device 0 cannot export memory as a POSIX file descriptor: skipped");
        return;
    }
    void* import_fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    REQUIRE(cudaGetDriverEntryPointByVersion("cuMemImportFromShareableHandle", &import_fn, 12000, cudaEnableDefault,
                                             &found) == cudaSuccess);
    REQUIRE(found == cudaDriverEntryPointSuccess);
    auto import_handle = reinterpret_cast<PFN_cuMemImportFromShareableHandle_v10020>(import_fn);

    virtual_memory<vmm> r(0, std::size_t{1} << 30, reservation_options{.granule = 0, .exportable = true, .peers = {}});
    const std::size_t g = r.granularity();
    auto* p = static_cast<unsigned char*>(r.allocate_sync(2 * g, 256));
    CUSTODY_CUDA_TRY(cudaMemset(p, 0x21, 2 * g));
    const int fd = r.export_fd(p + g); // the second granule
    REQUIRE(fd >= 0);

    CUmemGenericAllocationHandle imported{};
    REQUIRE(import_handle(&imported, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS);
    ::close(fd);
    void* other = vmm::reserve(0, g, g);
    REQUIRE(other != nullptr);
    vmm::map(other, g, vmm::handle{imported, 0});
    const int self[] = {0};
    vmm::set_access(other, g, self);
    CHECK(device_holds(other, g, 0x21));
    CUSTODY_CUDA_TRY(cudaMemset(other, 0x43, 64)); // written through the import, seen through the block
    CHECK(device_holds(p + g, 64, 0x43));
    REQUIRE(vmm::unmap(0, other, g));
    vmm::release(vmm::handle{imported, 0});
    vmm::free_reservation(0, other, g);
    r.deallocate_sync(p, 2 * g, 256);
}

TEST_CASE("cuda virtual_memory: a peer given access writes the memory", "[cuda][vmm]") {
    int peer_ok = 0;
    if (custody::cuda::device_count() < 2 || cudaDeviceCanAccessPeer(&peer_ok, 1, 0) != cudaSuccess || !peer_ok) {
        WARN("no second device that can access device 0: skipped");
        return;
    }
    virtual_memory<vmm> r(0, std::size_t{1} << 30);
    const std::size_t g = r.granularity();
    auto* p = static_cast<unsigned char*>(r.allocate_sync(g, 256));
    r.grant_access(1); // for this block, and for blocks to come
    auto* q = static_cast<unsigned char*>(r.allocate_sync(g, 256));
    custody::cuda::stream on_peer(1);
    CUSTODY_CUDA_TRY(cudaMemsetAsync(p, 0x51, g, on_peer.view().get()));
    CUSTODY_CUDA_TRY(cudaMemsetAsync(q, 0x52, g, on_peer.view().get()));
    custody::cuda::platform::synchronize(on_peer);
    CHECK(device_holds(p, g, 0x51));
    CHECK(device_holds(q, g, 0x52));
    r.deallocate(on_peer, q, g, 256);
    r.deallocate_sync(p, g, 256);
}
