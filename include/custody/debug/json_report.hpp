/// @file
/// Writes a rank_report as JSON (the schema is docs/debug-report-schema.json) and reads one back,
/// with typed errors for a report that is missing, truncated or not a custody report.
#pragma once

#include <custody/core/detail/format.hpp>
#include <custody/core/detail/output_file.hpp>
#include <custody/core/error.hpp>
#include <custody/core/rank.hpp>
#include <custody/debug/detail/json.hpp>
#include <custody/debug/report.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
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

namespace detail {

/// sum += bytes, stopping at SIZE_MAX (reports from files may hold any count).
inline void add_saturating(std::size_t& sum, std::size_t bytes) noexcept {
    sum = bytes > std::numeric_limits<std::size_t>::max() - sum ? std::numeric_limits<std::size_t>::max() : sum + bytes;
}

/// Writes a timeline sample's owners as the members of one object. Each name appears once as the
/// writer spells it (invalid UTF-8 as U+FFFD): names that become one that way, or that repeat,
/// are one member holding their sum (saturating at SIZE_MAX).
inline void write_sample_owners(json::writer& w, const timeline_sample& s) {
    bool distinct = true; // valid UTF-8 and strictly increasing: written as they are
    for (std::size_t i = 0; i < s.owners.size() && distinct; ++i) {
        distinct = json::is_valid_utf8(s.owners[i].first) && (i == 0 || s.owners[i - 1].first < s.owners[i].first);
    }
    w.begin_object();
    if (distinct) {
        for (const auto& [o, b] : s.owners) {
            w.key(o);
            w.number(static_cast<std::uint64_t>(b));
        }
    } else {
        std::map<std::string, std::size_t> merged;
        for (const auto& [o, b] : s.owners) {
            add_saturating(merged[json::to_valid_utf8(o)], b);
        }
        for (const auto& [o, b] : merged) {
            w.key(o);
            w.number(static_cast<std::uint64_t>(b));
        }
    }
    w.end_object();
}

inline void write_site(json::writer& w, const allocation_site& s) {
    w.begin_object();
    w.field("owner", s.owner);
    w.field("rank", s.rank);
    w.field("device", s.device);
    w.field("stream", custody::detail::to_hex(reinterpret_cast<const void*>(s.stream)));
    w.field("synchronous", s.synchronous);
    w.field("sequence", s.sequence);
    w.field("time_ns", static_cast<std::int64_t>(s.time_ns));
    w.field("bytes", static_cast<std::uint64_t>(s.bytes));
    w.field("alignment", static_cast<std::uint64_t>(s.alignment));
    w.key("stack");
    w.begin_array();
    for (const auto& f : s.stack) w.string(f);
    w.end_array();
    w.end_object();
}

/// The report's "rank" member.
inline void write_rank(json::writer& w, const rank_report& r) {
    w.key("rank");
    w.begin_object();
    w.field("rank", r.rank.rank);
    w.field("local_rank", r.rank.local_rank);
    w.field("world_size", r.rank.world_size);
    w.field("source", r.rank.source);
    w.end_object();
}

/// The report's "totals" member.
inline void write_totals(json::writer& w, const rank_report& r) {
    w.key("totals");
    w.begin_object();
    w.field("live_bytes", static_cast<std::uint64_t>(r.totals.live_bytes));
    w.field("peak_live_bytes", static_cast<std::uint64_t>(r.totals.peak_live_bytes));
    w.field("reserved_bytes", static_cast<std::uint64_t>(r.totals.reserved_bytes));
    w.field("live_allocations", static_cast<std::uint64_t>(r.totals.live_allocations));
    w.field("allocations", r.totals.allocations);
    w.field("deallocations", r.totals.deallocations);
    w.end_object();
}

/// The report's "upstream" member: the upstream's usage, or null when it keeps no statistics.
inline void write_upstream(json::writer& w, const rank_report& r) {
    w.key("upstream");
    if (!r.upstream) {
        w.null();
        return;
    }
    const upstream_usage& u = *r.upstream;
    w.begin_object();
    w.field("resource", u.resource);
    w.field("live_bytes", static_cast<std::uint64_t>(u.live_bytes));
    w.field("peak_live_bytes", static_cast<std::uint64_t>(u.peak_live_bytes));
    w.field("reserved_bytes", static_cast<std::uint64_t>(u.reserved_bytes));
    w.field("peak_reserved_bytes", static_cast<std::uint64_t>(u.peak_reserved_bytes));
    w.key("largest_free_block");
    if (u.largest_free_block) w.number(static_cast<std::uint64_t>(*u.largest_free_block));
    else w.null();
    w.end_object();
}

/// The report's "owners" member.
inline void write_owners(json::writer& w, const rank_report& r) {
    w.key("owners");
    w.begin_array();
    for (const auto& o : r.owners) {
        w.begin_object();
        w.field("owner", o.owner);
        w.field("live_bytes", static_cast<std::uint64_t>(o.live_bytes));
        w.field("live_count", static_cast<std::uint64_t>(o.live_count));
        w.field("peak_bytes", static_cast<std::uint64_t>(o.peak_bytes));
        w.end_object();
    }
    w.end_array();
}

/// The report's "devices" member.
inline void write_devices(json::writer& w, const rank_report& r) {
    w.key("devices");
    w.begin_array();
    for (const auto& d : r.devices) {
        w.begin_object();
        w.field("device", d.device);
        w.field("live_bytes", static_cast<std::uint64_t>(d.live_bytes));
        w.field("live_count", static_cast<std::uint64_t>(d.live_count));
        w.end_object();
    }
    w.end_array();
}

/// The report's "live" member: the totals and the groups of live blocks.
inline void write_live(json::writer& w, const rank_report& r) {
    w.key("live");
    w.begin_object();
    w.field("total_bytes", static_cast<std::uint64_t>(r.live.total_bytes));
    w.field("total_count", static_cast<std::uint64_t>(r.live.total_count));
    w.key("groups");
    w.begin_array();
    for (const auto& g : r.live.groups) {
        w.begin_object();
        w.field("owner", g.owner);
        w.field("bytes", static_cast<std::uint64_t>(g.bytes));
        w.field("count", static_cast<std::uint64_t>(g.count));
        w.field("first_sequence", g.first_sequence);
        w.key("devices");
        w.begin_array();
        for (int d : g.devices) w.number(d);
        w.end_array();
        w.key("stack");
        w.begin_array();
        for (const auto& f : g.stack) w.string(f);
        w.end_array();
        w.end_object();
    }
    w.end_array();
    w.end_object();
}

/// The report's "violations" member.
inline void write_violations(json::writer& w, const rank_report& r) {
    w.key("violations");
    w.begin_array();
    for (const auto& v : r.violations) {
        w.begin_object();
        w.field("kind", to_string(v.kind));
        w.field("pointer", custody::detail::to_hex(v.pointer));
        w.field("tracker", v.tracker);
        w.field("other_tracker", v.other_tracker);
        w.field("detail", v.detail);
        w.key("allocated");
        if (v.has_allocated) write_site(w, v.allocated);
        else w.null();
        w.key("first_free");
        if (v.has_first_free) write_site(w, v.first_free);
        else w.null();
        w.key("freed");
        if (v.kind != violation_kind::leak) write_site(w, v.freed);
        else w.null();
        w.end_object();
    }
    w.end_array();
}

/// The report's "timeline" member.
inline void write_timeline(json::writer& w, const rank_report& r) {
    w.key("timeline");
    w.begin_array();
    for (const auto& s : r.timeline) {
        w.begin_object();
        w.field("unix_ns", static_cast<std::int64_t>(s.unix_ns));
        w.key("owners");
        write_sample_owners(w, s);
        w.end_object();
    }
    w.end_array();
}

} // namespace detail

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

