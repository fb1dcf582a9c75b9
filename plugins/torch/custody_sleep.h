/* custody_sleep: the C interface of sleepable memory in the allocator library: memory allocated for
 * owners (each block in an address range of its own), whose physical memory an owner gives back to
 * the device while it sleeps and takes again, at the same addresses, when it wakes (see
 * docs/sleep.md). One custody::sleep::sleepable_memory per device: cuda::vmm and pinned host memory
 * in the CUDA build, the host platform's virtual memory in the host build; the host memory that
 * holds offloaded contents is kept from one sleep to the next (custody_sleep_release_host).
 *
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "custody_sleep_alloc", "custody_sleep_free")
 *
 * backs a torch.cuda.MemPool with it (the Python package does this: custody.torch.sleepable()).
 * A MemPool's allocation function returns NULL when there is no memory: PyTorch's caching
 * allocator then frees its cached blocks, retries, and raises torch.OutOfMemoryError.
 * The owner of an allocation is the calling thread's owner scope (custody_owner_push), as for the
 * tracking resource.
 *
 * Every function is thread-safe. custody_sleep_malloc throws a C++ exception on failure (for a
 * whole-process allocator, whose NULL PyTorch would store; call it only from C++). The others never
 * throw: they return NULL or a negative status, and custody_sleep_last_error() says why, on the
 * calling thread. Streams are as in
 * custody_torch_allocator.h (a cudaStream_t in the CUDA build, a host stream's state in the host
 * build, NULL for the default stream). */
#ifndef CUSTODY_SLEEP_H
#define CUSTODY_SLEEP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The statuses of custody_sleep and custody_wake: 0, or why nothing was done. */
enum custody_sleep_status {
    CUSTODY_SLEEP_OK = 0,
    CUSTODY_SLEEP_FAILED = -1,        /* a bad argument or a driver error (custody_sleep_last_error) */
    CUSTODY_SLEEP_OWNER_ASLEEP = -2,  /* an owner named is asleep already */
    CUSTODY_SLEEP_OWNER_AWAKE = -3,   /* an owner named is not asleep */
    CUSTODY_SLEEP_CAPTURE_OPEN = -4,  /* a stream the owners' blocks were used on is capturing a graph */
    CUSTODY_SLEEP_OUT_OF_MEMORY = -5, /* no device memory to wake, or no host memory to offload */
};

/* A device's sleepable memory (see custody::sleep::sleep_statistics). */
typedef struct custody_sleep_stats {
    uint64_t live_bytes;      /* allocated and not freed, asleep or not */
    uint64_t live_blocks;
    uint64_t awake_bytes;     /* address space of awake owners' blocks, all mapped */
    uint64_t asleep_bytes;    /* address space of sleeping owners' blocks, kept reserved */
    uint64_t mapped_bytes;    /* physical memory held from the device now */
    uint64_t offloaded_bytes; /* host memory holding sleeping owners' contents */
    uint64_t stuck_bytes;     /* granules of sleeping blocks that would not unmap */
    uint64_t sleeping_owners;
    uint64_t sleeps;          /* owners put to sleep, ever */
    uint64_t wakes;
    uint64_t released_bytes;  /* physical memory given back by sleeps, ever */
} custody_sleep_stats;

/* One owner's blocks on a device (see custody::sleep::owner_memory). */
typedef struct custody_sleep_owner_stats {
    uint64_t blocks;
    uint64_t bytes;
    uint64_t mapped_bytes;
    uint64_t offloaded_bytes;
    int asleep;
    int offload; /* while asleep: its contents were offloaded (1) or discarded (0) */
} custody_sleep_owner_stats;

/* Allocation for the calling thread's owner: custody_sleep_alloc returns NULL with
 * custody_sleep_last_error() (a MemPool's function), custody_sleep_malloc throws. size 0 returns
 * NULL. */
void* custody_sleep_malloc(ssize_t size, int device, void* stream);
void* custody_sleep_alloc(ssize_t size, int device, void* stream);
void custody_sleep_free(void* ptr, ssize_t size, int device, void* stream);

/* Puts owners[0..count) of device to sleep: offload[i] != 0 copies owner i's contents to host
 * memory first, 0 drops them. Waits for the work queued so far on the streams the blocks were
 * allocated on and on streams[0..stream_count) (PyTorch's current stream: its caching allocator
 * does not tell custody the streams it hands a block to). Returns a custody_sleep_status; on any
 * failure the owners are as they were. */
int custody_sleep(int device, const char* const* owners, const int* offload, int count, void* const* streams,
                  int stream_count);
/* Wakes owners[0..count) of device: their blocks mapped again at the same addresses, offloaded
 * contents restored byte for byte, discarded ones zeroed. Returns a custody_sleep_status; on any
 * failure the owners still sleep and nothing stays mapped for them. */
int custody_wake(int device, const char* const* owners, int count);

/* Fills *out (zeros for a device not used yet). 0, or -1 for a bad device. */
int custody_sleep_stats_of(int device, custody_sleep_stats* out);
int custody_sleep_owner_stats_of(int device, const char* owner, custody_sleep_owner_stats* out);

/* Gives back the host memory kept for offloads (pinned in the CUDA build) that no sleeping owner
 * holds, on device (-1: every device). Returns the bytes given back. */
size_t custody_sleep_release_host(int device);

/* Why this thread's last failed sleep call failed ("" if it did not). */
const char* custody_sleep_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
