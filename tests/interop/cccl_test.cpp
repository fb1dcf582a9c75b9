// interop/cccl.hpp: custody resources through CCCL's cuda::mr concepts. The static_asserts are the
// proof that the signatures and properties line up, in the spelling of the CCCL the test is
// compiled with (meson test interop-cccl-versions compiles this file against CCCL 3.1 and 3.2 too);
// the run-time part needs a device (exit 77 without one).
#include <custody/interop/cccl.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/cuda_async.hpp>
#include <custody/resource/cuda_malloc.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/managed.hpp>
#include <custody/resource/pinned_host.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include <cuda_runtime_api.h>

#include "../support/catch.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <new>

namespace {

using custody::resource::cuda_async;
using custody::resource::cuda_malloc;
using custody::resource::managed;
using custody::resource::pinned_host;
using custody::interop::cccl_resource;
namespace mr = ::cuda::mr;

using custody::interop::cccl_stream_ordered_with;
using custody::interop::cccl_synchronous_with;

// The compile-time proof: signatures, argument order and properties as the CCCL in use expects
// them (3.0 or 3.1+ spelling, see interop/cccl.hpp). Device memory: device accessible only.
static_assert(cccl_stream_ordered_with<cccl_resource<cuda_async>, mr::device_accessible>);
static_assert(!cccl_synchronous_with<cccl_resource<cuda_async>, mr::host_accessible>);
static_assert(cccl_stream_ordered_with<cccl_resource<cuda_malloc>, mr::device_accessible>);
static_assert(!cccl_synchronous_with<cccl_resource<cuda_malloc>, mr::host_accessible>);
// Pinned and managed memory: both sides.
static_assert(cccl_stream_ordered_with<cccl_resource<pinned_host>, mr::device_accessible, mr::host_accessible>);
static_assert(cccl_stream_ordered_with<cccl_resource<managed>, mr::device_accessible, mr::host_accessible>);
// A custody pool over device memory is handed to CCCL code the same way.
static_assert(cccl_stream_ordered_with<cccl_resource<custody::pool::stream_ordered_pool<cuda_async>>,
                                       mr::device_accessible>);
// A host-platform resource has no CUDA streams: a synchronous CCCL resource, host accessible only.
static_assert(cccl_synchronous_with<cccl_resource<custody::resource::host_memory>, mr::host_accessible>);
static_assert(!cccl_stream_ordered_with<cccl_resource<custody::resource::host_memory>>);
static_assert(!cccl_synchronous_with<cccl_resource<custody::resource::host_memory>, mr::device_accessible>);
// Every host-platform resource: a virtual device's memory keeps its device_accessible property, and
// an adaptor (fault injection) forwards its upstream's.
static_assert(cccl_synchronous_with<cccl_resource<custody::host::simulated_device_memory>, mr::device_accessible>);
static_assert(cccl_synchronous_with<cccl_resource<custody::resource::fault_injecting<custody::resource::host_memory>>,
                                    mr::host_accessible>);
// The spelling really is the one CCCL_VERSION names.
#if CUSTODY_CCCL_STREAM_FIRST
static_assert(CCCL_VERSION >= 3001000);
static_assert(mr::synchronous_resource<cccl_resource<custody::resource::host_memory>>);
#else
static_assert(CCCL_VERSION < 3001000);
static_assert(mr::resource<cccl_resource<custody::resource::host_memory>>);
#endif

/// Code written against CCCL only: knows nothing of custody. The references and calls are spelled
/// as the CCCL in use spells them.
#if CUSTODY_CCCL_STREAM_FIRST
using device_ref = mr::resource_ref<mr::device_accessible>;
using host_ref = mr::synchronous_resource_ref<mr::host_accessible>;
void* cccl_allocate(device_ref ref, std::size_t bytes, ::cuda::stream_ref s) { return ref.allocate(s, bytes, 256); }
void cccl_deallocate(device_ref ref, void* p, std::size_t bytes, ::cuda::stream_ref s) {
    ref.deallocate(s, p, bytes, 256);
}
void* cccl_allocate_sync(host_ref ref, std::size_t bytes, std::size_t alignment) {
    return ref.allocate_sync(bytes, alignment);
}
void cccl_deallocate_sync(host_ref ref, void* p, std::size_t bytes, std::size_t alignment) {
    ref.deallocate_sync(p, bytes, alignment);
}
#else
using device_ref = mr::async_resource_ref<mr::device_accessible>;
using host_ref = mr::resource_ref<mr::host_accessible>;
void* cccl_allocate(device_ref ref, std::size_t bytes, ::cuda::stream_ref s) { return ref.allocate_async(bytes, 256, s); }
void cccl_deallocate(device_ref ref, void* p, std::size_t bytes, ::cuda::stream_ref s) {
    ref.deallocate_async(p, bytes, 256, s);
}
void* cccl_allocate_sync(host_ref ref, std::size_t bytes, std::size_t alignment) {
    return ref.allocate(bytes, alignment);
}
void cccl_deallocate_sync(host_ref ref, void* p, std::size_t bytes, std::size_t alignment) {
    ref.deallocate(p, bytes, alignment);
}
#endif

} // namespace

TEST_CASE("a host resource works through a synchronous cuda::mr reference without a device", "[interop][cccl][no_gpu_too]") {
    custody::resource::host_memory memory;
    cccl_resource adaptor(memory);
    host_ref ref(adaptor);
    void* p = cccl_allocate_sync(ref, 1000, 64);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    CHECK(memory.statistics().live_bytes == 1000);
    cccl_deallocate_sync(ref, p, 1000, 64);
    CHECK(memory.statistics().live_bytes == 0);
    CHECK_THROWS_AS(cccl_allocate_sync(ref, 10, 3), std::invalid_argument);
    CHECK(memory.statistics().allocations == 1);
}

TEST_CASE("a cuda resource is used through a stream-ordered cuda::mr reference", "[interop][cccl][gpu]") {
    cuda_async memory(0);
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
    cuda_async other(0);
    CHECK(cccl_resource(other) == adaptor);
    // Exhaustion arrives as std::bad_alloc through the CCCL reference.
    CHECK_THROWS_AS(cccl_allocate(adaptor, std::size_t{1} << 60, ::cuda::stream_ref(stream.view().get())),
                    std::bad_alloc);
    CHECK(memory.statistics().live_bytes == 0);
}

TEST_CASE("a custody pool is used through a stream-ordered cuda::mr reference", "[interop][cccl][gpu]") {
    custody::pool::stream_ordered_pool<cuda_async> pool(custody::pool::pool_options{}, 0);
    cccl_resource adaptor(pool);
    custody::cuda::stream stream(0);
    const ::cuda::stream_ref s(stream.view().get());
    void* p = cccl_allocate(adaptor, 1 << 20, s);
    REQUIRE(p != nullptr);
    CHECK(pool.statistics().live_bytes == (1 << 20));
    const auto reserved = pool.statistics().reserved_bytes;
    cccl_deallocate(adaptor, p, 1 << 20, s);
    void* q = cccl_allocate(adaptor, 1 << 20, s); // served from what the pool already holds
    REQUIRE(q != nullptr);
    CHECK(pool.statistics().reserved_bytes == reserved);
    cccl_deallocate(adaptor, q, 1 << 20, s);
    custody::cuda::platform::synchronize(stream.view());
    CHECK(pool.statistics().live_bytes == 0);
}
