// A stand-in for the allocator library (plugins/torch/custody_torch_allocator.h) that writes every
// call custody-replay's torch_library route makes into the file FAKE_TORCH_LIBRARY_LOG, one line a
// call, so that tests/trace/torch_library_test.py can check the calls and their order against
// PyTorch's. Hands out addresses it never backs (the replay touches none); reserved bytes are the
// sizes handed out and not given back since the last empty_cache, as a cache that keeps everything.
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

std::mutex mutex;
std::uintptr_t next_address = 0x100000000;
std::uint64_t live = 0, peak_live = 0, reserved = 0, peak_reserved = 0;

void note(const char* format, auto... args) {
    const char* path = std::getenv("FAKE_TORCH_LIBRARY_LOG"); // NOLINT(concurrency-mt-unsafe)
    if (path == nullptr) return;
    if (std::FILE* f = std::fopen(path, "a")) {
        std::fprintf(f, format, args...);
        std::fclose(f);
    }
}

} // namespace

struct fake_stats {
    std::uint64_t live_bytes, peak_live_bytes, reserved_bytes, peak_reserved_bytes, live_allocations, allocations,
        deallocations, num_ooms, held_bytes;
};

EXPORT void* custody_torch_malloc(ssize_t size, int device, void* stream) {
    std::lock_guard lock(mutex);
    const std::uintptr_t p = next_address;
    next_address += (static_cast<std::uintptr_t>(size) + 0xFFFF) & ~std::uintptr_t{0xFFFF};
    live += static_cast<std::uint64_t>(size);
    reserved += static_cast<std::uint64_t>(size);
    if (live > peak_live) peak_live = live;
    if (reserved > peak_reserved) peak_reserved = reserved;
    note("malloc %zd %d %p -> %p\n", size, device, stream, reinterpret_cast<void*>(p));
    return reinterpret_cast<void*>(p);
}
EXPORT void custody_free(void* ptr, ssize_t size, int device, void* stream) {
    std::lock_guard lock(mutex);
    live -= static_cast<std::uint64_t>(size);
    note("free %p %zd %d %p\n", ptr, size, device, stream);
}
EXPORT std::size_t custody_empty_cache() {
    std::lock_guard lock(mutex);
    const std::uint64_t released = reserved - live;
    reserved = live;
    note("empty_cache\n");
    return released;
}
EXPORT int custody_stats(int, fake_stats* out) {
    std::lock_guard lock(mutex);
    *out = fake_stats{live, peak_live, reserved, peak_reserved, 0, 0, 0, 0, 0};
    return 0;
}
EXPORT int custody_configure(const char* name, std::uint64_t value) {
    note("configure %s %llu\n", name, static_cast<unsigned long long>(value));
    return 0;
}
EXPORT std::size_t custody_report(char* buffer, std::size_t capacity) {
    if (buffer != nullptr && capacity > 0) buffer[0] = '\0';
    return 0;
}
EXPORT const char* custody_last_error() { return ""; }
EXPORT const char* custody_platform() { return "host"; }
EXPORT int custody_device_count() { return 8; }
