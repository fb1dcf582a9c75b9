// interop/cccl.hpp: custody resources through CCCL's cuda::mr concepts. The static_asserts are the
// proof that the signatures and properties line up; the run-time part needs a device (exit 77
// without one).
#include <custody/interop/cccl.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/virtual_device_memory.hpp>

#include "cuda_test_resources.hpp"

#include <cuda_runtime_api.h>

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <new>

namespace {

using custody::test::test_device_memory;
using custody::test::test_managed_memory;
using custody::interop::cccl_resource;
namespace mr = ::cuda::mr;

// The compile-time proof: signatures, argument order and properties as CCCL expects them.
static_assert(mr::async_resource_with<cccl_resource<test_device_memory>, mr::device_accessible>);
static_assert(!mr::resource_with<cccl_resource<test_device_memory>, mr::host_accessible>);
static_assert(mr::async_resource_with<cccl_resource<test_managed_memory>, mr::device_accessible, mr::host_accessible>);
// A host-platform resource has no CUDA streams: a synchronous CCCL resource, host accessible only.
static_assert(mr::resource_with<cccl_resource<custody::resource::host_memory>, mr::host_accessible>);
static_assert(!mr::async_resource<cccl_resource<custody::resource::host_memory>>);
static_assert(!mr::resource_with<cccl_resource<custody::resource::host_memory>, mr::device_accessible>);
// Every host-platform resource: a virtual device's memory keeps its device_accessible property, and
// an adaptor (fault injection) forwards its upstream's.
static_assert(mr::resource_with<cccl_resource<custody::resource::virtual_device_memory>, mr::device_accessible>);
static_assert(mr::resource_with<cccl_resource<custody::resource::fault_injecting<custody::resource::host_memory>>,
                                mr::host_accessible>);

/// Code written against CCCL only: knows nothing of custody.
void* cccl_allocate(mr::async_resource_ref<mr::device_accessible> ref, std::size_t bytes, ::cuda::stream_ref s) {
    return ref.allocate_async(bytes, 256, s);
}
void cccl_deallocate(mr::async_resource_ref<mr::device_accessible> ref, void* p, std::size_t bytes,
                     ::cuda::stream_ref s) {
    ref.deallocate_async(p, bytes, 256, s);
}

} // namespace

TEST_CASE("a host resource works through cuda::mr::resource_ref without a device", "[interop][cccl]") {
    custody::resource::host_memory memory;
    cccl_resource adaptor(memory);
    mr::resource_ref<mr::host_accessible> ref(adaptor);
    void* p = ref.allocate(1000, 64);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    CHECK(memory.statistics().live_bytes == 1000);
    ref.deallocate(p, 1000, 64);
    CHECK(memory.statistics().live_bytes == 0);
    CHECK_THROWS_AS(ref.allocate(10, 3), std::invalid_argument);
    CHECK(memory.statistics().allocations == 1);
}

TEST_CASE("a cuda resource is used through cuda::mr::async_resource_ref", "[interop][cccl][gpu]") {
    test_device_memory memory(0);
    cccl_resource adaptor(memory);
    custody::cuda::stream stream(0);
    void* p = cccl_allocate(adaptor, 1 << 20, ::cuda::stream_ref(stream.view().get()));
    REQUIRE(p != nullptr);
    CHECK(memory.statistics().live_bytes == (1 << 20));
    REQUIRE(cudaMemsetAsync(p, 0, 1 << 20, stream.view().get()) == cudaSuccess);
    cccl_deallocate(adaptor, p, 1 << 20, ::cuda::stream_ref(stream.view().get()));
    custody::cuda::platform::synchronize(stream.view());
    CHECK(memory.statistics().live_bytes == 0);
    // Equality follows custody's: interchangeable resources on one device compare equal.
    test_device_memory other(0);
    CHECK(cccl_resource(other) == adaptor);
    // Exhaustion arrives as std::bad_alloc through the CCCL reference.
    mr::async_resource_ref<mr::device_accessible> ref(adaptor);
    CHECK_THROWS_AS(ref.allocate_async(std::size_t{1} << 60, 256, ::cuda::stream_ref(stream.view().get())),
                    std::bad_alloc);
    CHECK(memory.statistics().live_bytes == 0);
}

int main(int argc, char** argv) {
    Catch::Session session;
    if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
    const bool have_device = custody::cuda::device_count() > 0;
    if (!have_device) session.configData().testsOrTags.emplace_back("~[gpu]");
    session.useConfigData(session.configData());
    const int failed = session.run();
    if (failed != 0) return failed;
    if (!have_device) {
        std::puts("no CUDA device: the GPU cases were skipped (the static_asserts hold)");
        return 77;
    }
    return 0;
}
