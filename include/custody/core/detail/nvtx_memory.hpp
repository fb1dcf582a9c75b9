/// @file
/// `nvtx_memory`: what this process has told CUDA's tools about custody's memory through NVTX's
/// memory API (nvtx3/nvToolsExtMem.h: header-only, shipped with the CUDA Toolkit, no CUDA runtime
/// needed): heaps (memory taken from an upstream to be handed out in pieces) and regions (the
/// pieces handed out), in one NVTX domain, "custody".
///
/// Compiled in when <nvtx3/nvToolsExtMem.h> is on the include path (the CUDA Toolkit's include
/// directory) and CUSTODY_DISABLE_NVTX is not defined; otherwise every call does nothing and
/// listening() is false. Compile every translation unit of a program alike: the choice is made per
/// translation unit. This header includes no CUDA header.
#pragma once

#if !defined(CUSTODY_DISABLE_NVTX) && __has_include(<nvtx3/nvToolsExtMem.h>)
#define CUSTODY_HAS_NVTX 1
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(__linux__)
// NVTX's implementation is in its headers (about 30 KB of code per translation unit), and GCC
// inlines its functions into one another, spending the unit's inlining budget (inline-unit-growth)
// so that the pool's fast path is no longer inlined: measured with callgrind, a pair cost 36 to 52 more
// instructions in a unit that included NVTX than in the same unit without it, none with NVTX's
// functions compiled without inlining into them. They run only while a tool listens. The system
// headers NVTX includes come first, so that only NVTX's own functions are built that way.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>
#include <wchar.h>
#pragma GCC push_options
#pragma GCC optimize("no-inline")
#include <nvtx3/nvToolsExtMem.h>
#pragma GCC pop_options
#else
#include <nvtx3/nvToolsExtMem.h>
#endif
#else
#define CUSTODY_HAS_NVTX 0
#endif

#include <custody/core/detail/mutex.hpp>
#include <custody/core/failure_callback.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <string_view>

namespace custody::detail {

/// Whether custody's NVTX calls are compiled into this translation unit.
inline constexpr bool nvtx_compiled = CUSTODY_HAS_NVTX != 0;

/// The longest name CUDA's tools take for a region (compute-sanitizer: printable ASCII, 1 to 49
/// characters); longer names are cut, other characters become '?'.
inline constexpr std::size_t nvtx_name_limit = 49;

/// The process's announcements, kept only while a tool listens, so that every call to the tool is
/// consistent with the ones before it: a region lies in a heap announced before it, is announced
/// once and withdrawn once, and a name goes only to a region or to memory outside every heap (an
/// allocation of its own, such as cudaMalloc's). One table per process because the tool's view is
/// one per process: a tracker names a block that a pool announced.
///
/// A heap announced `whole` (a capture-private pool's chunk: the graphs captured into it touch its
/// blocks at every replay, long after the host gave them back) is also one region from end to end,
/// named after the heap, and its blocks are not announced one by one.
///
/// Invariants (under mutex_):
///   heaps_ do not overlap; regions_ do not overlap
///   every region of regions_ lies within one heap of heaps_ that is not whole
///   the tool knows exactly heaps_, regions_ and one region per whole heap
/// Thread safety: thread-safe (one mutex, held across the call to the tool so that the tool sees the
/// calls in the table's order). Every member is noexcept: a failure (no memory for the table) skips
/// the announcement and is reported once through custody::report_failure.
/// Complexity: O(log n) per call, plus the tool's own cost; nothing at all while no tool listens.
class nvtx_memory {
public:
    /// The process's table. Never destroyed: a pool that lives until the process exits withdraws its
    /// heaps from its destructor, after every static of the program may have gone.
    [[nodiscard]] static nvtx_memory& instance() noexcept {
        static nvtx_memory* const table = new nvtx_memory;
        return *table;
    }

    /// Whether the process names an NVTX tool: NVTX_INJECTION64_PATH (NVTX_INJECTION32_PATH in a
    /// 32-bit process) is set, which is how compute-sanitizer and Nsight Systems attach theirs (a
    /// tool linked statically into the program is not seen). Read once; asks NVTX nothing, so it
    /// may be called before the CUDA runtime is initialized.
    [[nodiscard]] static bool tool_named() noexcept {
        static const bool named = [] {
            const char* path = std::getenv(sizeof(void*) == 4 ? "NVTX_INJECTION32_PATH" : "NVTX_INJECTION64_PATH");
            return path != nullptr && *path != '\0';
        }();
        return named;
    }

