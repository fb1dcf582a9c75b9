/// @file
/// `nccl_memory`: device memory from ncclMemAlloc, the allocation NCCL can register for zero-copy
/// user buffers (NVLink SHARP, user-buffer registration), bound to one device (NCCL builds only).
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/resource/detail/cuda_leaf.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <new>
#include <source_location>

namespace custody::resource {

/// Memory of one CUDA device from ncclMemAlloc / ncclMemFree. Use it as the upstream of a pool so
/// that the buffers handed to collectives can be registered with ncclCommRegister.
///
/// Device binding: every call runs with the resource's device current and restores the caller's.
/// Stream semantics: ncclMemAlloc is synchronous, so allocate returns memory usable at once by
/// work on any stream. deallocate on a stream first waits for the work already enqueued on that
/// stream (cudaStreamSynchronize), then frees: a blocking call, which a pool makes rarely (when
/// it trims). Put a pool in front of it for frequent allocations.
/// Errors: ncclMemAlloc reports exhaustion as a CUDA or system failure (ncclUnhandledCudaError,
/// ncclSystemError): those are out_of_memory (nullptr from try_allocate); any other status is a
/// caller or library bug and throws custody::nccl_error.
/// Thread safety: thread-safe. Ownership: owns nothing beyond the blocks it hands out.
/// Alignment: ncclMemAlloc aligns to the VMM granularity (at least 2 MiB on current GPUs);
/// alignments up to 4096 are accepted.
/// Equality: interchangeable per device (ncclMemFree frees any ncclMemAlloc block).
/// Complexity: that of ncclMemAlloc (a VMM reservation and mapping: microseconds to milliseconds).
class nccl_memory final : public detail::synchronous_cuda_leaf<nccl_memory> {
public:
    static constexpr const char* name = "nccl_memory";
    static constexpr std::size_t max_alignment = custody::max_alignment;
    static constexpr bool interchangeable = true;

    /// Memory of `device` (by default the calling thread's current device).
    explicit nccl_memory(int device = cuda::current_device()) noexcept : synchronous_cuda_leaf(device) {}

    void* raw_allocate_sync(std::size_t bytes, std::size_t) {
        cuda::device_guard guard(device());
        void* ptr = nullptr;
        const ncclResult_t status = ncclMemAlloc(&ptr, bytes);
        if (status == ncclSuccess) return ptr;
        static_cast<void>(cudaGetLastError());
        if (status == ncclUnhandledCudaError || status == ncclSystemError) return nullptr;
        custody::detail::throw_nccl_error(static_cast<int>(status), ncclGetErrorString(status), "ncclMemAlloc",
                                          std::source_location::current());
    }
    void raw_deallocate_sync(void* ptr, std::size_t, std::size_t) noexcept {
        cuda::device_guard guard(device(), std::nothrow);
        const ncclResult_t status = ncclMemFree(ptr);
        if (status != ncclSuccess) report_noexcept_failure("ncclMemFree", ncclGetErrorString(status));
    }

    friend void get_property(const nccl_memory&, device_accessible) noexcept {}
};

static_assert(try_allocatable_resource<nccl_memory>);
static_assert(resource_with_statistics<nccl_memory>);
static_assert(has_property<nccl_memory, device_accessible> && !has_property<nccl_memory, host_accessible>);

} // namespace custody::resource