namespace detail {

/// Typed field access for the reader: every failure is a report_error(malformed) naming the field.
class field_reader {
public:
    explicit field_reader(std::string file) : file_(std::move(file)) {}

    const json::value& member(const json::value& o, std::string_view key, std::string_view where) const {
        if (!o.is_object()) fail(std::string(where) + " is not an object");
        const json::value* v = o.find(key);
        if (v == nullptr) fail(std::string(where) + " has no '" + std::string(key) + "'");
        return *v;
    }
    /// The integer member `key` as T, within [least, most]: an integer written without fraction
    /// or exponent (the writer writes no other), exactly.
    template <class T>
    T integer(const json::value& o, std::string_view key, std::string_view where,
              T least = std::numeric_limits<T>::min(), T most = std::numeric_limits<T>::max()) const {
        return checked(member(o, key, where), std::string(where) + "." + std::string(key), least, most);
    }
    /// A count: an integer in [least, SIZE_MAX].
    std::size_t count(const json::value& o, std::string_view key, std::string_view where, std::size_t least = 0) const {
        return integer<std::size_t>(o, key, where, least);
    }
    /// `v`, named `field` in errors, as an integer T within [least, most].
    template <class T>
    T checked(const json::value& v, const std::string& field, T least = std::numeric_limits<T>::min(),
              T most = std::numeric_limits<T>::max()) const {
        if (const json::real* r = v.as_real()) {
            fail(field + " = " + json::excerpt(r->text) +
                 (r->integral ? " is out of range" : " is not an integer (it has a fraction or an exponent)"));
        }
        if (!v.is_integer()) fail(field + " is a JSON " + std::string(v.type_name()) + ", not an integer");
        const auto x = v.as_integer<T>();
        if (!x || *x < least || *x > most) {
            json::writer shown;
            shown.write(v);
            fail(field + " = " + shown.str() + " is outside " + std::to_string(least) + ".." + std::to_string(most));
        }
        return *x;
    }
    const std::string& string(const json::value& o, std::string_view key, std::string_view where) const {
        const json::value& v = member(o, key, where);
        if (!v.is_string()) fail(std::string(where) + "." + std::string(key) + " is not a string");
        return v.as_string();
    }
    const json::array& array(const json::value& o, std::string_view key, std::string_view where) const {
        const json::value& v = member(o, key, where);
        if (!v.is_array()) fail(std::string(where) + "." + std::string(key) + " is not an array");
        return v.as_array();
    }
    [[noreturn]] void fail(const std::string& what) const {
        throw report_error(report_error::reason::malformed, file_, what);
    }

private:
    std::string file_;
};

/// The whole content of the file at `path`; report_error(missing) naming the system's reason when
/// it cannot be opened or read (a directory opens, and fails to read with "Is a directory").
inline std::string read_file(const std::string& path) {
    struct closer {
        void operator()(std::FILE* f) const noexcept { std::fclose(f); }
    };
    errno = 0;
    const std::unique_ptr<std::FILE, closer> f(std::fopen(path.c_str(), "rb"));
    if (!f) {
        const int error = errno;
        throw report_error(report_error::reason::missing, path,
                           "cannot open it: " + std::generic_category().message(error));
    }
    std::string text;
    char buffer[1 << 16];
    for (;;) {
        const std::size_t n = std::fread(buffer, 1, sizeof buffer, f.get());
        text.append(buffer, n);
        if (n < sizeof buffer) break;
    }
    if (std::ferror(f.get()) != 0) {
        const int error = errno;
        throw report_error(report_error::reason::missing, path,
                           "cannot read it: " + std::generic_category().message(error));
    }
    return text;
}

/// Reads the report's "rank" member into r.rank; a rank not below the world size is malformed.
inline void read_rank(const field_reader& f, const json::value& doc, rank_report& r) {
    const json::value& rank = f.member(doc, "rank", "report");
    r.rank.rank = f.integer<int>(rank, "rank", "rank", 0);
    r.rank.local_rank = f.integer<int>(rank, "local_rank", "rank", 0);
    r.rank.world_size = f.integer<int>(rank, "world_size", "rank", 1);
    r.rank.source = f.string(rank, "source", "rank");
    if (r.rank.rank >= r.rank.world_size) {
        f.fail("rank.rank " + std::to_string(r.rank.rank) + " of " + std::to_string(r.rank.world_size) +
               " is impossible");
    }
}

/// Reads the report's "totals" member into r.totals.
inline void read_totals(const field_reader& f, const json::value& doc, rank_report& r) {
    const json::value& totals = f.member(doc, "totals", "report");
    r.totals.live_bytes = f.count(totals, "live_bytes", "totals");
    r.totals.peak_live_bytes = f.count(totals, "peak_live_bytes", "totals");
    r.totals.reserved_bytes = f.count(totals, "reserved_bytes", "totals");
    r.totals.live_allocations = f.count(totals, "live_allocations", "totals");
    r.totals.allocations = f.integer<std::uint64_t>(totals, "allocations", "totals");
    r.totals.deallocations = f.integer<std::uint64_t>(totals, "deallocations", "totals");
}

/// Reads the report's "upstream" member into r.upstream: absent (a report from before it existed)
/// or null is nothing; an object must hold every field.
inline void read_upstream(const field_reader& f, const json::value& doc, rank_report& r) {
    const json::value* v = doc.find("upstream");
    if (v == nullptr || v->is_null()) return;
    upstream_usage u;
    u.resource = f.string(*v, "resource", "upstream");
    u.live_bytes = f.count(*v, "live_bytes", "upstream");
    u.peak_live_bytes = f.count(*v, "peak_live_bytes", "upstream");
    u.reserved_bytes = f.count(*v, "reserved_bytes", "upstream");
    u.peak_reserved_bytes = f.count(*v, "peak_reserved_bytes", "upstream");
    if (const json::value& largest = f.member(*v, "largest_free_block", "upstream"); !largest.is_null()) {
        u.largest_free_block = f.checked<std::size_t>(largest, "upstream.largest_free_block");
    }
    r.upstream = std::move(u);
}

/// Reads the report's "live" member into r.live (after read_rank: it takes r.rank.rank).
inline void read_live(const field_reader& f, const json::value& doc, rank_report& r) {
    constexpr int int_max = std::numeric_limits<int>::max();
    const json::value& live = f.member(doc, "live", "report");
    r.live.rank = r.rank.rank;
    r.live.total_bytes = f.count(live, "total_bytes", "live");
    r.live.total_count = f.count(live, "total_count", "live");
    for (const json::value& g : f.array(live, "groups", "live")) {
        leak_group lg;
        lg.owner = f.string(g, "owner", "live.groups[]");
        lg.bytes = f.count(g, "bytes", "live.groups[]");
        lg.count = f.count(g, "count", "live.groups[]", 1);
        lg.first_sequence = f.integer<std::uint64_t>(g, "first_sequence", "live.groups[]", 1);
        for (const json::value& d : f.array(g, "devices", "live.groups[]")) {
            lg.devices.push_back(f.checked<int>(d, "live.groups[].devices[]", -1, int_max));
        }
        for (const json::value& s : f.array(g, "stack", "live.groups[]")) {
            if (!s.is_string()) f.fail("live.groups[].stack[] is not a string");
            lg.stack.push_back(s.as_string());
        }
        r.live.groups.push_back(std::move(lg));
    }
}

/// Reads the report's "violations" member: each kind, tracker and detail.
inline void read_violations(const field_reader& f, const json::value& doc, rank_report& r) {
    for (const json::value& v : f.array(doc, "violations", "report")) {
        violation x;
        const std::string& kind = f.string(v, "kind", "violations[]");
        bool known = false;
        for (int k = 0; k <= static_cast<int>(violation_kind::leak); ++k) {
            if (kind == to_string(static_cast<violation_kind>(k))) {
                x.kind = static_cast<violation_kind>(k);
                known = true;
            }
        }
        if (!known) f.fail("violations[].kind '" + json::excerpt(kind) + "' is unknown");
        x.tracker = f.string(v, "tracker", "violations[]");
        x.detail = f.string(v, "detail", "violations[]");
        r.violations.push_back(std::move(x));
    }
}

/// Reads the report's "timeline" member.
inline void read_timeline(const field_reader& f, const json::value& doc, rank_report& r) {
    for (const json::value& s : f.array(doc, "timeline", "report")) {
        timeline_sample t;
        t.unix_ns = f.integer<std::int64_t>(s, "unix_ns", "timeline[]");
        const json::value& owners = f.member(s, "owners", "timeline[]");
        if (!owners.is_object()) f.fail("timeline[].owners is not an object");
        for (const auto& [name, bytes] : owners.as_object()) {
            t.owners.emplace_back(name, f.checked<std::size_t>(bytes, "timeline[].owners['" + json::excerpt(name) + "']"));
        }
        r.timeline.push_back(std::move(t));
    }
}

} // namespace detail

