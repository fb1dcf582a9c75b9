// interop/thrust.hpp on the CUDA path: thrust::device_vector over a cuda-platform custody resource,
// compiled with nvcc. Exits 77 without a device.
#include <custody/interop/thrust.hpp>
#include <custody/platform/cuda.hpp>

#include <custody/resource/cuda_async.hpp>

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <cstdio>

#include "../support/cuda_presence.hpp"

using custody::interop::thrust_allocator;
using custody::resource::cuda_async;

static_assert(THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA, "this test runs Thrust's CUDA path");

#define EXPECT(cond)                                                                                  \
    do {                                                                                              \
        if (!(cond)) {                                                                                \
            std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond);                   \
            return 1;                                                                                 \
        }                                                                                             \
    } while (false)

int main() {
    if (const int status = custody_test::cuda_gate("thrust_cuda_test (compiled with nvcc)"); status >= 0) return status;
    cuda_async memory(0);
    custody::cuda::stream stream(0);
    {
        using alloc = thrust_allocator<float, cuda_async>;
        thrust::device_vector<float, alloc> v(1 << 20, 1.0f, alloc(memory, stream.view()));
        EXPECT(memory.statistics().live_bytes == (1u << 20) * sizeof(float));
        const float sum = thrust::reduce(thrust::cuda::par.on(stream.view().get()), v.begin(), v.end());
        EXPECT(sum == static_cast<float>(1 << 20));
        v.resize(1 << 21);
        thrust::sequence(thrust::cuda::par.on(stream.view().get()), v.begin(), v.end());
        EXPECT(memory.statistics().allocations == 2);
        // Temporary storage of an algorithm, from the same resource, through the policy.
        thrust_allocator<char, cuda_async> scratch(memory, stream.view());
        thrust::sort(thrust::cuda::par(scratch).on(stream.view().get()), v.begin(), v.end());
        EXPECT(memory.statistics().allocations >= 3);
    }
    custody::cuda::platform::synchronize(stream.view());
    EXPECT(memory.statistics().live_bytes == 0);
    std::puts("thrust::device_vector over a custody resource: ok");
    return 0;
}
