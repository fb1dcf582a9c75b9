/// @file
/// `timeline`: the tracking resource's live bytes per owner over time, one sample per snapshot and
/// per report, the most recent ones kept.
#pragma once

#include <custody/debug/detail/ledger.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/report.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::debug::detail {

/// Samples of the owners' live bytes. Invariant: size() <= kept; samples in the order taken.
/// Thread safety: none; the tracker's mutex guards it. Complexity: a sample is O(owners).
class timeline {
public:
    explicit timeline(std::size_t kept) : kept_(kept) {}

    /// Takes a sample at `time_ns` of every owner that has had live memory.
    void sample(std::int64_t time_ns, const std::unordered_map<owner_id, owner_totals>& owners) {
        point p;
        p.time_ns = time_ns;
        for (const auto& [id, o] : owners) {
            if (o.count != 0 || o.peak != 0) p.owners.emplace_back(id, o.bytes);
        }
        samples_.push_back(std::move(p));
        while (samples_.size() > kept_) samples_.pop_front();
    }

    /// The samples as a report holds them: Unix times (`start_unix_ns` is time 0), owners by name.
    [[nodiscard]] std::vector<timeline_sample> report(std::int64_t start_unix_ns) const {
        std::vector<timeline_sample> out;
        out.reserve(samples_.size());
        for (const point& p : samples_) {
            timeline_sample t;
            t.unix_ns = start_unix_ns + p.time_ns;
            for (const auto& [id, bytes] : p.owners) t.owners.emplace_back(std::string(owner_name(id)), bytes);
            std::sort(t.owners.begin(), t.owners.end());
            out.push_back(std::move(t));
        }
        return out;
    }

private:
    struct point {
        std::int64_t time_ns = 0;
        std::vector<std::pair<owner_id, std::size_t>> owners;
    };
    std::deque<point> samples_;
    std::size_t kept_;
};

} // namespace custody::debug::detail
