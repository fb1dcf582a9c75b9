// The memory behind a torch.cuda.MemPool: PyTorch's own caching allocator keeps serving tensors and
// asks a MemPool's CUDAPluggableAllocator for whole segments (its 2 MiB and 20 MiB buffers, or a
// large request rounded up), which it splits into blocks itself. Each backing here is a pair of
// entry points PyTorch can load by name, custody_mempool_<backing>_alloc and _free, over one
// custody resource per device:
//
//   pool   custody's stream-ordered pool of the device's backing (mapped granules, or chunks where
//          the device or the user asks for them: plugin_state.hpp), with its limits, headroom and
//          statistics
//   vmm    the virtual-memory resource: each segment mapped on demand, unmapped when it comes back
//
// A segment is PyTorch's to use on any stream: it is taken synchronously (on the default stream),
// whatever stream PyTorch names (its current one, possibly capturing a graph). It comes back with
// the stream it was taken on and no synchronization of PyTorch's own: the free is ordered after the
// work queued on that stream. A failure returns NULL, which PyTorch's caching allocator treats as
// out of memory (it frees cached blocks, retries, then raises torch.OutOfMemoryError). Another
// backing is one more entry in `mempool_backing_names` below and a pair of entry points.
#include "custody_torch_allocator.h"
#include "plugin_state.hpp"

#include <custody/resource/virtual_memory.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#if defined(CUSTODY_TORCH_CUDA)
#include <custody/platform/cuda_vmm.hpp>
#else
#include <custody/platform/host_vmm.hpp>
#endif

namespace {

using namespace custody_plugin; // NOLINT(google-build-using-namespace): the library's own state

#if defined(CUSTODY_TORCH_CUDA)
using vmm_resource = custody::resource::virtual_memory<custody::cuda::vmm>;
#else
using vmm_resource = custody::resource::virtual_memory<custody::host::vmm>;
#endif
using mapped_pool_backing = custody::interop::pluggable_allocator<mapped::pool>;
using chunked_pool_backing = custody::interop::pluggable_allocator<chunked::pool>;
using vmm_backing = custody::interop::pluggable_allocator<vmm_resource>;

/// The names of the backings, as custody_mempool_backings lists them.
constexpr std::string_view mempool_backing_names = "pool,vmm";

/// The address space a vmm backing reserves on `device`: the device's memory (the pool options' cap
/// when set, the host build's virtual device otherwise).
std::size_t vmm_capacity(int device) {
    const custody::pool::pool_options p = device_pool_options(device);
    if (p.maximum_size != SIZE_MAX) return std::max(p.maximum_size, std::size_t{2} << 20);
    if (const auto memory = platform::memory_info(device)) return memory->total;
    return host_capacity(p);
}

/// The "pool" backing's pools over `Leaf`, one per device (the device's backing picks which).
template <class Backing, class Leaf>
Backing& pool_segments() {
    static auto* const the = new Backing(platform::device_count(), [](int device) {
        const custody::pool::pool_options p = platform_pool_options(device_pool_options(device));
        return with_leaf_arguments<Leaf>(device, p, [&](auto&&... leaf) {
            return std::make_unique<typename Backing::resource_type>(p, leaf...);
        });
    });
    return *the;
}

/// Calls `f` with the "pool" backing of `device`'s backing; `decide`: decide it now (backing_of,
/// which may throw) rather than take what it was given.
template <class F>
decltype(auto) with_pool_backing(int device, bool decide, F&& f) {
    if ((decide ? backing_of(device) : known_backing(device)) == backing::chunked) {
        return serve(pool_segments<chunked_pool_backing, chunked_leaf>(), std::forward<F>(f));
    }
    return serve(pool_segments<mapped_pool_backing, mapped_leaf>(), std::forward<F>(f));
}

vmm_backing& vmm_segments() {
    static auto* const the = new vmm_backing(platform::device_count(), [](int device) {
        return std::make_unique<vmm_resource>(device, vmm_capacity(device), mapping_options(device));
    });
    return *the;
}

/// A segment from backing `a`, taken synchronously (usable at once on every stream, PyTorch's
/// current one possibly capturing a graph); NULL (and the reason as custody_last_error) on failure.
template <class Backing>
void* take_segment(Backing& a, ssize_t size, int device) noexcept {
    void* p = a.alloc(size, device, typename Backing::stream_type{});
    if (p == nullptr && size != 0) set_error(Backing::last_error());
    return p;
}

/// A backing's counters on `device` (zeros before its first segment).
template <class Backing>
std::pair<custody_torch_stats, custody_torch_segments> backing_stats(Backing& a, int device) {
    auto* r = a.find(device);
    if (r == nullptr) return {};
    return counters_of(*r, a.out_of_memory_count(device), {0, 0});
}

} // namespace

extern "C" {

CUSTODY_EXPORT void* custody_mempool_pool_alloc(ssize_t size, int device, void*) {
    try {
        return with_pool_backing(device, true, [&](auto& a) { return take_segment(a, size, device); });
    } catch (const std::exception& e) { // the backing could not be decided (CUSTODY_BACKING)
        set_error(e.what());
        return nullptr;
    }
}
// PyTorch gives a segment back with the stream it was taken on, and no synchronization of its own:
// the pool caches it on that stream, so that it serves another stream only after the work already
// queued there (and the same stream in order).
CUSTODY_EXPORT void custody_mempool_pool_free(void* ptr, ssize_t size, int device, void* stream) {
    with_pool_backing(device, false, [&](auto& a) { a.free(ptr, size, device, stream_of(stream)); });
}
CUSTODY_EXPORT void* custody_mempool_vmm_alloc(ssize_t size, int device, void*) {
    return take_segment(vmm_segments(), size, device);
}
// Unmapped once the work already queued on the segment's stream has run (virtual_memory waits for
// the stream it is given): cuMemUnmap does not wait for work in flight.
CUSTODY_EXPORT void custody_mempool_vmm_free(void* ptr, ssize_t size, int device, void* stream) {
    vmm_segments().free(ptr, size, device, stream_of(stream));
}

CUSTODY_EXPORT const char* custody_mempool_backings(void) { return mempool_backing_names.data(); }

CUSTODY_EXPORT int custody_mempool_stats(const char* backing, int device, custody_torch_stats* out,
                                         custody_torch_segments* segments) {
    const std::string_view name = backing != nullptr ? backing : "";
    if (out == nullptr || device < 0 || device >= platform::device_count()) {
        return refuse("custody: mempool_stats: no device " + std::to_string(device));
    }
    return checked([&] {
        std::pair<custody_torch_stats, custody_torch_segments> counters;
        if (name == "pool") {
            counters = with_pool_backing(device, false, [&](auto& a) { return backing_stats(a, device); });
        } else if (name == "vmm") {
            counters = backing_stats(vmm_segments(), device);
        } else {
            throw std::invalid_argument("custody: no MemPool backing '" + std::string(name) + "' (known: " +
                                        std::string(mempool_backing_names) + ")");
        }
        *out = counters.first;
        if (segments != nullptr) *segments = counters.second;
    });
}

} // extern "C"
