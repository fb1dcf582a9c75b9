/// @file
/// `failure_callback`: where custody reports failures it must not throw (a CUDA call that failed
/// inside a destructor or a `deallocate`, a leak found at destruction). Logging is a callback the
/// application installs.
#pragma once

#include <atomic>
#include <cstdio>
#include <source_location>
#include <string_view>

namespace custody {

/// Receives one line describing a failure on a noexcept path. Must not throw.
using failure_callback = void (*)(std::string_view message) noexcept;

namespace detail {
inline void default_failure_callback(std::string_view message) noexcept {
    std::fprintf(stderr, "custody: %.*s\n", static_cast<int>(message.size()), message.data());
}
inline std::atomic<failure_callback>& failure_callback_slot() noexcept {
    static std::atomic<failure_callback> slot{&default_failure_callback};
    return slot;
}
} // namespace detail

/// Installs `callback` (nullptr restores the default, which writes to stderr) and returns the
/// previous one. Thread-safe.
inline failure_callback set_failure_callback(failure_callback callback) noexcept {
    return detail::failure_callback_slot().exchange(callback != nullptr ? callback
                                                                        : &detail::default_failure_callback);
}

/// Reports a message through the installed callback. Thread-safe, never throws.
inline void report_failure(std::string_view message) noexcept {
    detail::failure_callback_slot().load()(message);
}

/// Reports that `call` failed with `name` at `where` on a path that cannot throw.
inline void report_noexcept_failure(const char* call, const char* name,
                                    std::source_location where = std::source_location::current()) noexcept {
    char line[512];
    const int n = std::snprintf(line, sizeof line, "%s failed with %s at %s:%u (ignored on a noexcept path)",
                                call, name != nullptr ? name : "?", where.file_name(),
                                static_cast<unsigned>(where.line()));
    report_failure(std::string_view(line, n > 0 ? static_cast<std::size_t>(n) : 0U));
}

} // namespace custody
