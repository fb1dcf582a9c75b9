/// @file
/// What the CUDA leaf resources share: how an allocation call's status is read (exhaustion is an
/// answer, nullptr; anything else is an error), and the stream-ordered half of the resources whose
/// driver calls are synchronous.
#pragma once

#include <custody/core/error.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/detail/leaf.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <new>
#include <source_location>

namespace custody::resource::detail {

/// True when `status` is success; false when it is exhaustion (the sticky error is cleared);
/// throws custody::cuda_error naming `call` for any other status.
inline bool allocated(cudaError_t status, const char* call,
                      std::source_location where = std::source_location::current()) {
    if (status == cudaSuccess) return true;
    static_cast<void>(cudaGetLastError());
    if (status == cudaErrorMemoryAllocation) return false;
    throw cuda_error(static_cast<int>(status), cudaGetErrorName(status), call, where);
}

/// Base of the CUDA leaves whose driver calls are synchronous (cudaMalloc, cudaHostAlloc,
/// cudaMallocManaged): memory is usable on every stream at once, and a free given on a stream
/// first waits for that stream, since work enqueued on it may still use the memory.
template <class Derived>
class synchronous_cuda_leaf : public leaf<Derived, cuda::platform> {
public:
    using stream_type = cuda::stream_view;

    void* raw_allocate(stream_type, std::size_t bytes, std::size_t alignment) {
        return self().raw_allocate_sync(bytes, alignment);
    }
    void raw_deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        {
            cuda::device_guard guard(this->device(), std::nothrow);
            CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaStreamSynchronize(stream.get()));
        }
        self().raw_deallocate_sync(ptr, bytes, alignment);
    }

protected:
    using leaf<Derived, cuda::platform>::leaf;

private:
    Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

} // namespace custody::resource::detail
