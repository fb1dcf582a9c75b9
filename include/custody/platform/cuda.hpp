/// @file
/// The cuda platform: device ids, owning streams and events that are destroyed on their own device,
/// a non-owning stream view and asynchronous copies, with the surface of platform/platform.hpp.
///
/// Thread safety: every function is thread-safe as the CUDA runtime is; an event, like a
/// cudaEvent_t, must not be recorded by one thread while another uses it.
///
/// Capture: the runtime's stream capture (cudaStreamBeginCapture/EndCapture, cudaGraphLaunch) with
/// the vocabulary of platform/capture.hpp; what capture forbids fails as cuda_error with the
/// runtime's error name (cudaErrorStreamCaptureUnsupported, cudaErrorCapturedEvent, ...).
#pragma once

#include <custody/core/error.hpp>
#include <custody/platform/capture.hpp>
#include <custody/platform/platform.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <source_location>
#include <string_view>
#include <utility>

/// For noexcept paths (deallocate, destructors): evaluates a CUDA call and, on failure, clears the
/// sticky error and reports it through custody's failure callback instead of throwing, unless the
/// failure is the process exiting (custody::cuda::is_exiting).
#define CUSTODY_CUDA_ASSERT_NOEXCEPT(call)                                                              \
    do {                                                                                                \
        const cudaError_t custody_status_ = (call);                                                     \
        if (custody_status_ != cudaSuccess && !::custody::cuda::is_exiting(custody_status_)) {          \
            static_cast<void>(cudaGetLastError());                                                      \
            ::custody::report_noexcept_failure(#call, cudaGetErrorName(custody_status_),                \
                                               std::source_location::current());                        \
        }                                                                                               \
    } while (false)

namespace custody::cuda {

/// Whether a failed call's `status` is the process exiting: the CUDA runtime is unloading and the
/// driver reclaims everything, so a noexcept path has nothing to report (CUSTODY_CUDA_ASSERT_NOEXCEPT,
/// and through platform::is_exiting, custody::run_exit_tolerant).
[[nodiscard]] constexpr bool is_exiting(cudaError_t status) noexcept { return status == cudaErrorCudartUnloading; }

/// Number of visible CUDA devices; 0 when there is no device or no driver (never throws for that).
[[nodiscard]] inline int device_count() noexcept {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        return 0;
    }
    return count;
}

namespace detail {

using primary_context_state_function = PFN_cuDevicePrimaryCtxGetState_v7000;

/// What `query` (cuDevicePrimaryCtxGetState) says of `device`'s primary context: active only when it
/// succeeds and sets the state to 1. The state is seeded 0, as PyTorch seeds it
/// (c10/cuda/CUDAFunctions.cpp, hasPrimaryContext): the driver may leave it untouched for an
/// inactive context, and a seed of 1 would then read as active (a device guard making a context it
/// need not, on every rank's GPU 0). True when there is no query or it fails: the driver cannot
/// tell, and callers behave as without asking.
[[nodiscard]] inline bool primary_context_active(int device, primary_context_state_function query) noexcept {
    if (query == nullptr) return true;
    unsigned int flags = 0;
    int active = 0;
    if (query(static_cast<CUdevice>(device), &flags, &active) != CUDA_SUCCESS) return true;
    return active == 1;
}

} // namespace detail

/// Whether `device`'s primary context is active (cuDevicePrimaryCtxGetState, reached through the
/// runtime's driver entry point so that nothing links against libcuda): making it current costs no
/// new context. True when the driver cannot tell, so that callers behave as without the query.
[[nodiscard]] inline bool primary_context_active(int device) noexcept {
    static const detail::primary_context_state_function query = []() noexcept -> detail::primary_context_state_function {
        void* address = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
        const cudaError_t status =
            cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &address, 7000, cudaEnableDefault, &found);
#else
        const cudaError_t status = cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &address, cudaEnableDefault, &found);
#endif
        if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) {
            static_cast<void>(cudaGetLastError());
            return nullptr;
        }
        return reinterpret_cast<detail::primary_context_state_function>(address);
    }();
    return detail::primary_context_active(device, query);
}

[[nodiscard]] inline int current_device() {
    int device = 0;
    CUSTODY_CUDA_TRY(cudaGetDevice(&device));
    return device;
}

struct platform;

/// A non-owning handle to a CUDA stream; value-initialized, the default (legacy) stream.
class stream_view {
public:
    using platform_type = cuda::platform;

