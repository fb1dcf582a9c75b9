/// @file
/// `trace_error`: why a trace could not be read or written, where in the file, and at which event.
#pragma once

#include <custody/core/error.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace custody::trace {

/// A trace that cannot be read (or a file that cannot be written). Typed by `reason`; the message
/// names the file, the byte offset and the event (its sequence number) where reading stopped: "(event
/// N)" when the bad bytes are inside event N's record, "(after event N)" when they are in a record
/// that follows it.
class trace_error final : public custody::error {
public:
    enum class reason {
        cannot_open,         ///< the file does not exist or cannot be read (or written)
        not_a_trace,         ///< it does not start with the trace format's magic
        unsupported_version, ///< a format version this reader does not know
        truncated,           ///< the data ends before the end record
        malformed,           ///< a record that breaks the format (docs/trace-format.md)
    };

    trace_error(reason why, std::string file, std::uint64_t offset, std::uint64_t event, const std::string& what,
                bool after_event = false)
        : custody::error(make_message(why, file, offset, event, after_event, what)), reason_(why),
          file_(std::move(file)), offset_(offset), event_(event), after_event_(after_event) {}

    [[nodiscard]] reason why() const noexcept { return reason_; }
    [[nodiscard]] const std::string& file() const noexcept { return file_; }
    /// The byte offset in the file where the offending record starts.
    [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
    /// The sequence number of the event being read, or of the last one read when after_event() (0
    /// before the first event).
    [[nodiscard]] std::uint64_t event() const noexcept { return event_; }
    /// Whether reading stopped in a record after event(), rather than inside it.
    [[nodiscard]] bool after_event() const noexcept { return after_event_; }

    [[nodiscard]] static constexpr std::string_view reason_name(reason r) noexcept {
        switch (r) {
        case reason::cannot_open: return "cannot open";
        case reason::not_a_trace: return "not a custody trace";
        case reason::unsupported_version: return "unsupported version";
        case reason::truncated: return "truncated";
        case reason::malformed: return "malformed";
        }
        return "?";
    }

private:
    static std::string make_message(reason why, const std::string& file, std::uint64_t offset, std::uint64_t event,
                                    bool after_event, const std::string& what) {
        std::string m = "trace";
        if (!file.empty()) m += " '" + file + "'";
        m += ": ";
        m += reason_name(why);
        if (why != reason::cannot_open) {
            m += " at byte " + std::to_string(offset);
            if (event != 0) m += (after_event ? " (after event " : " (event ") + std::to_string(event) + ")";
        }
        m += ": " + what;
        return m;
    }

    reason reason_;
    std::string file_;
    std::uint64_t offset_;
    std::uint64_t event_;
    bool after_event_;
};

} // namespace custody::trace
