// interop/thrust.hpp on the host path: Thrust's device containers with the CPP device system, over
// custody's host-platform resources. (The CUDA path is compiled with nvcc by thrust_cuda_test.cu.)
#include <custody/interop/thrust.hpp>
#include <custody/platform/host.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include <thrust/device_vector.h>
#include <thrust/reduce.h>
#include <thrust/execution_policy.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include "../support/catch.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>
#include <new>

static_assert(THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP, "this test runs Thrust's host path");

using custody::interop::thrust_allocator;
using custody::resource::host_memory;
using custody::host::simulated_device_memory;

TEST_CASE("thrust::device_vector allocates through a custody resource", "[interop][thrust]") {
    host_memory memory;
    {
        using alloc = thrust_allocator<int, host_memory>;
        thrust::device_vector<int, alloc> v(1000, 1, alloc(memory));
        CHECK(thrust::reduce(v.begin(), v.end()) == 1000);
        CHECK(memory.statistics().live_bytes == 1000 * sizeof(int));
        CHECK(reinterpret_cast<std::uintptr_t>(thrust::raw_pointer_cast(v.data())) % alloc::alignment == 0);
        v.resize(5000);
        thrust::sequence(v.begin(), v.end());
        CHECK(thrust::reduce(v.begin(), v.end(), std::int64_t{0}) == std::int64_t{4999} * 5000 / 2);
        CHECK(memory.statistics().live_bytes == 5000 * sizeof(int));
        CHECK(memory.statistics().allocations == 2);
    }
    CHECK(memory.statistics().live_bytes == 0);
    CHECK(memory.statistics().deallocations == 2);
}

TEST_CASE("thrust_allocator orders frees on its stream", "[interop][thrust]") {
    simulated_device_memory memory(3, 1 << 20);
    custody::host::stream stream(3);
    {
        using alloc = thrust_allocator<double, simulated_device_memory>;
        thrust::device_vector<double, alloc> v(100, 2.0, alloc(memory, stream.view()));
        CHECK(thrust::reduce(v.begin(), v.end()) == 200.0);
        CHECK(memory.device_seen_by_last_allocation() == 3);
    }
    custody::host::platform::synchronize(stream.view());
    CHECK(memory.used() == 0);
    CHECK(memory.statistics().live_bytes == 0);
}

TEST_CASE("exhaustion through thrust_allocator is std::bad_alloc and leaves the container intact",
          "[interop][thrust]") {
    simulated_device_memory memory(0, 64 * 1024);
    using alloc = thrust_allocator<int, simulated_device_memory>;
    thrust::device_vector<int, alloc> v(1000, 7, alloc(memory));
    CHECK_THROWS_AS(v.resize(1 << 20), std::bad_alloc);
    CHECK(v.size() == 1000);
    CHECK(thrust::reduce(v.begin(), v.end()) == 7000);
    CHECK(memory.statistics().live_bytes == 1000 * sizeof(int));
    alloc a(memory);
    CHECK_THROWS_AS(static_cast<void>(a.allocate(SIZE_MAX / 2)), std::bad_array_new_length);
    CHECK(memory.statistics().live_bytes == 1000 * sizeof(int));
}

TEST_CASE("thrust_allocator rebinds and compares by resource and stream", "[interop][thrust]") {
    host_memory a;
    host_memory b;
    custody::host::stream s;
    thrust_allocator<int, host_memory> ia(a);
    thrust_allocator<float, host_memory> fb(b);
    thrust_allocator<int, host_memory>::rebind<float>::other rebound(ia);
    CHECK(&rebound.resource() == &a);
    CHECK(rebound == fb); // host_memory is interchangeable
    CHECK_FALSE(thrust_allocator<int, host_memory>(a, s.view()) == ia);
}

TEST_CASE("Thrust's temporary storage comes from a custody resource through the policy", "[interop][thrust]") {
    host_memory memory;
    std::vector<int> v(1000);
    std::iota(v.rbegin(), v.rend(), 0);
    thrust_allocator<char, host_memory> scratch(memory);
    thrust::sort(thrust::cpp::par(scratch), v.data(), v.data() + v.size());
    CHECK(std::is_sorted(v.begin(), v.end()));
    CHECK(v.front() == 0);
    CHECK(memory.statistics().allocations >= 1); // the sort's scratch buffer
    CHECK(memory.statistics().live_bytes == 0);
}
