/// @file
/// Merges N per-rank reports into one cross-rank view: a table of live bytes per owner and rank
/// with the imbalance (max / mean over ranks), and a Chrome/Perfetto trace with one process per
/// rank and a counter track per owner. Used by tools/custody-merge.
#pragma once

#include <custody/debug/detail/json.hpp>
#include <custody/debug/json_report.hpp>
#include <custody/debug/report.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
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

/// Checks that `reports` are one job's reports and combines them. Throws report_error:
/// mismatched (no reports, world sizes or platforms differ, a rank twice) or missing (a rank of
/// the world has no report). `files[i]` names reports[i] in errors (may be empty).
[[nodiscard]] inline cross_rank_view merge_reports(const std::vector<rank_report>& reports,
                                                   const std::vector<std::string>& files = {}) {
    const auto name = [&](std::size_t i) { return i < files.size() ? files[i] : std::string(); };
    if (reports.empty()) throw report_error(report_error::reason::mismatched, "", "no reports to merge");
    cross_rank_view v;
    v.world_size = reports[0].rank.world_size;
    v.platform = reports[0].platform;
    std::vector<int> seen(static_cast<std::size_t>(v.world_size), -1);
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
        auto& slot = seen[static_cast<std::size_t>(r.rank.rank)];
        if (slot >= 0) {
            throw report_error(report_error::reason::mismatched, name(i),
                               "rank " + std::to_string(r.rank.rank) + " already came from '" +
                                   name(static_cast<std::size_t>(slot)) + "'");
        }
        slot = static_cast<int>(i);
        for (const auto& o : r.owners) owners.insert(o.owner);
    }
    for (int rank = 0; rank < v.world_size; ++rank) {
        if (seen[static_cast<std::size_t>(rank)] < 0) {
            throw report_error(report_error::reason::missing, "",
                               "no report for rank " + std::to_string(rank) + " of " + std::to_string(v.world_size));
        }
    }
    v.owners.assign(owners.begin(), owners.end());
    v.bytes.assign(v.owners.size(), std::vector<std::size_t>(static_cast<std::size_t>(v.world_size), 0));
    v.rank_totals.assign(static_cast<std::size_t>(v.world_size), 0);
    for (const rank_report& r : reports) {
        const auto rank = static_cast<std::size_t>(r.rank.rank);
        for (const auto& o : r.owners) {
            const auto at = static_cast<std::size_t>(
                std::lower_bound(v.owners.begin(), v.owners.end(), o.owner) - v.owners.begin());
            v.bytes[at][rank] += o.live_bytes;
            v.rank_totals[rank] += o.live_bytes;
        }
    }
    return v;
}

/// The table: one row per owner, one column per rank, then max, mean and max/mean; rows above
/// `threshold` are marked "<< imbalanced". A last row holds each rank's total.
[[nodiscard]] inline std::string format_table(const cross_rank_view& v, double threshold) {
    std::size_t width = 5;
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
    return out;
}

/// A Chrome/Perfetto trace (JSON object format): process rank+1 named "rank R", a counter track
/// per owner ("C" events named after the owner, value "live_bytes") at every timeline sample,
/// times in microseconds since the earliest rank started. Opens in ui.perfetto.dev.
[[nodiscard]] inline std::string to_perfetto_trace(const std::vector<rank_report>& reports) {
    std::int64_t origin = INT64_MAX;
    for (const auto& r : reports) origin = std::min(origin, r.started_unix_ns);
    json::writer w;
    w.begin_object();
    w.field("displayTimeUnit", "ms");
    w.key("traceEvents");
    w.begin_array();
    // A metadata event naming or ordering a rank's process: {"name": what, "ph": "M", ..., "args": {key: value}}.
    const auto metadata = [&w](const char* what, int pid, const char* key, const auto& value) {
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
    };
    for (const auto& r : reports) {
        const int pid = r.rank.rank + 1;
        metadata("process_name", pid, "name", "rank " + std::to_string(r.rank.rank));
        metadata("process_sort_index", pid, "sort_index", r.rank.rank);
        // Every owner the rank ever had gets a value at every sample (0 when absent), so each
        // counter track steps down to zero instead of holding its last value.
        std::set<std::string> owners;
        for (const auto& s : r.timeline)
            for (const auto& [o, b] : s.owners) owners.insert(o);
        for (const auto& s : r.timeline) {
            for (const auto& o : owners) {
                std::size_t bytes = 0;
                for (const auto& [so, b] : s.owners)
                    if (so == o) bytes = b;
                w.begin_object();
                w.field("name", o);
                w.field("ph", "C");
                w.field("pid", pid);
                w.field("tid", 0);
                w.field("ts", static_cast<double>(s.unix_ns - origin) / 1000.0);
                w.key("args");
                w.begin_object();
                w.field("live_bytes", static_cast<std::uint64_t>(bytes));
                w.end_object();
                w.end_object();
            }
        }
    }
    w.end_array();
    w.end_object();
    std::string text = w.take();
    text += '\n';
    return text;
}

} // namespace custody::debug
