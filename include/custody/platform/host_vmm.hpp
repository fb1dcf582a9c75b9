/// @file
/// `host::vmm`: the virtual-memory operations (platform/virtual_memory.hpp) of the host platform,
/// done for real with the kernel's: address space reserved with mmap(PROT_NONE), physical memory
/// mapped over it and committed with mprotect, and given back by mapping the reservation over it
/// again, so that reservations, granules, exhaustion and export are exercised without a GPU.
#pragma once

#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/host.hpp>
#include <custody/platform/virtual_memory.hpp>

#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>

namespace custody::host {

/// The host platform's virtual-memory operations. Every device of the host platform supports them;
/// the granularity is the page size.
///
/// What each does: reserve maps PROT_NONE, MAP_NORESERVE anonymous memory (address space only, no
/// commit charge). create makes nothing for ordinary memory (a private mapping gets its pages when
/// it is mapped and touched) and a memfd of the size for exportable memory. map replaces the
/// reserved pages with a fresh private mapping, or with a shared mapping of the memfd, still
/// PROT_NONE; set_access makes it readable and writable (mprotect), which is when the kernel
/// charges a private mapping's commit (map and set_access throw custody::out_of_memory when the
/// kernel has no memory left to commit: ENOMEM). unmap maps the reservation back over the range (PROT_NONE,
/// MAP_NORESERVE): the pages are freed and the commit returned at once, and a memfd's pages stay
/// only with whoever else maps them. export_fd duplicates the memfd: another process can mmap it.
///
/// Devices: memory is host memory whatever the device; devices are checked to exist, and access
/// is process-wide (set_access checks the devices it is given and grants them all at once).
/// Thread safety: thread-safe (system calls on disjoint ranges).
struct vmm {
    using platform_type = host::platform;

    /// Physical memory: `fd` a memfd for exportable memory, -1 for ordinary memory.
    struct handle {
        int fd = -1;
        std::size_t bytes = 0;
        int device = -1;
    };

    [[nodiscard]] static bool supported(int device) noexcept {
        return device >= 0 && device < platform::device_count();
    }
    [[nodiscard]] static bool exportable(int device) noexcept { return supported(device); }

    [[nodiscard]] static std::size_t granularity(int device) {
        check_device(device);
        return page_size();
    }

    /// `bytes` of address space aligned to `alignment` (a power of two), or nullptr when the
    /// process has none left.
    [[nodiscard]] static void* reserve(int device, std::size_t bytes, std::size_t alignment) {
        check_device(device);
        const std::size_t page = page_size();
        if (alignment < page) alignment = page;
        if (bytes == 0 || bytes > SIZE_MAX - alignment) return nullptr;
        const std::size_t span = bytes + alignment - page;
        void* raw = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED) {
            if (errno == ENOMEM) return nullptr;
            throw_errno("mmap (reserve)");
        }
        // Keep the aligned part; give the head and the tail back.
        const auto start = reinterpret_cast<std::uintptr_t>(raw);
        const std::uintptr_t aligned = (start + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
        const std::size_t head = aligned - start;
        const std::size_t tail = span - head - bytes;
        if (head != 0) ::munmap(raw, head);
        if (tail != 0) ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
        return reinterpret_cast<void*>(aligned);
    }

    static void free_reservation(int, void* base, std::size_t bytes) noexcept {
        if (::munmap(base, bytes) != 0) report_errno("munmap (free_reservation)");
    }

    /// `bytes` of physical memory of `device`; nullopt when the system has none for a memfd.
    [[nodiscard]] static std::optional<handle> create(int device, std::size_t bytes, bool exportable) {
        check_device(device);
        if (!exportable) return handle{-1, bytes, device};
        const int fd = ::memfd_create("custody-vmm", MFD_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOMEM || errno == ENFILE) return std::nullopt;
            throw_errno("memfd_create");
        }
        if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
            const int saved = errno;
            ::close(fd);
            if (saved == ENOMEM || saved == ENOSPC || saved == EFBIG) return std::nullopt;
            errno = saved;
            throw_errno("ftruncate (create)");
        }
        return handle{fd, bytes, device};
    }

    static void release(handle h) noexcept {
        if (h.fd >= 0 && ::close(h.fd) != 0) report_errno("close (release)");
    }

    /// Maps `h` over [ptr, ptr+bytes), a page-aligned part of a reservation; still inaccessible.
    static void map(void* ptr, std::size_t bytes, handle h) {
        if (bytes != h.bytes) throw std::invalid_argument("custody: host vmm maps a handle whole");
        const int flags = MAP_FIXED | (h.fd >= 0 ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS);
        if (::mmap(ptr, bytes, PROT_NONE, flags, h.fd, 0) == MAP_FAILED) {
            const int saved = errno;
            // A failed MAP_FIXED may have dropped the old pages: put the reservation back.
            static_cast<void>(unmap(h.device, ptr, bytes));
            errno = saved;
            throw_errno("mmap (map)", bytes, h.device);
        }
    }

    /// Makes [ptr, ptr+bytes) readable and writable by `devices` (all of which must exist).
    static void set_access(void* ptr, std::size_t bytes, std::span<const int> devices) {
        for (int d : devices) check_device(d);
        if (::mprotect(ptr, bytes, PROT_READ | PROT_WRITE) != 0) {
            throw_errno("mprotect (set_access)", bytes, devices.empty() ? -1 : devices[0]);
        }
    }

    /// Puts the reservation back over [ptr, ptr+bytes): the pages are freed.
    static bool unmap(int, void* ptr, std::size_t bytes) noexcept {
        if (::mmap(ptr, bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) ==
            MAP_FAILED) {
            report_errno("mmap (unmap)");
            return false;
        }
        return true;
    }

    /// A new file descriptor for `h`'s memfd, owned by the caller (close it). Throws
    /// std::invalid_argument if `h` was not created exportable.
    [[nodiscard]] static int export_fd(handle h) {
        if (h.fd < 0) throw std::invalid_argument("custody: host vmm memory was not created exportable");
        const int fd = ::fcntl(h.fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) throw_errno("fcntl (export_fd)");
        return fd;
    }

    [[nodiscard]] static std::size_t page_size() noexcept {
        static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        return page;
    }

private:
    static void check_device(int device) {
        if (!supported(device)) {
            throw std::invalid_argument("custody: host device " + std::to_string(device) + " does not exist");
        }
    }
    [[noreturn]] static void throw_errno(const char* call) {
        throw std::system_error(errno, std::generic_category(), std::string("custody: ") + call);
    }
    /// As above for a call that commits `bytes` of `device`'s memory: the kernel's ENOMEM (no memory
    /// left to commit, or no mapping left to make) is exhaustion, custody::out_of_memory.
    [[noreturn]] static void throw_errno(const char* call, std::size_t bytes, int device) {
        if (errno == ENOMEM) {
            throw out_of_memory(bytes, page_size(), device, resource_statistics{}, "host::vmm",
                                std::string(call) + ": the kernel has no memory left to commit");
        }
        throw_errno(call);
    }
    static void report_errno(const char* call) noexcept { report_noexcept_failure(call, std::strerror(errno)); }
};

static_assert(virtual_memory_operations<vmm>);

} // namespace custody::host
