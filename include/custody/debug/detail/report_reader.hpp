/// @file
/// Reading a rank report's JSON back: typed field access that names the field in each error, the
/// file's bytes, and one reader per member; json_report.hpp's parse_rank_report calls them in order.
#pragma once

#include <custody/core/rank.hpp>
#include <custody/debug/detail/json.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/report_error.hpp>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace custody::debug::detail {

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
    /// The number member `key` as a finite double, at least `least`; null gives nothing when
    /// `nullable`.
    std::optional<double> number(const json::value& o, std::string_view key, std::string_view where, double least,
                                 bool nullable = false) const {
        const json::value& v = member(o, key, where);
        if (nullable && v.is_null()) return std::nullopt;
        const std::string field = std::string(where) + "." + std::string(key);
        if (!v.is_number()) fail(field + " is a JSON " + std::string(v.type_name()) + ", not a number");
        const double x = v.as_number();
        if (!std::isfinite(x) || x < least) {
            json::writer shown;
            shown.write(v);
            fail(field + " = " + shown.str() + (std::isfinite(x) ? " is below " + std::to_string(least) : " is out of range"));
        }
        return x;
    }
    bool boolean(const json::value& o, std::string_view key, std::string_view where) const {
        const json::value& v = member(o, key, where);
        if (!v.is_bool()) fail(std::string(where) + "." + std::string(key) + " is not true or false");
        return v.as_bool();
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

/// Reads the report's "owners" member.
inline void read_owners(const field_reader& f, const json::value& doc, rank_report& r) {
    for (const json::value& o : f.array(doc, "owners", "report")) {
        r.owners.push_back(owner_usage{f.string(o, "owner", "owners[]"), f.count(o, "live_bytes", "owners[]"),
                                       f.count(o, "live_count", "owners[]"), f.count(o, "peak_bytes", "owners[]")});
    }
}

/// Reads the report's "devices" member.
inline void read_devices(const field_reader& f, const json::value& doc, rank_report& r) {
    for (const json::value& d : f.array(doc, "devices", "report")) {
        r.devices.push_back(device_usage{f.integer<int>(d, "device", "devices[]", -1),
                                         f.count(d, "live_bytes", "devices[]"), f.count(d, "live_count", "devices[]")});
    }
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

/// Reads one owner's or device's trend (`where` names it in errors).
inline trend read_trend(const field_reader& f, const json::value& v, std::string_view where) {
    constexpr int int_max = std::numeric_limits<int>::max();
    trend t;
    t.owner = f.string(v, "owner", where);
    t.device = f.integer<int>(v, "device", where, -1, int_max);
    t.samples = f.integer<std::uint64_t>(v, "samples", where);
    t.floor_bytes = f.count(v, "floor_bytes", where);
    t.rising = f.boolean(v, "rising", where);
    t.alarms = f.integer<std::uint64_t>(v, "alarms", where);
    t.bytes_per_step = *f.number(v, "bytes_per_step", where, -std::numeric_limits<double>::max());
    t.bytes_per_second = f.number(v, "bytes_per_second", where, -std::numeric_limits<double>::max(), true);
    t.confidence = *f.number(v, "confidence", where, 0);
    if (t.confidence > 1) f.fail(std::string(where) + ".confidence is above 1");
    t.rise_began = f.integer<std::uint64_t>(v, "rise_began", where);
    t.rise_began_unix_ns = f.integer<std::int64_t>(v, "rise_began_unix_ns", where);
    t.leaked_bytes = f.count(v, "leaked_bytes", where);
    t.steps_left = f.number(v, "steps_left", where, 0, true);
    t.seconds_left = f.number(v, "seconds_left", where, 0, true);
    return t;
}

/// Reads the report's "trends" member: absent (a report from before it existed) is none.
inline void read_trends(const field_reader& f, const json::value& doc, rank_report& r) {
    const json::value* v = doc.find("trends");
    if (v == nullptr) return;
    r.trends.samples = f.integer<std::uint64_t>(*v, "samples", "trends");
    if (const json::value& budget = f.member(*v, "budget_bytes", "trends"); !budget.is_null()) {
        r.trends.budget_bytes = f.checked<std::size_t>(budget, "trends.budget_bytes");
    }
    for (const json::value& t : f.array(*v, "owners", "trends")) r.trends.owners.push_back(read_trend(f, t, "trends.owners[]"));
    for (const json::value& t : f.array(*v, "devices", "trends")) {
        r.trends.devices.push_back(read_trend(f, t, "trends.devices[]"));
    }
}

} // namespace custody::debug::detail
