/// @file
/// Merges N per-rank reports into one cross-rank view: a table of live bytes per owner and rank
/// with the imbalance (max / mean over ranks), the forecast of the owners whose floor rises
/// (forecast.hpp), the largest live groups' call stacks, and a Chrome/Perfetto trace with one
/// process per rank and a counter track per owner. Used by tools/custody-merge.
#pragma once

#include <custody/debug/detail/json.hpp>
#include <custody/debug/forecast.hpp>
#include <custody/debug/json_report.hpp>
#include <custody/debug/report.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::debug {

/// Live bytes per owner and rank. Invariant: bytes[o].size() == world_size for every owner o;
/// ranks without the owner hold 0.
struct cross_rank_view {
    int world_size = 0;
    std::string platform;
    std::vector<std::string> owners;               ///< sorted
    std::vector<std::vector<std::size_t>> bytes;   ///< [owner][rank]
    std::vector<std::size_t> rank_totals;          ///< [rank]: live bytes of the rank
    std::vector<std::optional<upstream_usage>> upstream; ///< [rank]: the rank's upstream (pool), when reported
    std::vector<owner_forecast> forecasts;         ///< the owners whose floor rises on some rank (forecast.hpp)

    [[nodiscard]] std::size_t max_of(std::size_t owner) const {
        return *std::max_element(bytes[owner].begin(), bytes[owner].end());
    }
    [[nodiscard]] double mean_of(std::size_t owner) const {
        double sum = 0;
        for (std::size_t b : bytes[owner]) sum += static_cast<double>(b);
        return sum / static_cast<double>(world_size);
    }
    /// max / mean over ranks; 1 when the owner holds nothing anywhere.
    [[nodiscard]] double imbalance_of(std::size_t owner) const {
        const double mean = mean_of(owner);
        return mean == 0 ? 1.0 : static_cast<double>(max_of(owner)) / mean;
    }
    /// The owners whose imbalance is above `threshold`, most imbalanced first.
    [[nodiscard]] std::vector<std::string> imbalanced(double threshold) const {
        std::vector<std::pair<double, std::string>> found;
        for (std::size_t o = 0; o < owners.size(); ++o)
            if (imbalance_of(o) > threshold) found.emplace_back(imbalance_of(o), owners[o]);
        std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
            return a.first != b.first ? a.first > b.first : a.second < b.second;
        });
        std::vector<std::string> names;
        for (auto& [i, n] : found) names.push_back(std::move(n));
        return names;
    }
};

namespace detail {

/// The ranks in 0..world_size-1 that no report holds, for an error message: "rank 3", or
/// "ranks 0-4 and 6-9" (a run of ranks as first-last), at most the first eight runs, then "...".
/// `present`: the ranks that have a report, sorted, distinct, each within the world.
/// Complexity: O(present.size()), whatever the world size.
inline std::string describe_missing(const std::vector<int>& present, int world_size) {
    std::vector<std::pair<int, int>> runs; // [first, last] of missing ranks
    bool more = false;
    const auto gap = [&](std::int64_t first, std::int64_t last) {
        if (first > last) return;
        if (runs.size() == 8) {
            more = true;
            return;
        }
        runs.emplace_back(static_cast<int>(first), static_cast<int>(last));
    };
    std::int64_t next = 0; // the lowest rank not yet accounted for
    for (const int rank : present) {
        gap(next, std::int64_t{rank} - 1);
        next = std::int64_t{rank} + 1;
    }
    gap(next, std::int64_t{world_size} - 1);
    if (runs.size() == 1 && runs[0].first == runs[0].second && !more) return "rank " + std::to_string(runs[0].first);
    std::string s = "ranks ";
    for (std::size_t i = 0; i < runs.size(); ++i) {
        if (i > 0) s += (i + 1 == runs.size() && !more) ? " and " : ", ";
        s += std::to_string(runs[i].first);
        if (runs[i].second != runs[i].first) s += "-" + std::to_string(runs[i].second);
    }
    if (more) s += ", ...";
    return s;
}

} // namespace detail

