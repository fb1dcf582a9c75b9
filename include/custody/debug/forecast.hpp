/// @file
/// The cross-rank forecast of slow leaks: for each owner whose floor rises on some rank, each
/// rank's trend (rate, time left), the rank that runs out first, and whether it grows on one rank
/// only; and the forecast as the text custody-merge prints. Used by merge.hpp.
#pragma once

#include <custody/debug/report.hpp>
#include <custody/debug/trend.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace custody::debug {

/// One owner whose floor rises on at least one rank.
/// Invariants: `rising` is sorted by rank, one entry per rank, each trend rising; first_out, when
/// set, is one of those ranks.
struct owner_forecast {
    std::string owner;
    std::vector<std::pair<int, trend>> rising; ///< (rank, the owner's trend there) where it rises
    std::optional<int> first_out;              ///< the rank whose time left is least (of those known)

    /// The owner's trend on `rank` when it rises there, else nullptr.
    [[nodiscard]] const trend* at(int rank) const noexcept {
        const auto it = std::lower_bound(rising.begin(), rising.end(), rank,
                                         [](const std::pair<int, trend>& e, int r) { return e.first < r; });
        return it != rising.end() && it->first == rank ? &it->second : nullptr;
    }
    /// The rank it rises on, when it rises on exactly one of several ranks (one GPU leaks, the
    /// others do not).
    [[nodiscard]] std::optional<int> only_rank(int world_size) const {
        if (world_size < 2 || rising.size() != 1) return std::nullopt;
        return rising.front().first;
    }
};

/// The owners rising on some rank, from each rank's report (`by_rank[r]`: rank r's, or nullptr),
/// those that run out first first (owners without a time left last, by name). The time left is
/// compared in seconds when every rank it rises on has them, else in steps.
/// Complexity: O(T log T) in the reports' trends; memory for the rising ones only.
[[nodiscard]] inline std::vector<owner_forecast> forecast_owners(const std::vector<const rank_report*>& by_rank) {
    std::map<std::string, owner_forecast> found;
    for (std::size_t rank = 0; rank < by_rank.size(); ++rank) {
        if (by_rank[rank] == nullptr) continue;
        for (const trend& t : by_rank[rank]->trends.owners) {
            if (!t.rising) continue;
            owner_forecast& f = found[t.owner];
            if (!f.rising.empty() && f.rising.back().first == static_cast<int>(rank)) continue; // a name twice
            f.rising.emplace_back(static_cast<int>(rank), t);
        }
    }
    std::vector<owner_forecast> out;
    out.reserve(found.size());
    for (auto& [owner, f] : found) {
        f.owner = owner;
        const bool seconds = std::all_of(f.rising.begin(), f.rising.end(),
                                         [](const auto& e) { return e.second.seconds_left.has_value(); });
        std::optional<double> least;
        for (const auto& [rank, t] : f.rising) {
            const std::optional<double> left = seconds ? t.seconds_left : t.steps_left;
            if (left && (!least || *left < *least)) {
                least = left;
                f.first_out = rank;
            }
        }
        out.push_back(std::move(f));
    }
    const auto soonest = [](const owner_forecast& f) {
        if (!f.first_out) return std::optional<double>();
        const trend& t = *f.at(*f.first_out);
        return t.seconds_left ? t.seconds_left : t.steps_left;
    };
    std::stable_sort(out.begin(), out.end(), [&](const owner_forecast& a, const owner_forecast& b) {
        const auto x = soonest(a);
        const auto y = soonest(b);
        if (x.has_value() != y.has_value()) return x.has_value();
        return x && *x < *y;
    });
    return out;
}

namespace detail {

/// "12 s", "41 min", "2.3 h", "3.5 days".
[[nodiscard]] inline std::string duration_text(double seconds) {
    char text[32];
    if (seconds < 120) std::snprintf(text, sizeof text, "%.0f s", seconds);
    else if (seconds < 7200) std::snprintf(text, sizeof text, "%.0f min", seconds / 60);
    else if (seconds < 172800) std::snprintf(text, sizeof text, "%.1f h", seconds / 3600);
    else std::snprintf(text, sizeof text, "%.1f days", seconds / 86400);
    return text;
}

/// A rank's cells of the forecast: rate per step, per second, and time left ("-" where unknown or
/// not rising).
[[nodiscard]] inline std::string forecast_cell(const trend* t, int row) {
    char cell[64];
    if (t == nullptr || !t->rising) return "-";
    if (row == 0) std::snprintf(cell, sizeof cell, "%.1f", t->bytes_per_step);
    else if (row == 1) {
        if (!t->bytes_per_second) return "-";
        std::snprintf(cell, sizeof cell, "%.1f", *t->bytes_per_second);
    } else if (t->seconds_left) {
        return duration_text(*t->seconds_left);
    } else if (t->steps_left) {
        const double n = *t->steps_left;
        if (n < 1e5) std::snprintf(cell, sizeof cell, "%.0f steps", n);
        else if (n < 1e8) std::snprintf(cell, sizeof cell, "%.1fM steps", n / 1e6);
        else std::snprintf(cell, sizeof cell, "%.2g steps", n);
    } else {
        return "-";
    }
    return cell;
}

} // namespace detail

/// The forecast as text, in the columns of format_table (`width`: its first column's): per owner,
/// rows of bytes per step, bytes per second and time left per rank, the rank that runs out first
/// marked, and an owner that grows on one rank only flagged; "" when no owner rises anywhere.
[[nodiscard]] inline std::string format_forecast(const std::vector<owner_forecast>& forecasts, int world_size,
                                                 std::size_t width) {
    if (forecasts.empty()) return {};
    std::string out = "\nslow leaks forecast (owners whose floor rises; a step is one trend sample):\n";
    char cell[64];
    const char* labels[] = {"  bytes/step", "  bytes/s", "  time left"};
    for (const owner_forecast& f : forecasts) {
        out += f.owner;
        if (const auto only = f.only_rank(world_size)) out += "  << grows on rank " + std::to_string(*only) + " only";
        out += '\n';
        for (int row = 0; row < 3; ++row) {
            const std::string label = labels[row];
            out += label + std::string(width + 2 > label.size() ? width + 2 - label.size() : 1, ' ');
            for (int rank = 0; rank < world_size; ++rank) {
                std::snprintf(cell, sizeof cell, "%14s", detail::forecast_cell(f.at(rank), row).c_str());
                out += cell;
            }
            if (row == 2 && f.first_out) out += "  << rank " + std::to_string(*f.first_out) + " runs out first";
            out += '\n';
        }
    }
    return out;
}

} // namespace custody::debug
