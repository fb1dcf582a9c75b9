/// @file
/// The convenience umbrella: everything custody has, for code that would rather not pick. No
/// custody header includes it; prefer the single headers below in libraries (they say what they
/// give), and this one in applications and quick experiments.
///
/// Always (a plain C++20 compiler, no CUDA):
///   core/        errors, alignment, concepts (one argument order), resource_ref, statistics, ranks
///   platform/    host.hpp: worker-thread streams and events, virtual devices; host_vmm.hpp: the
///                host platform's virtual-memory operations (mmap, mprotect, memfd)
///   resource/    host_memory, simulated_device_memory, fault_injecting, virtual_memory,
///                virtual_reservation
///   pool/        stream_ordered_pool
///   staging/     staging_ring
///   debug/       tracking_resource, owner_scope, reports, the cross-rank merge
///   sleep/       sleepable_memory: sleep and wake by owner, over a platform's virtual memory
///   buffer/      buffer, scalar; host_buffer.hpp: host::device_buffer, host::pinned_buffer,
///                host::device_scalar (the host platform's names for them)
///   interop/     pmr_adaptor, bind_device, device_lock, pluggable_allocator
/// With the CUDA runtime's headers on the include path (detected with __has_include):
///   platform/cuda.hpp, platform/cuda_vmm.hpp (cuMemCreate/cuMemMap),
///   resource/{cuda_malloc,cuda_async,pinned_host,managed}.hpp,
///   buffer/device_buffer.hpp (device_buffer, pinned_buffer, device_scalar)
/// Not included, because they need more than the runtime: interop/cccl.hpp (CCCL's experimental
/// memory resources), interop/thrust.hpp (Thrust), and the NCCL headers (interop/nccl/*.hpp,
/// resource/nccl_memory.hpp).
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/rank.hpp>
#include <custody/core/resource_ref.hpp>
#include <custody/core/statistics.hpp>

#include <custody/platform/host.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/platform/platform.hpp>
#include <custody/platform/virtual_memory.hpp>

#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>
#include <custody/resource/virtual_memory.hpp>
#include <custody/resource/virtual_reservation.hpp>

#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/staging/staging_ring.hpp>
#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/sleep/sleepable_memory.hpp>

#include <custody/buffer/buffer.hpp>
#include <custody/buffer/host_buffer.hpp>

#include <custody/interop/bind_device.hpp>
#include <custody/interop/device_lock.hpp>
#include <custody/interop/pluggable_allocator.hpp>
#include <custody/interop/pmr.hpp>

#if __has_include(<cuda_runtime_api.h>)
#include <custody/buffer/device_buffer.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/platform/cuda_vmm.hpp>
#include <custody/resource/cuda_async.hpp>
#include <custody/resource/cuda_malloc.hpp>
#include <custody/resource/managed.hpp>
#include <custody/resource/pinned_host.hpp>
#endif
