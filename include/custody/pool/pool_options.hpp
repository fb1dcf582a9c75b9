/// @file
/// `pool_options` and `reuse_policy`: how a stream_ordered_pool grows, what it may reuse across
/// streams, and the limits it keeps.
#pragma once

#include <custody/platform/platform.hpp>
#include <custody/pool/capture_pool_id.hpp>
#include <custody/pool/pool_misuse.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace custody::pool {

/// When a block given back on stream A may serve an allocation on another stream B, like CUDA's
/// cudaMemPoolReuse* attributes. On its own stream a block is reusable at once, under every policy:
/// work on A after the allocation is ordered after the work before the free.
enum class reuse_policy {
    /// Never across streams without a host wait (cudaMemPool with every reuse attribute off):
    /// when the pool would grow while other streams hold at least max(request, reserve / 8) in
    /// covered blocks, it waits on the host for the stream holding the most and takes its blocks,
    /// so that a producer/consumer pair stays bounded; the last resort before failing does the same
    /// for every stream.
    same_stream,
    /// B may take A's blocks once A's work up to the free has finished, as seen by a non-blocking
    /// event query (cudaMemPoolReuseAllowOpportunistic). Never makes a stream wait; before growing
    /// it waits on the host as same_stream does.
    opportunistic,
    /// As opportunistic, and when that finds nothing, B is made to wait for A's event (a stream
    /// wait, no host synchronization) and takes the block at once
    /// (cudaMemPoolReuseAllowInternalDependencies). The default, as in CUDA's pools.
    follow_dependencies,
};

/// A function that tells how much memory `device` has free now, or nothing: the platform's
/// `Platform::memory_info` (cudaMemGetInfo on the cuda platform), or one of the caller's own.
using memory_info_function = std::optional<device_memory> (*)(int device);

/// Whether pool_options::checked is on by default: in builds without NDEBUG (debug builds).
#ifdef NDEBUG
inline constexpr bool checked_by_default = false;
#else
inline constexpr bool checked_by_default = true;
#endif

/// pool_options::device_headroom's default: an eighth of the device, at most 1 GiB (see there).
inline constexpr std::size_t automatic_headroom = SIZE_MAX;

/// How a stream_ordered_pool grows and what it keeps. Every field has a default that suits an
/// inference server; the comment beside each says why.
struct pool_options {
    /// Bytes taken from the upstream when the pool is built, as one chunk that serves every size:
    /// while the pool holds no more than this, size-class blocks are cut from it too (beyond it,
    /// they take chunks of their own). 0 (the default): nothing until the first allocation, so a
    /// pool that is never used costs nothing. An engine that knows its working set sets it here
    /// and never grows during a request.
    std::size_t initial_size = 0;

    /// Smallest chunk taken from the upstream when the pool must grow: 2 MiB (the GPU's large
    /// page). Chunks grow with the pool: each is max(growth_step, reserved / growth_divisor), where
    /// reserved counts the chunks of the request's kind (size classes or large blocks), the latter
    /// rounded down to whole 2 MiB pages once above 2 MiB. A large request's chunk holds a whole
    /// number of blocks of its size (at least one), rounded up to 2 MiB.
    std::size_t growth_step = std::size_t{2} << 20;

    /// With 32, the unused tail of the newest chunk is at most about 3% of what the pool holds, so
    /// the pool stays within a few percent of its peak live bytes, while a pool that grows from
    /// 2 MiB to 80 GiB takes about 280 chunks (growths cost a cudaMalloc each, about a millisecond).
    /// 0: every chunk is growth_step (or the request's size).
    std::size_t growth_divisor = 32;

    /// Hard limit on the bytes the pool holds from its upstream. Default: none beyond the device
    /// budget below.
    std::size_t maximum_size = SIZE_MAX;

    /// Over an upstream that maps memory (resource::virtual_memory): the bytes of wholly free
    /// granules the pool's shared free memory keeps mapped; beyond them, granules are unmapped as
    /// they come back to it. Whatever it is, the pool unmaps idle free granules before it maps new
    /// ones (what it maps stays what its live blocks need), and all of them at trim() and before
    /// out_of_memory. Unlimited by default: on the replays of real traces the threshold changes how
    /// often the pool maps (each map and unmap is a driver call), never its peak (docs/benchmarks.md);
    /// a process that shares its GPU sets it to give memory back as it comes free, like
    /// cudaMemPoolAttrReleaseThreshold.
    std::size_t release_threshold = SIZE_MAX;

    /// Each stream's working set: the free memory cached on a stream that gives back what it
    /// allocates (not a consumer of another stream's blocks) stays that stream's, untouched by
    /// other streams' allocations (which grow the pool instead), up to this many bytes per stream,
    /// and up to working_set_total over all the streams so kept. Streams that take turns in one
    /// thread (compute, copy, communication) then reuse their own blocks on the fast path instead
    /// of handing them to each other at every call. The pool so holds at most working_set_total
    /// beyond what its bound on cross-stream reuse allows (see reuse_policy); over an upstream that
    /// maps, idle granules are still unmapped before new ones are mapped, working sets or not.
    /// 0: no working sets.
    std::size_t stream_working_set = std::size_t{64} << 20;
    std::size_t working_set_total = std::size_t{256} << 20;