/// Checks that `reports` are one job's reports and combines them. Throws report_error:
/// mismatched (no reports, world sizes or platforms differ, a rank outside the world or twice) or
/// missing (ranks of the world without a report, named). `files[i]` names reports[i] in errors
/// (may be empty). Complexity: O(n log n) in the reports and their owners before any check
/// passes, and memory for the view only once every rank of the world has its report, so a report
/// that claims a huge world costs nothing per rank it claims.
[[nodiscard]] inline cross_rank_view merge_reports(const std::vector<rank_report>& reports,
                                                   const std::vector<std::string>& files = {}) {
    const auto name = [&](std::size_t i) { return i < files.size() ? files[i] : std::string(); };
    if (reports.empty()) throw report_error(report_error::reason::mismatched, "", "no reports to merge");
    cross_rank_view v;
    v.world_size = reports[0].rank.world_size;
    v.platform = reports[0].platform;
    std::vector<std::pair<int, std::size_t>> ranks; // (rank, index in reports), sorted below
    ranks.reserve(reports.size());
    std::set<std::string> owners;
    for (std::size_t i = 0; i < reports.size(); ++i) {
        const rank_report& r = reports[i];
        if (r.rank.world_size != v.world_size) {
            throw report_error(report_error::reason::mismatched, name(i),
                               "world size " + std::to_string(r.rank.world_size) + " differs from " +
                                   std::to_string(v.world_size) + " in '" + name(0) + "'");
        }
        if (r.platform != v.platform) {
            throw report_error(report_error::reason::mismatched, name(i),
                               "platform '" + r.platform + "' differs from '" + v.platform + "'");
        }
        if (r.rank.rank < 0 || r.rank.rank >= v.world_size) {
            throw report_error(report_error::reason::mismatched, name(i),
                               "rank " + std::to_string(r.rank.rank) + " is outside a world of " +
                                   std::to_string(v.world_size));
        }
        ranks.emplace_back(r.rank.rank, i);
        for (const auto& o : r.owners) owners.insert(o.owner);
    }
    std::sort(ranks.begin(), ranks.end());
    std::vector<int> present;
    present.reserve(ranks.size());
    for (std::size_t k = 0; k < ranks.size(); ++k) {
        if (k > 0 && ranks[k].first == ranks[k - 1].first) {
            throw report_error(report_error::reason::mismatched, name(ranks[k].second),
                               "rank " + std::to_string(ranks[k].first) + " already came from '" +
                                   name(ranks[k - 1].second) + "'");
        }
        present.push_back(ranks[k].first);
    }
    if (present.size() != static_cast<std::size_t>(v.world_size)) {
        const std::int64_t missing = std::int64_t{v.world_size} - static_cast<std::int64_t>(present.size());
        std::string what = "no report for " + detail::describe_missing(present, v.world_size) + " of " +
                           std::to_string(v.world_size);
        if (missing > 1) what += " (" + std::to_string(missing) + " missing)";
        throw report_error(report_error::reason::missing, "", what);
    }
    // Every rank of the world has exactly one report: the view's size is bounded by the input.
    v.owners.assign(owners.begin(), owners.end());
    v.bytes.assign(v.owners.size(), std::vector<std::size_t>(static_cast<std::size_t>(v.world_size), 0));
    v.rank_totals.assign(static_cast<std::size_t>(v.world_size), 0);
    v.upstream.assign(static_cast<std::size_t>(v.world_size), std::nullopt);
    std::vector<const rank_report*> by_rank(static_cast<std::size_t>(v.world_size), nullptr);
    for (const rank_report& r : reports) {
        const auto rank = static_cast<std::size_t>(r.rank.rank);
        by_rank[rank] = &r;
        v.upstream[rank] = r.upstream;
        for (const auto& o : r.owners) {
            const auto at = static_cast<std::size_t>(
                std::lower_bound(v.owners.begin(), v.owners.end(), o.owner) - v.owners.begin());
            detail::add_saturating(v.bytes[at][rank], o.live_bytes);
            detail::add_saturating(v.rank_totals[rank], o.live_bytes);
        }
    }
    v.forecasts = forecast_owners(by_rank);
    return v;
}

namespace detail {

/// The rows of the ranks' upstreams (pools), under the owners' table, in its columns: reserved
/// and live bytes, peak reserved / peak live, the largest free block ("-" where a rank did not
/// report it); "" when no rank reported its upstream.
inline std::string format_upstream_rows(const cross_rank_view& v, std::size_t width) {
    const auto reported = [](const std::optional<upstream_usage>& u) { return u.has_value(); };
    if (std::none_of(v.upstream.begin(), v.upstream.end(), reported)) return {};
    std::set<std::string> names;
    for (const auto& u : v.upstream)
        if (u && !u->resource.empty()) names.insert(u->resource);
    std::string title = "upstream";
    for (const auto& n : names) title += (title.size() == 8 ? " (" : ", ") + n;
    if (!names.empty()) title += ")";
    std::string out = "\n" + title + "\n";
    char cell[64];
    const auto row = [&](const char* label, const auto& value_of) {
        const std::string text = "  " + std::string(label); // under the owners, padded as they are
        out += text + std::string(width + 2 > text.size() ? width + 2 - text.size() : 1, ' ');
        for (const auto& u : v.upstream) {
            value_of(u, cell);
            out += cell;
        }
        out += '\n';
    };
    const auto bytes = [](std::size_t upstream_usage::*field) {
        return [field](const std::optional<upstream_usage>& u, char* cell) {
            if (u) std::snprintf(cell, 64, "%14zu", (*u).*field);
            else std::snprintf(cell, 64, "%14s", "-");
        };
    };
    row("reserved", bytes(&upstream_usage::reserved_bytes));
    row("live", bytes(&upstream_usage::live_bytes));
    row("peak reserved/live", [](const std::optional<upstream_usage>& u, char* cell) {
        if (u && u->peak_live_bytes != 0) std::snprintf(cell, 64, "%14.2f", u->fragmentation());
        else std::snprintf(cell, 64, "%14s", "-");
    });
    row("largest free block", [](const std::optional<upstream_usage>& u, char* cell) {
        if (u && u->largest_free_block) std::snprintf(cell, 64, "%14zu", *u->largest_free_block);
        else std::snprintf(cell, 64, "%14s", "-");
    });
    return out;
}

} // namespace detail

