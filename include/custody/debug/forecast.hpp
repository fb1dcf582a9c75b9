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
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace custody::debug {

/// One owner whose floor rises on at least one rank.
/// Invariants: ranks.size() == world size; first_out, when set, indexes a rank whose trend is rising.
struct owner_forecast {
    std::string owner;
    std::vector<std::optional<trend>> ranks; ///< [rank]: the owner's trend there, when reported
    std::optional<int> first_out;            ///< the rank whose time left is least (of those known)
    int rising_ranks = 0;                    ///< ranks where its floor rises

    /// The rank it rises on, when it rises on exactly one of several ranks (seed of an imbalance
    /// between GPUs: one rank leaks, the others do not).
    [[nodiscard]] std::optional<int> only_rank(int world_size) const {
        if (world_size < 2 || rising_ranks != 1) return std::nullopt;
        for (std::size_t r = 0; r < ranks.size(); ++r)
            if (ranks[r] && ranks[r]->rising) return static_cast<int>(r);
        return std::nullopt;
    }
};

namespace detail {

/// Time left to compare ranks by: seconds when every rank rising has them, else steps.
[[nodiscard]] inline std::optional<double> time_left(const trend& t, bool in_seconds) {
    return in_seconds ? t.seconds_left : t.steps_left;
}

} // namespace detail

/// The owners rising on some rank, from each rank's report (`by_rank[r]`: rank r's, or nullptr),
/// those that run out first first (owners without a time left last, by name).
[[nodiscard]] inline std::vector<owner_forecast> forecast_owners(const std::vector<const rank_report*>& by_rank) {
    std::set<std::string> rising;
    for (const rank_report* r : by_rank)
        if (r != nullptr)
            for (const trend& t : r->trends.owners)
                if (t.rising) rising.insert(t.owner);
    std::vector<owner_forecast> out;
    for (const std::string& owner : rising) {
        out.push_back(owner_forecast{owner, std::vector<std::optional<trend>>(by_rank.size()), {}, 0});
        owner_forecast& f = out.back();
        for (std::size_t rank = 0; rank < by_rank.size(); ++rank) {
            if (by_rank[rank] == nullptr) continue;
            for (const trend& t : by_rank[rank]->trends.owners)
                if (t.owner == f.owner) f.ranks[rank] = t;
        }
        bool seconds = true;
        for (const auto& t : f.ranks) {
            if (t && t->rising) {
                ++f.rising_ranks;
                seconds = seconds && t->seconds_left.has_value();
            }
        }
        double least = 0;
        for (std::size_t rank = 0; rank < f.ranks.size(); ++rank) {
            const auto& t = f.ranks[rank];
            const std::optional<double> left = t && t->rising ? detail::time_left(*t, seconds) : std::nullopt;
            if (left && (!f.first_out || *left < least)) {
                f.first_out = static_cast<int>(rank);
                least = *left;
            }
        }
    }
    const auto soonest = [](const owner_forecast& f) {
        if (!f.first_out) return std::optional<double>();
        const trend& t = *f.ranks[static_cast<std::size_t>(*f.first_out)];
        return t.seconds_left ? t.seconds_left : t.steps_left;
    };
    std::stable_sort(out.begin(), out.end(), [&](const owner_forecast& a, const owner_forecast& b) {
        const auto x = soonest(a);
        const auto y = soonest(b);
        if (x.has_value() != y.has_value()) return x.has_value();
        if (x && *x != *y) return *x < *y;
        return a.owner < b.owner;
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

/// A rank's cells of the forecast: rate per step, per second, and time left ("-" where unknown).
[[nodiscard]] inline std::string forecast_cell(const std::optional<trend>& t, int row) {
    char cell[64];
    if (!t || !t->rising) return "-";
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
            for (const auto& t : f.ranks) {
                std::snprintf(cell, sizeof cell, "%14s", detail::forecast_cell(t, row).c_str());
                out += cell;
            }
            if (row == 2 && f.first_out) out += "  << rank " + std::to_string(*f.first_out) + " runs out first";
            out += '\n';
        }
    }
    return out;
}

} // namespace custody::debug