    constexpr stream_view() noexcept = default;
    constexpr stream_view(cudaStream_t handle) noexcept : handle_(handle) {} // NOLINT: implicit by design
    [[nodiscard]] constexpr cudaStream_t get() const noexcept { return handle_; }
    [[nodiscard]] constexpr bool is_default() const noexcept { return handle_ == nullptr; }
    friend constexpr bool operator==(stream_view, stream_view) noexcept = default;

private:
    cudaStream_t handle_ = nullptr;
};

/// An owning CUDA stream (non-blocking with respect to the legacy default stream), created and
/// destroyed on its device whatever device the calling thread has current. Move-only.
class stream {
public:
    explicit stream(int device = current_device());
    stream(stream&& other) noexcept
        : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}
    stream& operator=(stream&& other) noexcept {
        if (this != &other) {
            reset();
            handle_ = std::exchange(other.handle_, nullptr);
            device_ = other.device_;
        }
        return *this;
    }
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;
    ~stream() { reset(); }

    [[nodiscard]] stream_view view() const noexcept { return stream_view(handle_); }
    operator stream_view() const noexcept { return view(); } // NOLINT: a stream is usable as its view
    [[nodiscard]] int device() const noexcept { return device_; }

private:
    void reset() noexcept;
    cudaStream_t handle_ = nullptr;
    int device_ = -1;
};

/// An owning CUDA event without timing, created and destroyed on its device. Move-only.
class event {
public:
    explicit event(int device = current_device());
    event(event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}
    event& operator=(event&& other) noexcept {
        if (this != &other) {
            reset();
            handle_ = std::exchange(other.handle_, nullptr);
            device_ = other.device_;
        }
        return *this;
    }
    event(const event&) = delete;
    event& operator=(const event&) = delete;
    ~event() { reset(); }

    /// Captures the work enqueued on `s` so far. `s` must belong to this event's device.
    void record(stream_view s) { CUSTODY_CUDA_TRY(cudaEventRecord(handle_, s.get())); }
    [[nodiscard]] bool ready() const {
        const cudaError_t status = cudaEventQuery(handle_);
        if (status == cudaSuccess) return true;
        if (status == cudaErrorNotReady) {
            static_cast<void>(cudaGetLastError());
            return false;
        }
        CUSTODY_CUDA_TRY(status);
        return false;
    }
    void synchronize() const { CUSTODY_CUDA_TRY(cudaEventSynchronize(handle_)); }
    [[nodiscard]] cudaEvent_t get() const noexcept { return handle_; }
    [[nodiscard]] int device() const noexcept { return device_; }

private:
    void reset() noexcept;
    cudaEvent_t handle_ = nullptr;
    int device_ = -1;
};

/// An executable CUDA graph made by platform::end_capture: the captured cudaGraph_t and its
/// instantiation (cudaGraphExec_t), destroyed together on the device that captured them. Move-only;
/// a moved-from or default graph is empty. Launches of one graph are ordered one after another by
/// the runtime.
class graph {
public:
    graph() noexcept = default;
    /// Takes ownership of `captured` (made on `device`) and instantiates it. Throws cuda_error (and
    /// destroys `captured`) if it cannot be instantiated.
    graph(cudaGraph_t captured, int device);
    graph(graph&& other) noexcept
        : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)),
          device_(other.device_) {}
    graph& operator=(graph&& other) noexcept {
        if (this != &other) {
            reset();
            graph_ = std::exchange(other.graph_, nullptr);
            exec_ = std::exchange(other.exec_, nullptr);
            device_ = other.device_;
        }
        return *this;
    }
    graph(const graph&) = delete;
    graph& operator=(const graph&) = delete;
    ~graph() { reset(); }

    /// The number of nodes the capture recorded (cudaGraphGetNodes).
    [[nodiscard]] std::size_t node_count() const {
        std::size_t n = 0;
        if (graph_ != nullptr) CUSTODY_CUDA_TRY(cudaGraphGetNodes(graph_, nullptr, &n));
        return n;
    }
    [[nodiscard]] cudaGraph_t get() const noexcept { return graph_; }
    [[nodiscard]] cudaGraphExec_t exec() const noexcept { return exec_; }
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] explicit operator bool() const noexcept { return exec_ != nullptr; }

private:
    void reset() noexcept;
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
    int device_ = -1;
};

/// The cuda platform's operations (see platform/platform.hpp).
struct platform {
    using stream_view = cuda::stream_view;
    using stream = cuda::stream;
    using event = cuda::event;
    using graph = cuda::graph;
    static constexpr std::string_view name = "cuda";