/// The table: one row per owner, one column per rank, then max, mean and max/mean; rows above
/// `threshold` are marked "<< imbalanced". A last row holds each rank's total. Below it, when the
/// reports carry their upstream's usage, a row each for its reserved and live bytes, peak reserved
/// over peak live, and the largest free block, per rank (a bloated pool shows there); then the
/// forecast of the owners whose floor rises (format_forecast).
[[nodiscard]] inline std::string format_table(const cross_rank_view& v, double threshold) {
    const bool with_upstream =
        std::any_of(v.upstream.begin(), v.upstream.end(), [](const auto& u) { return u.has_value(); });
    std::size_t width = with_upstream ? 20 : 5; // "  largest free block" or "owner"
    for (const auto& o : v.owners) width = std::max(width, o.size());
    std::string out;
    char cell[64];
    const auto pad = [&](const std::string& s) { out += s + std::string(width - s.size() + 2, ' '); };
    pad("owner");
    for (int r = 0; r < v.world_size; ++r) {
        std::snprintf(cell, sizeof cell, "%14s", ("rank " + std::to_string(r)).c_str());
        out += cell;
    }
    out += "            max           mean  max/mean\n";
    for (std::size_t o = 0; o < v.owners.size(); ++o) {
        pad(v.owners[o]);
        for (int r = 0; r < v.world_size; ++r) {
            std::snprintf(cell, sizeof cell, "%14zu", v.bytes[o][static_cast<std::size_t>(r)]);
            out += cell;
        }
        std::snprintf(cell, sizeof cell, " %14zu %14.1f %9.2f", v.max_of(o), v.mean_of(o), v.imbalance_of(o));
        out += cell;
        if (v.imbalance_of(o) > threshold) out += "  << imbalanced";
        out += '\n';
    }
    pad("total");
    for (int r = 0; r < v.world_size; ++r) {
        std::snprintf(cell, sizeof cell, "%14zu", v.rank_totals[static_cast<std::size_t>(r)]);
        out += cell;
    }
    out += '\n';
    return out + detail::format_upstream_rows(v, width) + format_forecast(v.forecasts, v.world_size, width);
}

namespace detail {

/// Whether group `g` of a rank is among the `n` whose stacks format_stacks prints: the first `n`
/// groups (largest first) that have a call stack. `shown` counts those met so far.
[[nodiscard]] inline bool stack_printed(const leak_group& g, std::size_t n, std::size_t& shown) noexcept {
    if (shown == n || g.stack.empty()) return false;
    ++shown;
    return true;
}

} // namespace detail

/// The `n` largest live groups of each rank that have a call stack, each with its frames, and a
/// line for the groups left out ("rank 1: and 4 more groups (123 B)"), so the bytes of every live
/// group are accounted for; "" when no group has a stack.
[[nodiscard]] inline std::string format_stacks(const std::vector<rank_report>& reports, std::size_t n) {
    std::string out;
    bool any = false; // a stack printed: without one anywhere, there is no such section
    for (const auto& r : reports) {
        std::size_t shown = 0;
        std::size_t rest = 0;
        std::size_t rest_bytes = 0;
        const std::string rank = "rank " + std::to_string(r.rank.rank) + ": ";
        for (const auto& g : r.live.groups) { // largest first
            if (!detail::stack_printed(g, n, shown)) {
                ++rest;
                detail::add_saturating(rest_bytes, g.bytes);
                continue;
            }
            out += rank + std::to_string(g.bytes) + " B in " + std::to_string(g.count) + " allocations from '" +
                   g.owner + "'\n";
            for (const auto& f : g.stack) out += "      at " + f + "\n";
        }
        any = any || shown != 0;
        if (rest != 0) {
            out += rank + (shown != 0 ? "and " : "") + std::to_string(rest) + (shown != 0 ? " more group" : " group") +
                   (rest == 1 ? "" : "s") + " (" + std::to_string(rest_bytes) + " B)" +
                   (shown < n ? " without a call stack" : "") + "\n";
        }
    }
    return any ? "\nlargest live groups by call stack:\n" + out : std::string();
}