    /// Cross-stream reuse (see reuse_policy). Default: follow_dependencies, as cudaMallocAsync.
    reuse_policy reuse = reuse_policy::follow_dependencies;

    /// A stream keeps at most `record_interval - 1` size-class blocks of one class given back on it
    /// for itself (its hot stack for that class: the common path's push and pop), not covered by
    /// an event: the next one records the stream's event (`cudaEventRecord`, hundreds of nanoseconds
    /// at best, where a push is a few), and the class's blocks move to the covered side, which other
    /// streams may take once the event has completed. A stack's cap starts at max(1, 256 KiB /
    /// block size) blocks and doubles as the stream's own allocations of the class miss, up to
    /// record_interval - 1 and within record_bytes over the stream's classes: a consumer stream
    /// (which gives back what another allocates) keeps few. Blocks not yet covered serve only their
    /// stream; the last resort before out_of_memory takes them after synchronizing the device.
    /// 1 covers every free at once (RMM's and CUB's behaviour); 0 is taken as 1.
    std::size_t record_interval = 64;
    /// The bytes a stream's hot stacks may grow to (see record_interval); and as soon as the large
    /// blocks given back on a stream since its last record reach this many bytes, it records: a
    /// large buffer given back on a quiet stream (a communication buffer freed once a step) then
    /// serves other streams at once, for one record per 64 MiB.
    std::size_t record_bytes = std::size_t{64} << 20;
    /// ... or as soon as those large blocks reach the pool's reserve / record_share: a consumer
    /// stream that gives back blocks a producer stream allocated covers them before the producer
    /// must grow the pool (with 8, a producer/consumer pair keeps the reserve within 1.5x of the
    /// live peak; see the benchmark cross_stream/*). 0: record_bytes alone.
    std::size_t record_share = 8;

    /// The whole-device budget: the pool grows only while the device keeps `device_headroom` bytes
    /// free for what the pool does not own (NCCL buffers, CUDA contexts, cuBLAS/cuDNN workspaces).
    /// By default (automatic_headroom) an eighth of the device, at most 1 GiB: 1 GiB holds an NCCL
    /// communicator's buffers plus a few library workspaces on any device of 8 GiB or more, and a
    /// small device (a 2 GiB test device, a host platform's virtual one) keeps 7/8 of itself for
    /// the pool instead of half or none. Applies when the device's memory is known, from
    /// `memory_info` (queried at each growth, so memory taken by others counts; its total sizes
    /// the default headroom) or else from `device_capacity` (the device's size in bytes, for
    /// platforms that cannot be asked: the pool's own reserve is then all it counts against it).
    /// The budget is capacity - headroom; out_of_memory names it and its parts when it is what
    /// stopped the pool.
    std::size_t device_headroom = automatic_headroom;
    /// 0: unknown, unless the upstream tells its size (`device_capacity()`, as
    /// host::simulated_device_memory does): the pool then takes it from there, so it is said once.
    std::size_t device_capacity = 0;
    memory_info_function memory_info = nullptr;

    /// Streams the pool keeps a shard (its own lists and lock) for. A stream met after that many
    /// is served without a shard: allocations from the shared free set, deallocations after a
    /// host synchronization of the stream. 64 is far above what an inference process uses
    /// (a few compute, copy and communication streams per device).
    std::size_t max_streams = 64;

    /// Events created when the pool is built (one per stream the pool will meet), and how many
    /// more are created at once when they run out.
    std::size_t initial_events = 8;
    std::size_t event_batch = 8;

    /// Checked mode: the pool keeps its live blocks by address (a map under one lock: O(log n)
    /// and a node allocation per pair) and checks every deallocate against them. A double free,
    /// an interior pointer, a pointer of none of the pool's chunks, or bytes or an alignment other
    /// than the allocation's is reported as a `misuse` (to `on_misuse`, or else its describe() to
    /// custody::report_failure) and changes nothing. On by default in debug builds (no NDEBUG);
    /// its cost per pair is measured by the benchmark pair/pool_checked beside pair/pool.
    bool checked = checked_by_default;
    misuse_callback on_misuse = nullptr;

    /// How the pool learns that a stream is being captured into a graph (see capture_check):
    /// by default from the captures it is told of, without a platform query per call.
    capture_check check_capture = capture_check::scopes;

    /// Announce the pool's memory to CUDA's tools through NVTX (docs/debug.md, "debugging a pool
    /// with CUDA's tools"): each chunk as a heap, each block as a region while it is handed out, so
    /// that compute-sanitizer catches a kernel that writes past a block into its neighbour and names
    /// leaked blocks. Takes effect when the process names an NVTX tool (NVTX_INJECTION64_PATH, set
    /// by compute-sanitizer and Nsight Systems) as the pool is built; otherwise it costs nothing per
    /// call: the fast path's one branch for checked mode covers it (measured: pair/pool_nvtx beside
    /// pair/pool_without_nvtx in docs/benchmarks.md). Compiled in where <nvtx3/nvToolsExtMem.h> is
    /// on the include path (the CUDA Toolkit's) and CUSTODY_DISABLE_NVTX is not defined.
    bool annotate = true;
};

} // namespace custody::pool
