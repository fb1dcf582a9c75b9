/// @file
/// `trend_set`: the floor tests of a tracker's owners and devices, when it samples them, the
/// device's budget that the time left counts down to, and the trends as a report holds them.
#pragma once

#include <custody/debug/detail/floor_trend.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/trend.hpp>
#include <custody/platform/platform.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::debug::detail {

/// The budget a tracker's time left counts down to: trend_options::budget_bytes, else the device's
/// capacity (the upstream's device_capacity(), else Platform::memory_info of `device`) less the
/// headroom (as configured, else an eighth of the device, at most 1 GiB); nothing when unknown.
template <class Platform, class Upstream>
[[nodiscard]] std::optional<std::size_t> trend_budget(const trend_options& o, const Upstream& upstream, int device) {
    if (o.budget_bytes != 0) return o.budget_bytes;
    std::size_t capacity = 0;
    if constexpr (requires { upstream.device_capacity(); }) {
        capacity = upstream.device_capacity();
    } else if (device >= 0) {
        if (const std::optional<device_memory> m = Platform::memory_info(device)) capacity = m->total;
    }
    if (capacity == 0) return std::nullopt;
    const std::size_t headroom =
        o.headroom_bytes != SIZE_MAX ? o.headroom_bytes : std::min(std::size_t{1} << 30, capacity / 8);
    return capacity > headroom ? capacity - headroom : 0;
}

/// A trend that raised its alarm at a sample: its owner (or nullptr and its device) and estimate.
struct raised_trend {
    owner_id owner = nullptr;
    bool of_device = false;
    int device = -1;
    trend estimate;
};

/// The floor tests of one tracker: one per owner and one per device that ever held memory.
/// Invariant: every test has the same options; samples_ counts the samples taken.
/// Thread safety: none (the tracker's lock). Complexity: a sample is O(owners + devices) tests
/// (see floor_trend); due() is O(1).
class trend_set {
public:
    trend_set(const trend_options& o, std::optional<std::size_t> budget)
        : automatic_(o.every_allocations != 0 || o.every_ns > 0), options_(o), budget_(budget) {}

    /// Whether an allocation at `now_ns` (the tracker's clock) makes a sample due. O(1); one
    /// branch when the tracker samples only when asked.
    [[nodiscard]] bool due(std::int64_t now_ns) noexcept {
        if (!automatic_) [[likely]]
            return false;
        bool due = false;
        if (options_.every_allocations != 0 && ++allocations_ >= options_.every_allocations) due = true;
        if (options_.every_ns > 0 && now_ns - last_ns_ >= options_.every_ns) due = true;
        return due;
    }

    /// Takes a sample at `now_ns` of every owner and device of `ledger` (its extremes since the
    /// previous sample; see ledger::take_extremes) and appends those whose alarm it raised
    /// (`start_unix_ns`: the tracker's time 0).
    template <class Ledger>
    void sample(Ledger& ledger, std::int64_t now_ns, std::int64_t start_unix_ns, std::vector<raised_trend>& raised) {
        const std::size_t first = raised.size();
        allocations_ = 0;
        last_ns_ = now_ns;
        ++samples_;
        ledger.take_extremes(
            [&](owner_id id, std::size_t low, std::size_t high) {
                floor_trend& t = owners_.try_emplace(id, options_).first->second;
                if (t.add(floor_sample{low, high, now_ns})) raised.push_back({id, false, -1, t.estimate()});
            },
            [&](int device, std::size_t low, std::size_t high) {
                auto it = devices_.find(device);
                if (it == devices_.end()) {
                    if (high == 0) return; // a device that never held memory
                    it = devices_.try_emplace(device, options_).first;
                }
                if (it->second.add(floor_sample{low, high, now_ns})) {
                    raised.push_back({nullptr, true, device, it->second.estimate()});
                }
            });
        for (std::size_t i = first; i < raised.size(); ++i) {
            raised[i].estimate.owner = raised[i].of_device ? std::string() : std::string(owner_name(raised[i].owner));
            raised[i].estimate.device = raised[i].device;
            finish(raised[i].estimate, start_unix_ns);
        }
    }

    [[nodiscard]] std::uint64_t samples() const noexcept { return samples_; }
    [[nodiscard]] std::optional<std::size_t> budget() const noexcept { return budget_; }

    /// Every owner's trend (sorted by name), or every device's (by device), for a report:
    /// `start_unix_ns` is the tracker's time 0.
    [[nodiscard]] std::vector<trend> owners(std::int64_t start_unix_ns) const {
        std::vector<trend> out;
        out.reserve(owners_.size());
        for (const auto& [id, t] : owners_) {
            out.push_back(t.estimate());
            out.back().owner = std::string(owner_name(id));
            finish(out.back(), start_unix_ns);
        }
        std::sort(out.begin(), out.end(), [](const trend& a, const trend& b) { return a.owner < b.owner; });
        return out;
    }
    [[nodiscard]] std::vector<trend> devices(std::int64_t start_unix_ns) const {
        std::vector<trend> out;
        for (const auto& [device, t] : devices_) {
            out.push_back(t.estimate());
            out.back().device = device;
            finish(out.back(), start_unix_ns);
        }
        return out;
    }

    /// The trend of one owner or device now (empty when it was never sampled).
    [[nodiscard]] std::optional<trend> of_owner(owner_id id, std::int64_t start_unix_ns) const {
        const auto it = owners_.find(id);
        if (it == owners_.end()) return std::nullopt;
        trend t = it->second.estimate();
        t.owner = std::string(owner_name(id));
        finish(t, start_unix_ns);
        return t;
    }

private:
    /// Fills in the time left (rising, budget known) and places the rise's start in Unix time.
    void finish(trend& t, std::int64_t start_unix_ns) const {
        if (t.rising) t.rise_began_unix_ns += start_unix_ns;
        if (!t.rising || !budget_ || !(t.bytes_per_step > 0)) return;
        std::size_t high = 0;
        for (const auto& [device, d] : devices_) high = std::max(high, d.recent_high());
        const double room = *budget_ > high ? static_cast<double>(*budget_ - high) : 0.0;
        t.steps_left = room / t.bytes_per_step;
        if (t.bytes_per_second) t.seconds_left = room / *t.bytes_per_second;
    }

    bool automatic_; ///< samples come every N allocations or T ns, not only when asked
    trend_options options_;
    std::optional<std::size_t> budget_;
    std::unordered_map<owner_id, floor_trend> owners_;
    std::map<int, floor_trend> devices_;
    std::uint64_t samples_ = 0;
    std::uint64_t allocations_ = 0; ///< since the last sample
    std::int64_t last_ns_ = 0;      ///< the last sample's time
};

} // namespace custody::debug::detail
