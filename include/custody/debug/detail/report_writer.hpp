/// @file
/// The members of a rank report's JSON, each written by one function; json_report.hpp's to_json
/// puts them together in the schema's order (docs/debug-report-schema.json).
#pragma once

#include <custody/core/detail/format.hpp>
#include <custody/debug/detail/json.hpp>
#include <custody/debug/report.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace custody::debug::detail {

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

/// A number that may be unknown: the value, or null.
inline void write_optional(json::writer& w, std::string_view key, const std::optional<double>& v) {
    w.key(key);
    if (v) w.number(*v);
    else w.null();
}

/// One owner's or device's trend.
inline void write_trend(json::writer& w, const trend& t) {
    w.begin_object();
    w.field("owner", t.owner);
    w.field("device", t.device);
    w.field("samples", t.samples);
    w.field("floor_bytes", static_cast<std::uint64_t>(t.floor_bytes));
    w.field("rising", t.rising);
    w.field("alarms", t.alarms);
    w.field("bytes_per_step", t.bytes_per_step);
    write_optional(w, "bytes_per_second", t.bytes_per_second);
    w.field("confidence", t.confidence);
    w.field("rise_began", t.rise_began);
    w.field("rise_began_unix_ns", static_cast<std::int64_t>(t.rise_began_unix_ns));
    w.field("leaked_bytes", static_cast<std::uint64_t>(t.leaked_bytes));
    write_optional(w, "steps_left", t.steps_left);
    write_optional(w, "seconds_left", t.seconds_left);
    w.end_object();
}

/// The report's "trends" member: the samples, the budget (null when unknown), and the trend of
/// every owner and device.
inline void write_trends(json::writer& w, const rank_report& r) {
    w.key("trends");
    w.begin_object();
    w.field("samples", r.trends.samples);
    w.key("budget_bytes");
    if (r.trends.budget_bytes) w.number(static_cast<std::uint64_t>(*r.trends.budget_bytes));
    else w.null();
    for (const auto& [name, list] : {std::pair{"owners", &r.trends.owners}, std::pair{"devices", &r.trends.devices}}) {
        w.key(name);
        w.begin_array();
        for (const trend& t : *list) write_trend(w, t);
        w.end_array();
    }
    w.end_object();
}

} // namespace custody::debug::detail
