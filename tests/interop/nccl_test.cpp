// interop/nccl_communicator.hpp and interop/nccl_memory.hpp. Compile-time checks always; the run-time
// part needs a device (exit 77 without one): a one-rank communicator, the device check over it, and
// ncclMemAlloc memory through custody's contract.
#include <custody/interop/cccl.hpp>
#include <custody/interop/nccl_communicator.hpp>
#include <custody/interop/nccl_memory.hpp>

#define CATCH_CONFIG_RUNNER
#include "../support/catch.hpp"
#include "../support/cuda_presence.hpp"

#include <cstdio>
#include <stdexcept>
#include <type_traits>

namespace nccl = custody::interop::nccl;
namespace mr = ::cuda::mr;

static_assert(std::is_move_constructible_v<nccl::communicator> && std::is_move_assignable_v<nccl::communicator>);
static_assert(!std::is_copy_constructible_v<nccl::communicator> && !std::is_copy_assignable_v<nccl::communicator>);
static_assert(custody::try_allocatable_resource<nccl::nccl_memory>); // usable as a pool's upstream
static_assert(mr::async_resource_with<custody::interop::cccl_resource<nccl::nccl_memory>, mr::device_accessible>);

TEST_CASE("ncclMemAlloc memory follows custody's contract", "[interop][nccl][gpu]") {
    nccl::nccl_memory memory(0);
    custody::cuda::stream stream(0);
    void* p = memory.allocate(stream.view(), 1 << 20, 256);
    REQUIRE(p != nullptr);
    CHECK(memory.statistics().live_bytes == (1 << 20));
    REQUIRE(cudaMemsetAsync(p, 1, 1 << 20, stream.view().get()) == cudaSuccess);
    memory.deallocate(stream.view(), p, 1 << 20, 256);
    CHECK(memory.statistics().live_bytes == 0);
    CHECK(memory.allocate_sync(0, 256) == nullptr);
    CHECK_THROWS_AS(memory.allocate_sync(64, 3), std::invalid_argument);
    CHECK_THROWS_AS(memory.allocate_sync(std::size_t{1} << 60, 256), custody::out_of_memory);
    CHECK(memory.statistics().allocations == 1);
}

TEST_CASE("a one-rank communicator binds its device and checks it", "[interop][nccl][gpu]") {
    const auto id = nccl::make_unique_id();
    const custody::rank_info me{0, 0, 1, 1, "caller"};
    nccl::communicator comm(id, me, 0);
    CHECK(comm.rank() == 0);
    CHECK(comm.size() == 1);
    const auto binding = nccl::bind_device(me, comm);
    CHECK(binding.device == 0);
    CHECK(binding.device_id.rfind("GPU-", 0) == 0);
    CHECK(custody::cuda::current_device() == 0);
    nccl::communicator moved = std::move(comm);
    CHECK(comm.get() == nullptr); // NOLINT(bugprone-use-after-move): checking the moved-from state
    CHECK(moved.get() != nullptr);
}

int main(int argc, char** argv) {
    Catch::Session session;
    if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
    if (const int status = custody_test::cuda_gate("test_interop_nccl (the static_asserts hold)"); status >= 0) {
        return status;
    }
    return session.run();
}
