/* custody_torch_allocator: the C interface of the shared library that backs PyTorch's
 * CUDAPluggableAllocator with one custody pool per device.
 *
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "custody_torch_malloc", "custody_free")
 *
 * (the Python package `custody` does this and installs the other hooks: custody.torch.enable()).
 *
 * Every function is thread-safe. Every function but custody_torch_malloc never throws: a failed
 * call returns NULL (or -1) and custody_last_error() says why, on the calling thread.
 * custody_torch_malloc is PyTorch's allocation function: it never returns NULL for a non-zero
 * size; a failure throws a C++ exception (derived from std::exception, its what() custody's
 * diagnostics), which PyTorch turns into a Python exception. Call it only from C++.
 *
 * The stream is a cudaStream_t in the CUDA build. In the host build (virtual devices, for tests
 * without a GPU) it is NULL, the default host stream, or the state of a custody host stream
 * (custody::host::stream_view::state()). */
#ifndef CUSTODY_TORCH_ALLOCATOR_H
#define CUSTODY_TORCH_ALLOCATOR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A device's counters (see custody::resource_statistics). */
typedef struct custody_torch_stats {
    uint64_t live_bytes;          /* handed out and not yet given back */
    uint64_t peak_live_bytes;
    uint64_t reserved_bytes;      /* held from the device, live or cached */
    uint64_t peak_reserved_bytes;
    uint64_t live_allocations;
    uint64_t allocations;         /* successful allocations, ever */
    uint64_t deallocations;
    uint64_t num_ooms;            /* allocations refused for want of memory */
    uint64_t held_bytes;          /* freed, held until the streams they were recorded on finish */
} custody_torch_stats;

/* A device's counters beyond custody_torch_stats (a struct of its own: custody_torch_stats keeps
 * its size for the callers built against it). */
typedef struct custody_torch_segments {
    uint64_t held_blocks;         /* the blocks of held_bytes */
    uint64_t segments;            /* chunks the pool holds from the device (chunked); granules it maps (mapped) */
    uint64_t device_allocations;  /* chunks taken from the device, ever (chunked); granules mapped (mapped) */
    uint64_t device_frees;        /* chunks given back to the device, ever (chunked); granules unmapped (mapped) */
} custody_torch_segments;

/* Allocation: size bytes on device, ordered on stream. size 0 returns NULL without an error.
 * custody_alloc returns NULL on failure (for C callers); custody_torch_malloc throws (PyTorch's
 * alloc function, see above). custody_free gives a block back on the stream it names. */
void* custody_alloc(ssize_t size, int device, void* stream);
void* custody_torch_malloc(ssize_t size, int device, void* stream);
void custody_free(void* ptr, ssize_t size, int device, void* stream);

/* Sets an option before the first allocation: "max_bytes" (a cap per device; 0: none beyond the
 * device, or CUSTODY_TORCH_MAX_BYTES when set), "device_headroom" (bytes of the device the pool
 * leaves free, CUDA build; default an eighth of the device, at most 1 GiB), "tracking" (1: every
 * allocation goes through custody's tracking resource, for owners, snapshots and per-rank reports),
 * "stacks" (1: with tracking, each allocation's call stack is kept, for leak reports and
 * snapshots) or "chunked" (1: the pools take chunks from cudaMalloc instead of mapping granules,
 * see custody_backing; CUSTODY_BACKING, when set, wins). Returns 0, or -1 (see custody_last_error)
 * for an unknown name or once a pool exists. */
int custody_configure(const char* name, uint64_t value);
/* Caps device's pool at bytes (PyTorch's set_per_process_memory_fraction), before or after the
 * device's first allocation alike: it grows no further beyond them (0: nothing more is allocated;
 * 2^64-1: no cap beyond the device's); what it holds beyond them already stays until trimmed.
 * Wins over max_bytes and CUSTODY_TORCH_MAX_BYTES for that device. 0, or -1 for a bad device. */