    /// Whether a tool listens (NVTX asked once per process, at the first call). Call it only after
    /// the CUDA runtime is initialized where there is one (compute-sanitizer asks for that): custody
    /// first asks when a heap is announced, after its upstream handed out the memory.
    [[nodiscard]] static bool listening() noexcept { return domain() != nullptr; }

    /// Announces `size` bytes at `base` as a heap named `name` (copied, made printable).
    /// `whole`: the heap is also one region, end to end (see the class comment).
    [[gnu::noinline, gnu::cold]] void add_heap(std::uintptr_t base, std::size_t size, std::string_view name, bool whole) noexcept {
#if CUSTODY_HAS_NVTX
        if (!listening() || size == 0) return;
        std::lock_guard lock(mutex_);
        if (overlaps_heap(base, size)) return; // announced already (a pool over another pool's block)
        char text[nvtx_name_limit + 1];
        const nvtxMemVirtualRangeDesc_t range = range_of(base, size);
        nvtxMemHeapDesc_t desc{};
        desc.extCompatID = NVTX_EXT_COMPATID_MEM;
        desc.structSize = sizeof(desc);
        desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
        desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
        desc.typeSpecificDescSize = sizeof(range);
        desc.typeSpecificDesc = &range;
        desc.messageType = NVTX_MESSAGE_TYPE_ASCII;
        desc.message.ascii = printable(name, text);
        try {
            auto [it, added] = heaps_.emplace(base, heap{size, nullptr, whole});
            static_cast<void>(added);
            it->second.handle = nvtxMemHeapRegister(domain(), &desc);
        } catch (...) {
            lost("a heap");
            return;
        }
        if (whole) {
            register_region(heaps_.at(base).handle, base, size);
            name_locked(base, name);
        }
#else
        static_cast<void>(base), static_cast<void>(size), static_cast<void>(name), static_cast<void>(whole);
#endif
    }

    /// Withdraws the heap at `base` before its memory goes back to its upstream. Regions still in it
    /// (blocks never given back) go with it; the tool may report them as leaks. Returns how many.
    [[gnu::noinline, gnu::cold]] std::size_t remove_heap(std::uintptr_t base) noexcept {
#if CUSTODY_HAS_NVTX
        if (!listening()) return 0;
        std::lock_guard lock(mutex_);
        auto h = heaps_.find(base);
        if (h == heaps_.end()) return 0;
        const auto first = regions_.lower_bound(base);
        const auto last = regions_.lower_bound(base + h->second.size);
        const auto left = static_cast<std::size_t>(std::distance(first, last));
        regions_.erase(first, last);
        nvtxMemHeapUnregister(domain(), static_cast<nvtxMemHeapHandle_t>(h->second.handle));
        heaps_.erase(h);
        return left;
#else
        static_cast<void>(base);
        return 0;
#endif
    }

    /// Announces the block of `size` bytes at `address`, just handed out. Nothing when it lies in no
    /// announced heap, in a whole one, or in a region already (a pool over another pool's block:
    /// the inner pool's block is what the tools see).
    [[gnu::noinline, gnu::cold]] void add_region(std::uintptr_t address, std::size_t size) noexcept {
#if CUSTODY_HAS_NVTX
        if (!listening() || size == 0) return;
        std::lock_guard lock(mutex_);
        const heap* h = heap_of(address);
        if (h == nullptr || h->whole || in_region(address)) return;
        try {
            regions_.emplace(address, size);
        } catch (...) {
            lost("a block");
            return;
        }
        register_region(h->handle, address, size);
#else
        static_cast<void>(address), static_cast<void>(size);
#endif
    }

    /// Withdraws the block at `address`, about to be given back. Nothing for a block not announced.
    [[gnu::noinline, gnu::cold]] void remove_region(std::uintptr_t address) noexcept {
#if CUSTODY_HAS_NVTX
        if (!listening()) return;
        std::lock_guard lock(mutex_);
        auto r = regions_.find(address);
        if (r == regions_.end()) return;
        regions_.erase(r);
        nvtxMemRegionRef_t ref{};
        ref.pointer = reinterpret_cast<const void*>(address);
        nvtxMemRegionsUnregisterBatch_t batch{};
        batch.extCompatID = NVTX_EXT_COMPATID_MEM;
        batch.structSize = sizeof(batch);
        batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
        batch.refCount = 1;
        batch.refElementSize = sizeof(ref);
        batch.refElements = &ref;
        nvtxMemRegionsUnregister(domain(), &batch);
#else
        static_cast<void>(address);
#endif
    }

