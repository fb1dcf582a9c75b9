/// @file
/// `report_error`, what reading or merging rank reports throws (missing, truncated, malformed,
/// mismatched), and the schema name and version every report carries.
#pragma once

#include <custody/core/error.hpp>

#include <string>
#include <string_view>
#include <utility>

namespace custody::debug {

/// The schema name and version every report carries; a reader accepts only this version.
inline constexpr std::string_view report_schema = "custody.debug.rank_report";
inline constexpr int report_version = 1;

/// A report could not be read or does not fit with the others.
class report_error : public custody::error {
public:
    enum class reason {
        missing,   ///< the file does not exist or cannot be read (a directory, no permission)
        truncated, ///< the JSON ends early (a crash or a full disk while writing)
        malformed, ///< not JSON, or JSON that is not a custody rank report of this version
        mismatched ///< valid on its own, but inconsistent with the other reports
    };
    report_error(reason why, std::string file, const std::string& what)
        : custody::error(std::string(reason_name(why)) + " report" + (file.empty() ? "" : " '" + file + "'") + ": " +
                         what),
          reason_(why), file_(std::move(file)) {}
    [[nodiscard]] reason why() const noexcept { return reason_; }
    [[nodiscard]] const std::string& file() const noexcept { return file_; }

    static constexpr const char* reason_name(reason r) noexcept {
        switch (r) {
        case reason::missing: return "missing";
        case reason::truncated: return "truncated";
        case reason::malformed: return "malformed";
        case reason::mismatched: return "mismatched";
        }
        return "?";
    }

private:
    reason reason_;
    std::string file_;
};
} // namespace custody::debug