int custody_set_max_bytes(int device, uint64_t bytes);
/* What backs device's pools (the whole-process allocator's and the "pool" MemPool backing's),
 * decided at the first call that needs it and kept for the process: "mapped" (the default: one
 * address range per device into which the pool maps 2 MiB granules as it grows and from which it
 * unmaps them, cuMemCreate/cuMemMap; the host build maps the host's virtual memory) or "chunked"
 * (chunks from cudaMalloc, which cudaIpcGetMemHandle and RDMA registration accept and mapped
 * memory is refused by: when asked, by CUSTODY_BACKING=chunked or the option "chunked", or on a
 * device without virtual memory management), followed by why in parentheses. Copied as
 * custody_report does; returns its length, or -1 for a bad device or a CUSTODY_BACKING other than
 * "mapped" or "chunked". */
ssize_t custody_backing(int device, char* buffer, size_t capacity);
/* Called with the device, the bytes asked for, custody's diagnostics and user at every
 * out-of-memory of the whole-process allocator, before custody_torch_malloc throws (or custody_alloc
 * returns NULL), on the allocating thread. It must not throw nor allocate through custody. NULL:
 * no callback. 0, or -1. */
typedef void (*custody_out_of_memory_callback)(int device, size_t bytes, const char* diagnostics, void* user);
int custody_set_out_of_memory_callback(custody_out_of_memory_callback callback, void* user);
/* The name of device's GPU, "GPU-" and its UUID (as nvidia-smi prints it): what custody's claims of
 * a GPU lock, from C++ (interop/gpu_name.hpp) and from Python alike. Copied as custody_report does;
 * returns its length, or -1 for a bad device. (The host build names its virtual devices alike.) */
ssize_t custody_device_name(int device, char* buffer, size_t capacity);

/* Claims the GPU whose identity is device_id (its UUID) for rank, which calls it device, until the
 * process exits (custody::interop::device_lock; lock files in $CUSTODY_RUNTIME_DIR or
 * /tmp/custody-<uid>). Returns 0, or -1 when another process holds it: custody_last_error() then
 * names both ranks. */
int custody_claim_device(const char* device_id, int rank, int device);

/* PyTorch's record_stream hook: work enqueued on stream uses ptr (a live block). When ptr is freed
 * it is held until that work has finished, then reused. 0, or -1 when it cannot be recorded. */
int custody_record_stream(void* ptr, void* stream);
/* PyTorch's empty_cache (reset) hook: gives every device's cached memory back to the device,
 * after the work of held blocks has finished (nothing while a capture is routed, see custody_trim).
 * Returns the bytes given back. */
size_t custody_empty_cache(void);
/* PyTorch's graph-capture hooks (CUDAGraph's beginAllocateToPool, endAllocateToPool and
 * releasePool; PyTorch's pluggable allocator takes them from C++ only, so custody.torch calls them
 * around CUDAGraph.capture_begin, capture_end and reset). The pool id is PyTorch's MempoolId_t
 * {first, second}. begin, called before the capture begins, as PyTorch's CUDAGraph::capture_begin
 * calls its allocator's: from now until end, allocations on device made on stream (the stream about
 * to be captured, never the default stream) and on the streams forked into its capture come from
 * the private pool of that id, made if new and shared (held once more) if not; its blocks are
 * reused within the capture and kept for the graph's replays after end. While a capture is routed,
 * empty_cache and trim leave its device alone, and blocks held for other streams wait for their
 * events until it ends. release drops one hold (one per begin); with none left the pool's memory
 * goes back once its blocks are free. Each returns 0, or -1 with the reason in
 * custody_last_error() (the default stream, an id already being allocated to, released, or
 * holding nothing). */
int custody_begin_allocate_to_pool(int device, uint64_t pool_id_first, uint64_t pool_id_second, void* stream);
int custody_end_allocate_to_pool(int device, uint64_t pool_id_first, uint64_t pool_id_second);
int custody_release_pool(int device, uint64_t pool_id_first, uint64_t pool_id_second);