    [[nodiscard]] static int device_count() noexcept { return cuda::device_count(); }
    [[nodiscard]] static int current_device() { return cuda::current_device(); }
    static void set_device(int device) { CUSTODY_CUDA_TRY(cudaSetDevice(device)); }
    static void set_device_noexcept(int device) noexcept { CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaSetDevice(device)); }
    /// `device`'s primary context is active: a device guard makes it current again only then
    /// (platform/platform.hpp, worth_restoring).
    [[nodiscard]] static bool device_active(int device) noexcept { return primary_context_active(device); }

    /// cudaStreamGetId: unique for the process's lifetime, where a handle may be reused by a new
    /// stream once its stream is destroyed; the per-thread default stream has one per thread.
    /// The handle itself if the query fails (a stream already destroyed).
    [[nodiscard]] static std::uintptr_t stream_key(stream_view s) noexcept {
        unsigned long long id = 0;
        if (cudaStreamGetId(s.get(), &id) == cudaSuccess) return static_cast<std::uintptr_t>(id);
        static_cast<void>(cudaGetLastError());
        return reinterpret_cast<std::uintptr_t>(s.get());
    }
    /// The device of `s`; the current device for the handles that name the current device's
    /// default streams (nullptr, cudaStreamLegacy, cudaStreamPerThread).
    [[nodiscard]] static int stream_device(stream_view s) {
        if (s.is_default() || s.get() == cudaStreamLegacy || s.get() == cudaStreamPerThread) return current_device();
        int device = 0;
        CUSTODY_CUDA_TRY(cudaStreamGetDevice(s.get(), &device));
        return device;
    }
    static void synchronize(stream_view s) { CUSTODY_CUDA_TRY(cudaStreamSynchronize(s.get())); }
    static void synchronize_device(int device);
    static void wait(stream_view s, const event& e) { CUSTODY_CUDA_TRY(cudaStreamWaitEvent(s.get(), e.get(), 0)); }
    [[nodiscard]] static bool is_exiting(const std::exception& e) noexcept {
        const auto* failed = dynamic_cast<const cuda_error*>(&e);
        return failed != nullptr && cuda::is_exiting(static_cast<cudaError_t>(failed->code()));
    }
    /// A driver call (cudaStreamGetCaptureInfo): for the paths where correctness needs it.
    [[nodiscard]] static bool is_capturing(stream_view s) { return query_capture(s).capturing(); }
    /// cudaMemGetInfo on `device` (the caller's current device is restored); nothing if the query
    /// fails. A driver call: the pool asks only when it grows.
    [[nodiscard]] static std::optional<device_memory> memory_info(int device) noexcept;
    static void memcpy_async(void* dst, const void* src, std::size_t bytes, stream_view s) {
        if (bytes == 0) return;
        CUSTODY_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s.get()));
    }
    static void memset_async(void* dst, int value, std::size_t bytes, stream_view s) {
        if (bytes == 0) return;
        CUSTODY_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, s.get()));
    }

    // ---- capture ----

    static void begin_capture(stream_view s, capture_mode mode) {
        CUSTODY_CUDA_TRY(cudaStreamBeginCapture(s.get(), to_cuda(mode)));
    }
    /// Ends the capture begun on `s` (cudaStreamEndCapture) and instantiates the graph on s's device.
    static graph end_capture(stream_view s) {
        cudaGraph_t captured = nullptr;
        const cudaError_t status = cudaStreamEndCapture(s.get(), &captured);
        if (status != cudaSuccess) {
            if (captured != nullptr) static_cast<void>(cudaGraphDestroy(captured));
            static_cast<void>(cudaGetLastError());
            custody::detail::throw_cuda_error(static_cast<int>(status), cudaGetErrorName(status),
                                              "cudaStreamEndCapture", std::source_location::current());
        }
        int device = -1;
        try {
            device = stream_device(s);
        } catch (...) {
            static_cast<void>(cudaGraphDestroy(captured));
            throw;
        }
        return graph(captured, device);
    }
    static void launch(const graph& g, stream_view s) { CUSTODY_CUDA_TRY(cudaGraphLaunch(g.exec(), s.get())); }
    /// s's capture state (cudaStreamGetCaptureInfo: a driver call). The legacy default stream while
    /// a blocking stream of its device captures answers cudaErrorStreamCaptureImplicit: that is
    /// `active` with id 0 (it is part of the capture implicitly; work on it would break the capture).
    [[nodiscard]] static capture_info query_capture(stream_view s) {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        unsigned long long id = 0;
        const cudaError_t result = cudaStreamGetCaptureInfo(s.get(), &status, &id);
        if (result == cudaErrorStreamCaptureImplicit) {
            static_cast<void>(cudaGetLastError());
            return {capture_status::active, 0};
        }
        CUSTODY_CUDA_TRY(result);
        switch (status) {
        case cudaStreamCaptureStatusActive: return {capture_status::active, id};
        case cudaStreamCaptureStatusInvalidated: return {capture_status::invalidated, id};
        default: return {};
        }
    }
    static capture_mode exchange_capture_mode(capture_mode mode) {
        cudaStreamCaptureMode m = to_cuda(mode);
        CUSTODY_CUDA_TRY(cudaThreadExchangeStreamCaptureMode(&m));
        return from_cuda(m);
    }
    static void exchange_capture_mode_noexcept(capture_mode mode) noexcept {
        cudaStreamCaptureMode m = to_cuda(mode);
        CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaThreadExchangeStreamCaptureMode(&m));
    }

    [[nodiscard]] static constexpr cudaStreamCaptureMode to_cuda(capture_mode mode) noexcept {
        switch (mode) {
        case capture_mode::global: return cudaStreamCaptureModeGlobal;
        case capture_mode::per_thread: return cudaStreamCaptureModeThreadLocal;
        case capture_mode::relaxed: return cudaStreamCaptureModeRelaxed;
        }
        return cudaStreamCaptureModeGlobal;
    }
    [[nodiscard]] static constexpr capture_mode from_cuda(cudaStreamCaptureMode mode) noexcept {
        switch (mode) {
        case cudaStreamCaptureModeThreadLocal: return capture_mode::per_thread;
        case cudaStreamCaptureModeRelaxed: return capture_mode::relaxed;
        default: return capture_mode::global;
        }
    }
};

