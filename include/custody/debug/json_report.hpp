/// @file
/// Writes a rank_report as JSON (the schema is docs/debug-report-schema.json) and reads one back,
/// with typed errors (report_error) for a report that is missing, truncated or not a custody report.
/// The members are written by detail/report_writer.hpp and read by detail/report_reader.hpp.
#pragma once

#include <custody/core/detail/output_file.hpp>
#include <custody/core/error.hpp>
#include <custody/core/rank.hpp>
#include <custody/debug/detail/json.hpp>
#include <custody/debug/detail/report_reader.hpp>
#include <custody/debug/detail/report_writer.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/report_error.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace custody::debug {

/// The report as a JSON document: valid JSON (RFC 8259) in valid UTF-8 that passes
/// docs/debug-report-schema.json, whatever bytes the names hold (each invalid UTF-8 sequence is
/// written as U+FFFD). Deterministic: the same report gives the same text.
[[nodiscard]] inline std::string to_json(const rank_report& r) {
    detail::json::writer w;
    w.begin_object();
    w.field("schema", report_schema);
    w.field("version", report_version);
    detail::write_rank(w, r);
    w.field("tracker", r.tracker);
    w.field("platform", r.platform);
    w.field("started_unix_ns", static_cast<std::int64_t>(r.started_unix_ns));
    w.field("written_unix_ns", static_cast<std::int64_t>(r.written_unix_ns));
    detail::write_totals(w, r);
    detail::write_upstream(w, r);
    detail::write_owners(w, r);
    detail::write_devices(w, r);
    detail::write_live(w, r);
    detail::write_violations(w, r);
    detail::write_timeline(w, r);
    detail::write_trends(w, r);
    w.end_object();
    std::string text = w.take();
    text += '\n';
    return text;
}

/// The file name of a rank's report: "rank-<R>.json", as Python's custody.write_report names it
/// and as a rank's trace is "rank-<R>.ctrace", so `custody-merge DIR/rank-*.json` finds every
/// rank's report whoever wrote it.
[[nodiscard]] inline std::string report_file_name(const rank_info& rank) {
    return "rank-" + std::to_string(rank.rank) + ".json";
}

/// Writes the report to `path`, replacing it whole (custody::detail::write_file: a new file renamed
/// into place, never written through a link). Throws custody::error when the file cannot be
/// written completely; `path` is then as it was.
inline void write_json_report(const rank_report& r, const std::string& path) {
    const std::string text = to_json(r);
    try {
        custody::detail::write_file(path, text);
    } catch (const custody::error& e) {
        throw custody::error(std::string("custody: a report: ") + e.what());
    }
}

/// Reads a report from JSON text. `file` only names it in errors. Reads what the merge tool needs:
/// rank, tracker, platform, times, totals, the upstream's usage (optional: reports written before
/// it existed have none), owners, devices, live groups, violation kinds and details, the timeline
/// and the trends (optional, as the upstream). Integers read exactly, each within its field's range (an int field
/// within int, a count within size_t, the schema's minimums). Throws report_error (truncated or
/// malformed), naming the field for a wrong one.
[[nodiscard]] inline rank_report parse_rank_report(std::string_view text, const std::string& file = {}) {
    namespace json = detail::json;
    json::value doc;
    try {
        doc = json::parse(text);
    } catch (const json::parse_error& e) {
        throw report_error(e.truncated() ? report_error::reason::truncated : report_error::reason::malformed, file,
                           e.what());
    }
    const detail::field_reader f(file);
    if (!doc.is_object()) f.fail("the document is not an object");
    if (f.string(doc, "schema", "report") != report_schema) f.fail("not a custody rank report (schema)");
    if (const auto version = f.integer<std::int64_t>(doc, "version", "report"); version != report_version) {
        f.fail("version " + std::to_string(version) + " is not the supported version " + std::to_string(report_version));
    }
    rank_report r;
    detail::read_rank(f, doc, r);
    r.tracker = f.string(doc, "tracker", "report");
    r.platform = f.string(doc, "platform", "report");
    if (r.platform != "host" && r.platform != "cuda") {
        f.fail("report.platform '" + json::excerpt(r.platform) + "' is neither 'host' nor 'cuda'");
    }
    r.started_unix_ns = f.integer<std::int64_t>(doc, "started_unix_ns", "report");
    r.written_unix_ns = f.integer<std::int64_t>(doc, "written_unix_ns", "report");
    detail::read_totals(f, doc, r);
    detail::read_upstream(f, doc, r);
    detail::read_owners(f, doc, r);
    detail::read_devices(f, doc, r);
    detail::read_live(f, doc, r);
    detail::read_violations(f, doc, r);
    detail::read_timeline(f, doc, r);
    detail::read_trends(f, doc, r);
    return r;
}

/// Reads a report file. Throws report_error: missing (cannot open or read it, with the system's
/// reason), truncated, or malformed.
[[nodiscard]] inline rank_report read_rank_report(const std::string& path) {
    return parse_rank_report(detail::read_file(path), path);
}

} // namespace custody::debug
