// Virtual-memory operations for tests: a platform's operations (host::vmm, cuda::vmm) with a fault a test can arm at any one of its calls
// (the n-th call of an operation from now fails, as exhaustion or as an error), and tallies of what
// is held (reservations, physical allocations, mappings) so a test can check that everything came
// back. With nothing armed it behaves exactly as the operations it wraps.
#pragma once

#include <custody/platform/host_vmm.hpp>
#include <custody/platform/virtual_memory.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <system_error>

namespace custody::test {

/// The operations a fault can be armed at.
enum class vmm_op { reserve, free_reservation, create, release, map, set_access, unmap, export_fd, count };

/// How an armed call fails: as exhaustion (reserve: nullptr, create: nullopt) or as an error
/// (a throw; for the noexcept operations a reported failure that changes nothing).
enum class vmm_fault { exhausted, error };

/// The armed faults and the tallies. Static (the operations are static); tests reset() before use.
struct vmm_faults {
    static inline std::array<std::atomic<int>, static_cast<std::size_t>(vmm_op::count)> countdown{};
    static inline std::array<std::atomic<int>, static_cast<std::size_t>(vmm_op::count)> calls{};
    static inline std::atomic<vmm_fault> kind{vmm_fault::error};
    static inline std::atomic<int> injected{0};
    // What is held now: reservations made - freed, handles created - released, granules mapped - unmapped.
    static inline std::atomic<long> reservations{0};
    static inline std::atomic<long> handles{0};
    static inline std::atomic<long> mappings{0};

    static void reset() noexcept {
        for (auto& c : countdown) c = 0;
        for (auto& c : calls) c = 0;
        kind = vmm_fault::error;
        injected = 0;
    }
    /// The n-th call of `op` from now (1 = the next) fails as `how`.
    static void arm(vmm_op op, int n, vmm_fault how = vmm_fault::error) noexcept {
        kind = how;
        countdown[static_cast<std::size_t>(op)] = n;
    }
    static int calls_of(vmm_op op) noexcept { return calls[static_cast<std::size_t>(op)].load(); }
    /// Counts a call of `op`; true when it is the armed one.
    static bool fails(vmm_op op) noexcept {
        const auto i = static_cast<std::size_t>(op);
        calls[i].fetch_add(1);
        int n = countdown[i].load();
        while (n > 0) {
            if (countdown[i].compare_exchange_weak(n, n - 1)) {
                if (n == 1) {
                    injected.fetch_add(1);
                    return true;
                }
                return false;
            }
        }
        return false;
    }
    [[noreturn]] static void raise(const char* what) { throw std::system_error(EIO, std::generic_category(), what); }
};

/// `Base`'s operations with faults; `Platform` is the platform its memory is said to belong to
/// (Base's own by default; the faulty host platform for tests that fault copies too).
template <virtual_memory_operations Base, class Platform = typename Base::platform_type>
struct basic_faulty_vmm {
    using platform_type = Platform;
    using handle = typename Base::handle;

    [[nodiscard]] static bool supported(int device) noexcept { return Base::supported(device); }
    [[nodiscard]] static bool exportable(int device) noexcept { return Base::exportable(device); }
    [[nodiscard]] static std::size_t granularity(int device) { return Base::granularity(device); }

    [[nodiscard]] static void* reserve(int device, std::size_t bytes, std::size_t alignment) {
        if (vmm_faults::fails(vmm_op::reserve)) {
            if (vmm_faults::kind == vmm_fault::exhausted) return nullptr;
            vmm_faults::raise("faulty reserve");
        }
        void* p = Base::reserve(device, bytes, alignment);
        if (p != nullptr) ++vmm_faults::reservations;
        return p;
    }
    static void free_reservation(int device, void* base, std::size_t bytes) noexcept {
        if (vmm_faults::fails(vmm_op::free_reservation)) {
            report_noexcept_failure("faulty free_reservation", "injected");
            return;
        }
        Base::free_reservation(device, base, bytes);
        --vmm_faults::reservations;
    }
    [[nodiscard]] static std::optional<handle> create(int device, std::size_t bytes, bool exportable) {
        if (vmm_faults::fails(vmm_op::create)) {
            if (vmm_faults::kind == vmm_fault::exhausted) return std::nullopt;
            vmm_faults::raise("faulty create");
        }
        auto h = Base::create(device, bytes, exportable);
        if (h) ++vmm_faults::handles;
        return h;
    }
    static void release(handle h) noexcept {
        if (vmm_faults::fails(vmm_op::release)) {
            report_noexcept_failure("faulty release", "injected");
            return;
        }
        Base::release(h);
        --vmm_faults::handles;
    }
    static void map(void* ptr, std::size_t bytes, handle h) {
        if (vmm_faults::fails(vmm_op::map)) vmm_faults::raise("faulty map");
        Base::map(ptr, bytes, h);
        ++vmm_faults::mappings;
    }
    static void set_access(void* ptr, std::size_t bytes, std::span<const int> devices) {
        if (vmm_faults::fails(vmm_op::set_access)) vmm_faults::raise("faulty set_access");
        Base::set_access(ptr, bytes, devices);
    }
    static bool unmap(int device, void* ptr, std::size_t bytes) noexcept {
        if (vmm_faults::fails(vmm_op::unmap)) {
            report_noexcept_failure("faulty unmap", "injected");
            return false;
        }
        if (!Base::unmap(device, ptr, bytes)) return false;
        --vmm_faults::mappings;
        return true;
    }
    [[nodiscard]] static int export_fd(handle h) {
        if (vmm_faults::fails(vmm_op::export_fd)) vmm_faults::raise("faulty export_fd");
        return Base::export_fd(h);
    }
};

using faulty_vmm = basic_faulty_vmm<host::vmm>;
static_assert(virtual_memory_operations<faulty_vmm>);

} // namespace custody::test