    /// Names the block at `address` (a region, or an allocation outside every heap) `name`, cut to
    /// what the tools take. Nothing for an address inside a heap that is not a region's start.
    [[gnu::noinline, gnu::cold]] void name(std::uintptr_t address, std::string_view name) noexcept {
#if CUSTODY_HAS_NVTX
        if (!listening() || name.empty()) return;
        std::lock_guard lock(mutex_);
        if (!regions_.contains(address) && heap_of(address) != nullptr) return;
        name_locked(address, name);
#else
        static_cast<void>(address), static_cast<void>(name);
#endif
    }

    /// `name` as the tools take it, in `out` (nvtx_name_limit + 1 chars): printable ASCII, cut.
    static const char* printable(std::string_view name, char* out) noexcept {
        const std::size_t n = std::min(name.size(), nvtx_name_limit);
        for (std::size_t i = 0; i < n; ++i) {
            const char c = name[i];
            out[i] = (c >= 0x20 && c < 0x7f) ? c : '?';
        }
        out[n] = '\0';
        return out;
    }

private:
    struct heap {
        std::size_t size;
        void* handle; ///< the tool's nvtxMemHeapHandle_t
        bool whole;   ///< one region end to end; its blocks are not announced
    };

    nvtx_memory() = default;

#if CUSTODY_HAS_NVTX
    /// The domain every call names; null when no tool listens (NVTX returns null then).
    static nvtxDomainHandle_t domain() noexcept {
        static const nvtxDomainHandle_t d = nvtxDomainCreateA("custody");
        return d;
    }

    /// The heap that holds `address` (mutex_ held), or nullptr.
    [[nodiscard]] const heap* heap_of(std::uintptr_t address) const noexcept {
        auto it = heaps_.upper_bound(address);
        if (it == heaps_.begin()) return nullptr;
        --it;
        return address < it->first + it->second.size ? &it->second : nullptr;
    }
    /// Whether a region holds `address` (mutex_ held).
    [[nodiscard]] bool in_region(std::uintptr_t address) const noexcept {
        auto it = regions_.upper_bound(address);
        if (it == regions_.begin()) return false;
        --it;
        return address < it->first + it->second;
    }
    [[nodiscard]] bool overlaps_heap(std::uintptr_t base, std::size_t size) const noexcept {
        auto it = heaps_.lower_bound(base);
        if (it != heaps_.end() && it->first < base + size) return true;
        return heap_of(base) != nullptr;
    }

    static nvtxMemVirtualRangeDesc_t range_of(std::uintptr_t address, std::size_t size) noexcept {
        nvtxMemVirtualRangeDesc_t range{};
        range.ptr = reinterpret_cast<const void*>(address);
        range.size = size;
        return range;
    }

    void register_region(void* heap_handle, std::uintptr_t address, std::size_t size) noexcept {
        const nvtxMemVirtualRangeDesc_t range = range_of(address, size);
        nvtxMemRegionsRegisterBatch_t batch{};
        batch.extCompatID = NVTX_EXT_COMPATID_MEM;
        batch.structSize = sizeof(batch);
        batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
        batch.heap = static_cast<nvtxMemHeapHandle_t>(heap_handle);
        batch.regionCount = 1;
        batch.regionDescElementSize = sizeof(range);
        batch.regionDescElements = &range;
        nvtxMemRegionsRegister(domain(), &batch);
    }

    void name_locked(std::uintptr_t address, std::string_view name) noexcept {
        char text[nvtx_name_limit + 1];
        nvtxMemRegionNameDesc_t element{};
        element.regionRefType = NVTX_MEM_REGION_REF_TYPE_POINTER;
        element.nameType = NVTX_MESSAGE_TYPE_ASCII;
        element.region.pointer = reinterpret_cast<const void*>(address);
        element.name.ascii = printable(name, text);
        nvtxMemRegionsNameBatch_t batch{};
        batch.extCompatID = NVTX_EXT_COMPATID_MEM;
        batch.structSize = sizeof(batch);
        batch.regionCount = 1;
        batch.regionElementSize = sizeof(element);
        batch.regionElements = &element;
        nvtxMemRegionsName(domain(), &batch);
    }

    /// Reports, once per process, that an announcement was skipped for want of host memory.
    void lost(const char* what) noexcept {
        if (lost_) return;
        lost_ = true;
        char line[160];
        std::snprintf(line, sizeof line, "no host memory to announce %s to CUDA's tools; the tools' view of custody's memory is incomplete", what);
        report_failure(line);
    }

    custody::detail::mutex mutex_;
    std::map<std::uintptr_t, heap> heaps_;           ///< base -> heap; guarded by mutex_
    std::map<std::uintptr_t, std::size_t> regions_;  ///< block address -> bytes; guarded by mutex_
    bool lost_ = false;                              ///< guarded by mutex_
#else
    static constexpr void* domain() noexcept { return nullptr; }
#endif
};

} // namespace custody::detail
