/// @file
/// The vocabulary of graph capture shared by both platforms: capture modes, a stream's capture
/// state, the error the host platform throws for a call that capture forbids, and a guard that
/// sets the calling thread's capture mode for a scope.
///
/// A stream in capture records the work enqueued on it into a graph instead of running it; the
/// graph is launched (replayed) later on a stream. The rules are CUDA's (cudaStreamBeginCapture):
///
///   - work on a capturing stream is recorded, never run; an event recorded on it marks a point of
///     the capture, and another stream made to wait on that event joins the capture (a fork) until
///     the capture ends; every fork must be joined back into the stream that began the capture;
///   - synchronizing a capturing stream and making a capturing stream wait on an event recorded
///     outside the capture are errors that invalidate the capture (ending it then fails); querying
///     or synchronizing an event last recorded in a capture is an error;
///   - "potentially unsafe" calls (memory allocation from the device, event queries and
///     synchronizations) are prohibited while a capture is open, according to the calling
///     thread's mode and the mode each open capture was begun with (capture_mode below).
#pragma once

#include <custody/core/error.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace custody {

/// How a capture restricts potentially unsafe calls (cudaStreamCaptureMode), and the calling
/// thread's own interaction mode (cudaThreadExchangeStreamCaptureMode).
///
/// A thread whose mode is `global` is prohibited from potentially unsafe calls while it has an
/// open capture of its own not begun `relaxed`, or while any other thread has an open capture begun
/// `global`; a thread whose mode is `per_thread` only while it has an open capture of its own not
/// begun `relaxed`; a thread whose mode is `relaxed` never (calls that necessarily conflict with a
/// capture, such as querying an event recorded in it, stay errors). A thread's mode is `global`
/// until changed.
enum class capture_mode : unsigned char {
    global,     ///< cudaStreamCaptureModeGlobal
    per_thread, ///< cudaStreamCaptureModeThreadLocal
    relaxed,    ///< cudaStreamCaptureModeRelaxed
};

/// Whether a stream is capturing (cudaStreamCaptureStatus).
enum class capture_status : unsigned char {
    none,        ///< not capturing: work runs
    active,      ///< capturing: work is recorded into a graph
    invalidated, ///< was capturing until a forbidden call; the capture must still be ended
};

/// A stream's capture state, as one query answers it.
struct capture_info {
    capture_status status = capture_status::none;
    /// The capture's id, unique in the process while status != none; 0 when not capturing, and for
    /// a stream that is part of a capture only implicitly (the cuda platform's legacy default
    /// stream while a blocking stream captures: cudaErrorStreamCaptureImplicit).
    std::uint64_t id = 0;

    [[nodiscard]] constexpr bool capturing() const noexcept { return status != capture_status::none; }
    friend constexpr bool operator==(const capture_info&, const capture_info&) noexcept = default;
};

/// A call that graph capture forbids, on the host platform (the cuda platform reports the same
/// cases as cuda_error with the runtime's error name, given beside each reason below).
class capture_violation final : public error {
public:
    enum class reason : unsigned char {
        unsupported,    ///< not permitted while capturing (cudaErrorStreamCaptureUnsupported)
        invalidated,    ///< the capture was invalidated by an earlier error (cudaErrorStreamCaptureInvalidated)
        merge,          ///< would merge two captures (cudaErrorStreamCaptureMerge)
        unmatched,      ///< the capture was not begun on this stream (cudaErrorStreamCaptureUnmatched)
        unjoined,       ///< a fork was not joined back (cudaErrorStreamCaptureUnjoined)
        isolation,      ///< a dependency would cross the capture's boundary (cudaErrorStreamCaptureIsolation)
        captured_event, ///< the event was last recorded in a capture (cudaErrorCapturedEvent)
        wrong_thread,   ///< ended from another thread than began it (cudaErrorStreamCaptureWrongThread)
        illegal_state,  ///< begun twice, or ended without being begun (cudaErrorIllegalState)
    };

    capture_violation(reason r, std::string_view call, std::string_view detail = {})
        : error(message(r, call, detail)), reason_(r) {}

    [[nodiscard]] reason why() const noexcept { return reason_; }

    /// The name of the CUDA error that reports the same case.
    [[nodiscard]] static constexpr std::string_view cuda_name(reason r) noexcept {
        switch (r) {
        case reason::unsupported: return "cudaErrorStreamCaptureUnsupported";
        case reason::invalidated: return "cudaErrorStreamCaptureInvalidated";
        case reason::merge: return "cudaErrorStreamCaptureMerge";
        case reason::unmatched: return "cudaErrorStreamCaptureUnmatched";
        case reason::unjoined: return "cudaErrorStreamCaptureUnjoined";
        case reason::isolation: return "cudaErrorStreamCaptureIsolation";
        case reason::captured_event: return "cudaErrorCapturedEvent";
        case reason::wrong_thread: return "cudaErrorStreamCaptureWrongThread";
        case reason::illegal_state: return "cudaErrorIllegalState";
        }
        return "?";
    }

private:
    static std::string message(reason r, std::string_view call, std::string_view detail) {
        std::string m = "custody: ";
        m += call;
        m += " violates graph capture (";
        m += cuda_name(r);
        m += ")";
        if (!detail.empty()) {
            m += ": ";
            m += detail;
        }
        return m;
    }

    reason reason_;
};

/// Sets the calling thread's capture mode for a scope and restores the previous one on exit, on
/// any platform (Platform::exchange_capture_mode). A component that must make a potentially unsafe
/// call which cannot affect an open capture (allocating device memory that the capture does not
/// see, querying an event recorded outside it) takes one `relaxed`. Per thread, like the mode.
template <class Platform>
class basic_capture_mode_guard {
public:
    explicit basic_capture_mode_guard(capture_mode mode) : previous_(Platform::exchange_capture_mode(mode)) {}
    ~basic_capture_mode_guard() { Platform::exchange_capture_mode_noexcept(previous_); }
    basic_capture_mode_guard(const basic_capture_mode_guard&) = delete;
    basic_capture_mode_guard& operator=(const basic_capture_mode_guard&) = delete;

private:
    capture_mode previous_;
};

} // namespace custody
