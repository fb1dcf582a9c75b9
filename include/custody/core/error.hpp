/// @file
/// The error types every custody component throws, and the macros that turn CUDA and NCCL
/// status codes into them.
///
/// Map:
///   error            : std::runtime_error   an environment failure custody could not hide
///   cuda_error       : error                a CUDA runtime/driver call failed (call, name, code, file:line)
///   nccl_error       : error                an NCCL call failed (call, text, code, file:line)
///   out_of_memory    : std::bad_alloc       a resource could not satisfy a request; carries the
///                                           request, the device and the resource's statistics
///   Caller bugs that can never be right use GSL's Expects/Ensures (terminate).
///   Bad arguments that a caller may compute at run time (an alignment that is not a power of
///   two) are std::invalid_argument.
///
/// This header includes no CUDA header: the check macros below name CUDA and NCCL functions
/// only in their expansion, so they compile wherever those headers are included by the caller.
/// Their counterpart for noexcept paths, CUSTODY_CUDA_ASSERT_NOEXCEPT, is the cuda platform's
/// (platform/cuda.hpp): it knows when a failure is the process exiting.
#pragma once

#include <custody/core/failure_callback.hpp>
#include <custody/core/statistics.hpp>

#include <cstddef>
#include <new>
#include <source_location>
#include <stdexcept>
#include <string>
#include <utility>

namespace custody {

/// Base of every custody exception that is not a std::bad_alloc or a std::invalid_argument.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// A CUDA runtime or driver call returned an error.
class cuda_error final : public error {
public:
    cuda_error(int code, std::string name, std::string call,
               std::source_location where = std::source_location::current())
        : error(name + " (" + std::to_string(code) + ") from " + call + " at " + where.file_name() + ":" +
                std::to_string(where.line())),
          code_(code), name_(std::move(name)), call_(std::move(call)), file_(where.file_name()),
          line_(static_cast<int>(where.line())) {}

    [[nodiscard]] int code() const noexcept { return code_; }
    [[nodiscard]] const std::string& error_name() const noexcept { return name_; }
    [[nodiscard]] const std::string& call() const noexcept { return call_; }
    [[nodiscard]] const char* file() const noexcept { return file_; }
    [[nodiscard]] int line() const noexcept { return line_; }

private:
    int code_;
    std::string name_;
    std::string call_;
    const char* file_;
    int line_;
};

/// An NCCL call returned an error.
class nccl_error final : public error {
public:
    nccl_error(int code, std::string text, std::string call,
               std::source_location where = std::source_location::current())
        : error(text + " (" + std::to_string(code) + ") from " + call + " at " + where.file_name() + ":" +
                std::to_string(where.line())),
          code_(code), call_(std::move(call)) {}

    [[nodiscard]] int code() const noexcept { return code_; }
    [[nodiscard]] const std::string& call() const noexcept { return call_; }

private:
    int code_;
    std::string call_;
};

/// A resource could not satisfy a request. The resource is unchanged (strong guarantee).
///
/// Carries what a user needs to act: the request, the device (-1 for plain host memory), the
/// resource's statistics when the request failed, and a free-form diagnostic line the resource may
/// add (a pool adds its largest free block and fragmentation, for example).
class out_of_memory final : public std::bad_alloc {
public:
    out_of_memory(std::size_t requested, std::size_t alignment, int device, resource_statistics stats,
                  std::string resource_name, std::string detail = {})
        : requested_(requested), alignment_(alignment), device_(device), stats_(stats),
          message_(make_message(requested, alignment, device, stats, resource_name, detail)) {}

    [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }
    [[nodiscard]] std::size_t requested() const noexcept { return requested_; }
    [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] const resource_statistics& statistics() const noexcept { return stats_; }

private:
    static std::string make_message(std::size_t requested, std::size_t alignment, int device,
                                    const resource_statistics& s, const std::string& name,
                                    const std::string& detail) {
        std::string m = "custody: out of memory in " + name + ": " + std::to_string(requested) +
                        " bytes (alignment " + std::to_string(alignment) + ") on " +
                        (device < 0 ? std::string("host") : "device " + std::to_string(device)) +
                        "; live " + std::to_string(s.live_bytes) + " B in " +
                        std::to_string(s.live_allocations) + " blocks, peak " +
                        std::to_string(s.peak_live_bytes) + " B, reserved " +
                        std::to_string(s.reserved_bytes) + " B";
        if (!detail.empty()) m += "; " + detail;
        return m;
    }

    std::size_t requested_;
    std::size_t alignment_;
    int device_;
    resource_statistics stats_;
    std::string message_;
};

namespace detail {

[[noreturn]] inline void throw_cuda_error(int code, const char* name, const char* call,
                                          std::source_location where) {
    throw cuda_error(code, name != nullptr ? name : "unknown CUDA error", call, where);
}

[[noreturn]] inline void throw_nccl_error(int code, const char* text, const char* call,
                                          std::source_location where) {
    throw nccl_error(code, text != nullptr ? text : "unknown NCCL error", call, where);
}

} // namespace detail
} // namespace custody

/// Evaluates a CUDA runtime call and throws custody::cuda_error unless it returned cudaSuccess.
/// Clears the sticky last error so a caught failure does not resurface from a later call.
#define CUSTODY_CUDA_TRY(call)                                                                          \
    do {                                                                                                \
        const auto custody_status_ = (call);                                                            \
        if (custody_status_ != cudaSuccess) {                                                           \
            static_cast<void>(cudaGetLastError());                                                      \
            ::custody::detail::throw_cuda_error(static_cast<int>(custody_status_),                      \
                                                cudaGetErrorName(custody_status_), #call,               \
                                                std::source_location::current());                       \
        }                                                                                               \
    } while (false)

/// Evaluates a CUDA driver call and throws custody::cuda_error unless it returned CUDA_SUCCESS.
#define CUSTODY_CU_TRY(call)                                                                            \
    do {                                                                                                \
        const CUresult custody_status_ = (call);                                                        \
        if (custody_status_ != CUDA_SUCCESS) {                                                          \
            const char* custody_name_ = nullptr;                                                        \
            static_cast<void>(cuGetErrorName(custody_status_, &custody_name_));                         \
            ::custody::detail::throw_cuda_error(static_cast<int>(custody_status_), custody_name_, #call, \
                                                std::source_location::current());                       \
        }                                                                                               \
    } while (false)

/// Evaluates an NCCL call and throws custody::nccl_error unless it returned ncclSuccess.
#define CUSTODY_NCCL_TRY(call)                                                                          \
    do {                                                                                                \
        const ncclResult_t custody_status_ = (call);                                                    \
        if (custody_status_ != ncclSuccess) {                                                           \
            ::custody::detail::throw_nccl_error(static_cast<int>(custody_status_),                      \
                                                ncclGetErrorString(custody_status_), #call,             \
                                                std::source_location::current());                       \
        }                                                                                               \
    } while (false)
