/* custody_torch_allocator: the C interface of the shared library that backs PyTorch's
 * CUDAPluggableAllocator with one custody pool per device.
 *
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "custody_alloc", "custody_free")
 *
 * Every function is thread-safe and never throws. A failed custody_alloc returns NULL and
 * custody_last_error() says why (on the calling thread). The stream is a cudaStream_t in the CUDA
 * build; the host build (virtual devices, for tests without a GPU) treats it as opaque and orders
 * everything on the default host stream. */
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
} custody_torch_stats;

/* PyTorch's two entry points. size 0 returns NULL. */
void* custody_alloc(ssize_t size, int device, void* stream);
void custody_free(void* ptr, ssize_t size, int device, void* stream);

/* Fills *out with device's counters (zeros before its first allocation). 0, or -1 for a bad device. */
int custody_stats(int device, custody_torch_stats* out);
/* Gives cached memory back to the device (device -1: all). Returns the bytes released. */
size_t custody_trim(int device);
/* Writes a text report (one line per device in use) into buffer, NUL-terminated and truncated to
 * capacity; returns the length of the whole report (as snprintf). */
size_t custody_report(char* buffer, size_t capacity);
/* Why this thread's last call failed ("" if it did not). */
const char* custody_last_error(void);
/* "cuda" or "host", and the number of devices served. */
const char* custody_platform(void);
int custody_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