/* Fills *out with device's counters (zeros before its first allocation). 0, or -1 for a bad device. */
int custody_stats(int device, custody_torch_stats* out);
int custody_segments(int device, custody_torch_segments* out);
/* Gives cached memory back to the device (device -1: all). Returns the bytes released. While a
 * graph capture is routed into any device's pool, custody_trim and custody_empty_cache give nothing
 * back on any device (what they would wait for or free would invalidate the capture). */
size_t custody_trim(int device);
/* Writes a text report into buffer, NUL-terminated and truncated to capacity; returns the length
 * of the whole report (as snprintf). One line per device in use: its backing and why; live, peak
 * live, reserved and peak reserved bytes (custody_stats' numbers); the granules mapped and the
 * address space (mapped) or the chunks (chunked); bytes cached on streams, free to all, the largest
 * free block, bytes held for recorded streams; allocations, frees and out-of-memory errors. */
size_t custody_report(char* buffer, size_t capacity);
/* Tracking (with "tracking" configured on). Owner scopes are per thread and nest ("decode" then
 * "kv_cache" names "decode/kv_cache"); what the thread allocates inside is that owner's.
 * push/pop return 0 or -1; custody_owner_current copies the current owner's name (as
 * custody_report). custody_report_json copies the rank's report on device (device -1: the first
 * device in use) as JSON, in the schema of docs/debug-report-schema.json (its "owners": live
 * memory per owner), and returns its length, or -1; custody_write_report writes it to path (what
 * custody-merge reads); 0 or -1. */
int custody_owner_push(const char* name);
int custody_owner_pop(void);
size_t custody_owner_current(char* buffer, size_t capacity);
ssize_t custody_report_json(int device, char* buffer, size_t capacity);
int custody_write_report(int device, const char* path);

/* A memory snapshot in the format of PyTorch's torch.cuda.memory._dump_snapshot() (a pickle that
 * PyTorch's memory viewer reads; docs/interop-pytorch.md), of every device this process's tracked
 * allocator serves; needs tracking on. custody_record_history keeps the last max_entries events of
 * each device for the snapshot's device_traces (0, the default: none; as PyTorch's
 * _record_memory_history). custody_snapshot_pickle copies the pickle into buffer when capacity
 * holds it all, and returns its length (call again with a larger buffer otherwise), or -1;
 * custody_write_snapshot writes it to path (a new file renamed into place, never through a link);
 * 0 or -1. */
int custody_record_history(uint64_t max_entries);
ssize_t custody_snapshot_pickle(char* buffer, size_t capacity);
int custody_write_snapshot(const char* path);

/* The memory behind a torch.cuda.MemPool (custody.torch.mem_pool): PyTorch's caching allocator
 * keeps serving tensors and takes whole segments from a MemPool's CUDAPluggableAllocator, here from
 * a custody resource per device, one pair of entry points per backing: "pool" (custody's pool, over
 * the device's backing: see custody_backing) and "vmm" (the virtual-memory resource, memory mapped
 * on demand). A segment is taken synchronously, whatever stream PyTorch names, and its free is
 * ordered after the work queued on the stream PyTorch names (the stream it was taken on: the pool
 * caches it on that stream, vmm unmaps it once that stream's work has run); alloc returns NULL on failure
 * (PyTorch's caching allocator then raises its out-of-memory error), with the reason in
 * custody_last_error(). custody_mempool_backings lists the backings ("pool,vmm");
 * custody_mempool_stats fills a backing's counters for a device (segments may be NULL; 0, or -1 for
 * an unknown backing or device). */
void* custody_mempool_pool_alloc(ssize_t size, int device, void* stream);
void custody_mempool_pool_free(void* ptr, ssize_t size, int device, void* stream);
void* custody_mempool_vmm_alloc(ssize_t size, int device, void* stream);
void custody_mempool_vmm_free(void* ptr, ssize_t size, int device, void* stream);
const char* custody_mempool_backings(void);
int custody_mempool_stats(const char* backing, int device, custody_torch_stats* out, custody_torch_segments* segments);

/* Why this thread's last call failed ("" if it did not). */
const char* custody_last_error(void);
/* "cuda" or "host", and the number of devices served. */
const char* custody_platform(void);
int custody_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
