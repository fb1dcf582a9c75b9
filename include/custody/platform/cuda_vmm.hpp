/// @file
/// `cuda::vmm`: the virtual-memory operations (platform/virtual_memory.hpp) of the cuda platform,
/// the driver's cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess and their inverses,
/// reached through the runtime's driver entry points so that nothing links against libcuda.
#pragma once

#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/platform/virtual_memory.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <source_location>
#include <span>
#include <vector>

namespace custody::cuda {

namespace detail {

/// The driver functions the operations use, looked up once through the runtime
/// (cudaGetDriverEntryPointByVersion), which loads the driver itself: a binary built with this
/// header starts on a machine without a driver, and `loaded` is false there.
struct vmm_driver {
    PFN_cuGetErrorName_v6000 get_error_name = nullptr;
    PFN_cuDeviceGet_v2000 device_get = nullptr;
    PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
    PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
    PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
    PFN_cuMemAddressFree_v10020 address_free = nullptr;
    PFN_cuMemCreate_v10020 create = nullptr;
    PFN_cuMemRelease_v10020 release = nullptr;
    PFN_cuMemMap_v10020 map = nullptr;
    PFN_cuMemUnmap_v10020 unmap = nullptr;
    PFN_cuMemSetAccess_v10020 set_access = nullptr;
    PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
    bool loaded = false;

    [[nodiscard]] static const vmm_driver& get() noexcept {
        static const vmm_driver driver = load();
        return driver;
    }

private:
    template <class F>
    static bool find(F& fn, const char* symbol, unsigned version) noexcept {
        void* address = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
        const cudaError_t status =
            cudaGetDriverEntryPointByVersion(symbol, &address, version, cudaEnableDefault, &found);
#else
        static_cast<void>(version);
        const cudaError_t status = cudaGetDriverEntryPoint(symbol, &address, cudaEnableDefault, &found);
#endif
        if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
            static_cast<void>(cudaGetLastError());
            return false;
        }
        fn = reinterpret_cast<F>(address);
        return true;
    }

    static vmm_driver load() noexcept {
        vmm_driver d;
        d.loaded = find(d.get_error_name, "cuGetErrorName", 6000) && find(d.device_get, "cuDeviceGet", 2000) &&
                   find(d.device_get_attribute, "cuDeviceGetAttribute", 2000) &&
                   find(d.granularity, "cuMemGetAllocationGranularity", 10020) &&
                   find(d.address_reserve, "cuMemAddressReserve", 10020) &&
                   find(d.address_free, "cuMemAddressFree", 10020) && find(d.create, "cuMemCreate", 10020) &&
                   find(d.release, "cuMemRelease", 10020) && find(d.map, "cuMemMap", 10020) &&
                   find(d.unmap, "cuMemUnmap", 10020) && find(d.set_access, "cuMemSetAccess", 10020) &&
                   find(d.export_handle, "cuMemExportToShareableHandle", 10020);
        return d;
    }
};

[[nodiscard]] inline const vmm_driver& driver_or_throw(const char* call) {
    const vmm_driver& d = vmm_driver::get();
    if (!d.loaded) throw cuda_error(CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", call);
    return d;
}

[[nodiscard]] inline const char* driver_error_name(CUresult status) noexcept {
    const char* name = nullptr;
    const vmm_driver& d = vmm_driver::get();
    if (d.loaded) static_cast<void>(d.get_error_name(status, &name));
    return name != nullptr ? name : "unknown CUDA driver error";
}

inline void driver_check(CUresult status, const char* call,
                         std::source_location where = std::source_location::current()) {
    if (status != CUDA_SUCCESS) throw cuda_error(static_cast<int>(status), driver_error_name(status), call, where);
}

/// On a noexcept path: reports a failure (not CUDA_ERROR_DEINITIALIZED: the process is exiting and
/// the driver reclaims everything); true on success.
inline bool driver_report(CUresult status, const char* call,
                          std::source_location where = std::source_location::current()) noexcept {
    if (status == CUDA_SUCCESS) return true;
    if (status != CUDA_ERROR_DEINITIALIZED) report_noexcept_failure(call, driver_error_name(status), where);
    return false;
}

[[nodiscard]] inline CUmemAllocationProp device_memory_prop(int device, bool exportable) noexcept {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    return prop;
}

[[nodiscard]] inline bool device_attribute(int device, CUdevice_attribute attribute) noexcept {
    const vmm_driver& d = vmm_driver::get();
    if (!d.loaded || device < 0 || device >= cuda::device_count()) return false;
    CUdevice dev{};
    int value = 0;
    if (d.device_get(&dev, device) != CUDA_SUCCESS) return false;
    if (d.device_get_attribute(&value, attribute, dev) != CUDA_SUCCESS) return false;
    return value != 0;
}

[[nodiscard]] inline CUdeviceptr address(void* ptr) noexcept { return reinterpret_cast<CUdeviceptr>(ptr); }

/// Makes `device`'s primary context current to the calling thread for a scope (cudaSetDevice
/// initializes it and makes it current, even where the device already was the current one, which
/// a thread that never called the runtime needs before a driver call), then restores the device
/// that was current if it was set up (worth_restoring: a thread that never chose a device is not
/// given a context on device 0).
class primary_context {
public:
    explicit primary_context(int device) : previous_(cuda::current_device()), device_(device) {
        restore_ = previous_ != device_ && worth_restoring<cuda::platform>(previous_);
        CUSTODY_CUDA_TRY(cudaSetDevice(device));
    }
    /// For noexcept paths: a failure is left to the driver call that follows to report.
    primary_context(int device, std::nothrow_t) noexcept : device_(device) {
        if (cudaGetDevice(&previous_) != cudaSuccess) {
            static_cast<void>(cudaGetLastError());
            previous_ = device;
        }
        restore_ = previous_ != device_ && worth_restoring<cuda::platform>(previous_);
        if (cudaSetDevice(device) != cudaSuccess) {
            static_cast<void>(cudaGetLastError());
            restore_ = false;
        }
    }
    ~primary_context() {
        if (restore_) CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaSetDevice(previous_));
    }
    primary_context(const primary_context&) = delete;
    primary_context& operator=(const primary_context&) = delete;

private:
    int previous_ = 0;
    int device_;
    bool restore_ = false; ///< previous_ was set up and another device was made current
};

} // namespace detail