static_assert(custody::platform<platform>);

/// Sets and restores the calling thread's current CUDA device.
using device_guard = basic_device_guard<platform>;
/// Sets and restores the calling thread's stream capture mode (cudaThreadExchangeStreamCaptureMode).
using capture_mode_guard = basic_capture_mode_guard<platform>;

inline void platform::synchronize_device(int device) {
    device_guard guard(device);
    CUSTODY_CUDA_TRY(cudaDeviceSynchronize());
}

inline std::optional<device_memory> platform::memory_info(int device) noexcept {
    std::optional<device_memory> result;
    device_guard guard(device, std::nothrow);
    std::size_t free = 0;
    std::size_t total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
        result = device_memory{free, total};
    } else {
        static_cast<void>(cudaGetLastError());
    }
    return result;
}

inline stream::stream(int device) : device_(device) {
    device_guard guard(device);
    CUSTODY_CUDA_TRY(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking));
}

inline void stream::reset() noexcept {
    if (handle_ == nullptr) return;
    device_guard guard(device_, std::nothrow);
    CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaStreamDestroy(handle_));
    handle_ = nullptr;
}

inline event::event(int device) : device_(device) {
    device_guard guard(device);
    CUSTODY_CUDA_TRY(cudaEventCreateWithFlags(&handle_, cudaEventDisableTiming));
}

inline void event::reset() noexcept {
    if (handle_ == nullptr) return;
    device_guard guard(device_, std::nothrow);
    CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaEventDestroy(handle_));
    handle_ = nullptr;
}

inline graph::graph(cudaGraph_t captured, int device) : graph_(captured), device_(device) {
    cudaError_t status = cudaSuccess;
    try {
        device_guard guard(device);
        status = cudaGraphInstantiate(&exec_, graph_, 0);
    } catch (...) {
        static_cast<void>(cudaGraphDestroy(graph_));
        throw;
    }
    if (status != cudaSuccess) {
        static_cast<void>(cudaGraphDestroy(graph_));
        static_cast<void>(cudaGetLastError());
        custody::detail::throw_cuda_error(static_cast<int>(status), cudaGetErrorName(status), "cudaGraphInstantiate",
                                          std::source_location::current());
    }
}

inline void graph::reset() noexcept {
    if (graph_ == nullptr && exec_ == nullptr) return;
    device_guard guard(device_, std::nothrow);
    if (exec_ != nullptr) CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaGraphExecDestroy(exec_));
    if (graph_ != nullptr) CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaGraphDestroy(graph_));
    graph_ = nullptr;
    exec_ = nullptr;
}

} // namespace custody::cuda