/// Reads a report from JSON text. `file` only names it in errors. Reads what the merge tool needs:
/// rank, tracker, platform, times, totals, the upstream's usage (optional: reports written before
/// it existed have none), owners, devices, live groups, violation kinds and details, and the
/// timeline. Integers read exactly, each within its field's range (an int field
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
    for (const json::value& o : f.array(doc, "owners", "report")) {
        r.owners.push_back(owner_usage{f.string(o, "owner", "owners[]"), f.count(o, "live_bytes", "owners[]"),
                                       f.count(o, "live_count", "owners[]"), f.count(o, "peak_bytes", "owners[]")});
    }
    for (const json::value& d : f.array(doc, "devices", "report")) {
        r.devices.push_back(device_usage{f.integer<int>(d, "device", "devices[]", -1),
                                         f.count(d, "live_bytes", "devices[]"), f.count(d, "live_count", "devices[]")});
    }
    detail::read_live(f, doc, r);
    detail::read_violations(f, doc, r);
    detail::read_timeline(f, doc, r);
    return r;
}

/// Reads a report file. Throws report_error: missing (cannot open or read it, with the system's
/// reason), truncated, or malformed.
[[nodiscard]] inline rank_report read_rank_report(const std::string& path) {
    return parse_rank_report(detail::read_file(path), path);
}

} // namespace custody::debug