namespace detail {

/// Microseconds from `origin` to `t` (origin <= t), without overflow: the difference of any two
/// int64 values fits uint64.
[[nodiscard]] inline double microseconds_between(std::int64_t origin, std::int64_t t) noexcept {
    return static_cast<double>(static_cast<std::uint64_t>(t) - static_cast<std::uint64_t>(origin)) / 1000.0;
}

/// The origin of a Perfetto trace: the earliest start or sample of `reports` (INT64_MAX for none).
[[nodiscard]] inline std::int64_t perfetto_origin(const std::vector<rank_report>& reports) noexcept {
    std::int64_t origin = INT64_MAX;
    for (const auto& r : reports) {
        origin = std::min(origin, r.started_unix_ns);
        for (const auto& s : r.timeline) origin = std::min(origin, s.unix_ns);
    }
    return origin;
}

/// A metadata event naming or ordering a rank's process: {"name": what, "ph": "M", ..., "args": {key: value}}.
template <class Value>
void perfetto_metadata(json::writer& w, const char* what, std::int64_t pid, const char* key, const Value& value) {
    w.begin_object();
    w.field("name", what);
    w.field("ph", "M");
    w.field("pid", pid);
    w.field("tid", 0);
    w.key("args");
    w.begin_object();
    w.field(key, value);
    w.end_object();
    w.end_object();
}

/// A counter event: `owner`'s track of process `pid` holds `bytes` from `ts` (microseconds).
inline void perfetto_counter(json::writer& w, std::string_view owner, std::int64_t pid, double ts, std::size_t bytes) {
    w.begin_object();
    w.field("name", owner);
    w.field("ph", "C");
    w.field("pid", pid);
    w.field("tid", 0);
    w.field("ts", ts);
    w.key("args");
    w.begin_object();
    w.field("live_bytes", static_cast<std::uint64_t>(bytes));
    w.end_object();
    w.end_object();
}

/// The counter events of one rank's timeline: a value for each owner a sample holds, and one 0 at
/// the first sample after one that held an owner now gone.
inline void write_perfetto_counters(json::writer& w, const rank_report& r, std::int64_t pid, std::int64_t origin) {
    // Owner names of this rank as small numbers; written[id] = k + 1 once sample k gave the
    // owner an event.
    std::unordered_map<std::string_view, std::size_t> ids;
    std::vector<std::string_view> names;  // [id]
    std::vector<std::size_t> written;     // [id]
    std::vector<std::size_t> before; // the ids the previous sample held
    std::vector<std::size_t> now;
    for (std::size_t k = 0; k < r.timeline.size(); ++k) {
        const timeline_sample& s = r.timeline[k];
        const double ts = microseconds_between(origin, s.unix_ns);
        now.clear();
        for (const auto& [o, bytes] : s.owners) {
            const auto [it, added] = ids.try_emplace(o, names.size());
            if (added) {
                names.push_back(o);
                written.push_back(0);
            }
            written[it->second] = k + 1;
            now.push_back(it->second);
            perfetto_counter(w, o, pid, ts, bytes);
        }
        for (const std::size_t id : before) {
            if (written[id] != k + 1) {
                perfetto_counter(w, names[id], pid, ts, 0);
                written[id] = k + 1; // one 0, even if the previous sample named it twice
            }
        }
        std::swap(before, now);
    }
}

} // namespace detail

/// A Chrome/Perfetto trace (JSON object format): process rank+1 named "rank R", a counter track
/// per owner ("C" events named after the owner, value "live_bytes"), times in microseconds since
/// the earliest start (or sample, should one come before it). A track gets a value at each sample
/// that holds its owner, and 0 at the first sample after one that held it when the owner is gone,
/// so it steps down to zero instead of holding its last value (a counter track keeps its value
/// until the next event). Opens in ui.perfetto.dev.
/// Complexity: O(n) in the timelines' entries (expected, hashing owner names); at most two events
/// per entry.
[[nodiscard]] inline std::string to_perfetto_trace(const std::vector<rank_report>& reports) {
    const std::int64_t origin = detail::perfetto_origin(reports);
    detail::json::writer w;
    w.begin_object();
    w.field("displayTimeUnit", "ms");
    w.key("traceEvents");
    w.begin_array();
    for (const auto& r : reports) {
        const std::int64_t pid = std::int64_t{r.rank.rank} + 1;
        detail::perfetto_metadata(w, "process_name", pid, "name", "rank " + std::to_string(r.rank.rank));
        detail::perfetto_metadata(w, "process_sort_index", pid, "sort_index", r.rank.rank);
        detail::write_perfetto_counters(w, r, pid, origin);
    }
    w.end_array();
    w.end_object();
    std::string text = w.take();
    text += '\n';
    return text;
}

} // namespace custody::debug
