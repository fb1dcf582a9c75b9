/// @file
/// `address_space`: device memory on the host platform as address space only, reserved and never
/// backed, so that a trace of an 80 GiB GPU replays on a laptop; `address_space_vmm`: the same as
/// virtual-memory operations, for the pool that grows by mapping granules.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/host.hpp>
#include <custody/platform/virtual_memory.hpp>
#include <custody/resource/detail/leaf.hpp>
#include <custody/resource/host_memory.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>

#include <sys/mman.h>
#include <unistd.h>

namespace custody::replay {

/// Memory of a virtual device of the host platform that exists only as address space: each block
/// is an anonymous mapping with no access (PROT_NONE) and no swap reservation (MAP_NORESERVE), so
/// it costs neither memory nor commit charge, and any read or write of it faults. A replay measures
/// what an allocator does with device memory without touching any; the fault proves it never does.
///
/// Device binding: belongs to host device `device` (stream ordering checks only).
/// Stream semantics: allocate returns memory usable at once; deallocate on a stream unmaps it once
/// the work enqueued on that stream so far has run (host_memory's rule), so the capacity comes back
/// then. Thread safety: thread-safe. Maximum alignment: a page (mappings are page-aligned).
/// Capacity: at most `capacity` bytes (page-rounded) mapped at once; beyond it, out_of_memory.
/// Complexity: one mmap or munmap per call. Equality: identity.
class address_space final : public resource::detail::leaf<address_space, host::platform> {
public:
    static constexpr const char* name = "address_space";
    static constexpr std::size_t max_alignment = custody::max_alignment;
    static constexpr bool interchangeable = false;

    explicit address_space(int device = 0, std::size_t capacity = SIZE_MAX) : leaf(device), capacity_(capacity) {}
    address_space(const address_space&) = delete;
    address_space& operator=(const address_space&) = delete;

    /// Waits for unmaps still pending on streams, which refer to this resource.
    ~address_space() {
        for (std::size_t n = pending_.load(); n != 0; n = pending_.load()) pending_.wait(n);
    }

    /// Bytes mapped now (page-rounded), including unmaps still pending on a stream.
    [[nodiscard]] std::size_t mapped() const noexcept { return mapped_.load(std::memory_order_acquire); }
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

    void* raw_allocate_sync(std::size_t bytes, std::size_t) noexcept {
        if (align_up_overflows(bytes, page_size())) return nullptr;
        const std::size_t size = pages(bytes);
        std::size_t used = mapped_.load(std::memory_order_relaxed);
        do {
            if (size > capacity_ - std::min(used, capacity_)) return nullptr;
        } while (!mapped_.compare_exchange_weak(used, used + size, std::memory_order_acq_rel));
        void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            mapped_.fetch_sub(size, std::memory_order_acq_rel);
            return nullptr;
        }
        return p;
    }
    void raw_deallocate_sync(void* ptr, std::size_t bytes, std::size_t) noexcept {
        const std::size_t size = pages(bytes);
        ::munmap(ptr, size);
        mapped_.fetch_sub(size, std::memory_order_acq_rel);
    }
    void* raw_allocate(stream_type, std::size_t bytes, std::size_t alignment) noexcept {
        return raw_allocate_sync(bytes, alignment);
    }
    void raw_deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (stream.is_default()) {
            raw_deallocate_sync(ptr, bytes, alignment);
            return;
        }
        pending_.fetch_add(1);
        host::free_after_stream(stream, [this, ptr, bytes, alignment] {
            raw_deallocate_sync(ptr, bytes, alignment);
            pending_.fetch_sub(1);
            pending_.notify_all();
        });
    }

    friend void get_property(const address_space&, device_accessible) noexcept {}

private:
    static std::size_t page_size() noexcept {
        static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        return page;
    }
    static std::size_t pages(std::size_t bytes) noexcept { return align_up(bytes, page_size()); }

    std::size_t capacity_;
    std::atomic<std::size_t> mapped_{0};  // mapped_ <= capacity_
    std::atomic<std::size_t> pending_{0}; // unmaps enqueued on streams and not yet run
};

static_assert(try_allocatable_resource<address_space>);

/// Virtual-memory operations (platform/virtual_memory.hpp) over address space only: a reservation
/// is an inaccessible, unreserved mapping (PROT_NONE, MAP_NORESERVE) and stays so: nothing is ever
/// committed, touched or made accessible, and any read or write faults. Mapping and unmapping make
/// no system call: a replay times the pool's own work for each map and unmap (its bookkeeping and
/// the reservation's, granule by granule), and what a GPU's driver adds per map is counted apart
/// (docs/benchmarks.md). The granularity is the page; a reservation asks for the granule it maps in
/// (a GPU's 2 MiB, so that the pool over it rounds as it would on a GPU).
/// Thread safety: thread-safe (system calls on disjoint ranges).
struct address_space_vmm {
    using platform_type = host::platform;
    struct handle {
        int device = -1;
    };

    [[nodiscard]] static bool supported(int device) noexcept {
        return device >= 0 && device < host::platform::device_count();
    }
    [[nodiscard]] static bool exportable(int) noexcept { return false; }
    [[nodiscard]] static std::size_t granularity(int) { return page(); }

    [[nodiscard]] static void* reserve(int, std::size_t bytes, std::size_t alignment) {
        alignment = std::max(alignment, page());
        if (bytes == 0 || bytes > SIZE_MAX - alignment) return nullptr;
        const std::size_t span = bytes + alignment - page();
        void* raw = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED) return nullptr;
        const auto start = reinterpret_cast<std::uintptr_t>(raw);
        const std::uintptr_t aligned = align_up(start, alignment);
        if (aligned != start) ::munmap(raw, aligned - start);
        if (const std::size_t tail = span - (aligned - start) - bytes; tail != 0) {
            ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
        }
        return reinterpret_cast<void*>(aligned);
    }
    static void free_reservation(int, void* base, std::size_t bytes) noexcept { ::munmap(base, bytes); }
    [[nodiscard]] static std::optional<handle> create(int device, std::size_t, bool) { return handle{device}; }
    static void release(handle) noexcept {}
    static void map(void*, std::size_t, handle) {}
    static void set_access(void*, std::size_t, std::span<const int>) {}
    [[nodiscard]] static bool unmap(int, void*, std::size_t) noexcept { return true; }
    [[nodiscard]] static int export_fd(handle) { throw std::invalid_argument("custody-replay: address space is not exportable"); }

private:
    static std::size_t page() noexcept {
        static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        return size;
    }
};

static_assert(virtual_memory_operations<address_space_vmm>);
static_assert(has_property<address_space, device_accessible> && !has_property<address_space, host_accessible>);

} // namespace custody::replay