/// The cuda platform's virtual-memory operations: device memory (CU_MEM_ALLOCATION_TYPE_PINNED on
/// a device location), exportable as a POSIX file descriptor (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
/// what NCCL's and CUDA IPC's fd-passing take) where the device says it can. Other handle types
/// (fabric, Win32) and memory on host or NUMA locations are not offered.
///
/// Context: every call runs with its device's primary context current (initialized if nothing
/// has yet) and restores the caller's device.
/// Thread safety: thread-safe, as the driver is.
struct vmm {
    using platform_type = cuda::platform;

    /// Physical memory: the driver's handle, and the device whose memory it is.
    struct handle {
        CUmemGenericAllocationHandle value = 0;
        int device = -1;
    };

    /// The driver is present and `device` supports virtual memory management.
    [[nodiscard]] static bool supported(int device) noexcept {
        return detail::device_attribute(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
    }
    /// `device` can export its memory as a POSIX file descriptor.
    [[nodiscard]] static bool exportable(int device) noexcept {
        return supported(device) &&
               detail::device_attribute(device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
    }

    /// The minimum mapping granularity of `device` (2 MiB on current GPUs), for memory created as
    /// create(device, n, exportable) creates it: the driver answers for the very property the
    /// allocations use (an exportable handle type may need a coarser granule than none).
    [[nodiscard]] static std::size_t granularity(int device, bool exportable = false) {
        const auto& d = detail::driver_or_throw("cuMemGetAllocationGranularity");
        const CUmemAllocationProp prop = detail::device_memory_prop(device, exportable);
        std::size_t g = 0;
        detail::driver_check(d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                             "cuMemGetAllocationGranularity");
        return g;
    }

    [[nodiscard]] static void* reserve(int device, std::size_t bytes, std::size_t alignment) {
        const auto& d = detail::driver_or_throw("cuMemAddressReserve");
        detail::primary_context context(device);
        CUdeviceptr ptr = 0;
        const CUresult status = d.address_reserve(&ptr, bytes, alignment, 0, 0);
        if (status == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
        detail::driver_check(status, "cuMemAddressReserve");
        return reinterpret_cast<void*>(ptr);
    }

    static void free_reservation(int device, void* base, std::size_t bytes) noexcept {
        detail::primary_context context(device, std::nothrow);
        static_cast<void>(detail::driver_report(loaded().address_free(detail::address(base), bytes), "cuMemAddressFree"));
    }

    /// `bytes` of `device`'s memory; nullopt when the device has none left.
    [[nodiscard]] static std::optional<handle> create(int device, std::size_t bytes, bool exportable) {
        const auto& d = detail::driver_or_throw("cuMemCreate");
        detail::primary_context context(device);
        const CUmemAllocationProp prop = detail::device_memory_prop(device, exportable);
        handle h{0, device};
        const CUresult status = d.create(&h.value, bytes, &prop, 0);
        if (status == CUDA_ERROR_OUT_OF_MEMORY) return std::nullopt;
        detail::driver_check(status, "cuMemCreate");
        return h;
    }

    static void release(handle h) noexcept {
        detail::primary_context context(h.device, std::nothrow);
        static_cast<void>(detail::driver_report(loaded().release(h.value), "cuMemRelease"));
    }

    static void map(void* ptr, std::size_t bytes, handle h) {
        const auto& d = detail::driver_or_throw("cuMemMap");
        detail::primary_context context(h.device);
        detail::driver_check(d.map(detail::address(ptr), bytes, 0, h.value, 0), "cuMemMap");
    }

    static void set_access(void* ptr, std::size_t bytes, std::span<const int> devices) {
        const auto& d = detail::driver_or_throw("cuMemSetAccess");
        if (devices.empty()) return;
        detail::primary_context context(devices[0]);
        std::vector<CUmemAccessDesc> access(devices.size());
        for (std::size_t i = 0; i < devices.size(); ++i) {
            access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            access[i].location.id = devices[i];
            access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        }
        detail::driver_check(d.set_access(detail::address(ptr), bytes, access.data(), access.size()),
                             "cuMemSetAccess");
    }

    static bool unmap(int device, void* ptr, std::size_t bytes) noexcept {
        detail::primary_context context(device, std::nothrow);
        return detail::driver_report(loaded().unmap(detail::address(ptr), bytes), "cuMemUnmap");
    }

    /// A POSIX file descriptor for `h` (created exportable), owned by the caller.
    [[nodiscard]] static int export_fd(handle h) {
        const auto& d = detail::driver_or_throw("cuMemExportToShareableHandle");
        detail::primary_context context(h.device);
        int fd = -1;
        detail::driver_check(d.export_handle(&fd, h.value, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                             "cuMemExportToShareableHandle");
        return fd;
    }

private:
    /// The noexcept operations run only after a create or reserve succeeded: the driver is loaded.
    static const detail::vmm_driver& loaded() noexcept { return detail::vmm_driver::get(); }
};

static_assert(virtual_memory_operations<vmm>);

} // namespace custody::cuda
