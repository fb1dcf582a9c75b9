/// @file
/// `floor_trend`: the floor test of one owner's or one device's live bytes, fed one sample at a
/// time (trend.hpp's trend_options tells the method): window floors at several time scales,
/// Mann-Kendall's z and Theil-Sen's slope over each scale's last floors, and the alarm's state.
/// Arithmetic only: no locks, no clock, no names.
#pragma once

#include <custody/debug/trend.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace custody::debug::detail {

/// One sample of a subject: its least and greatest live bytes since the previous sample (both
/// include the bytes at this sample), at `time_ns` of the tracker's clock.
struct floor_sample {
    std::size_t low = 0;
    std::size_t high = 0;
    std::int64_t time_ns = 0;
};

/// One window of samples: its floor, where it was, and its highest live bytes.
/// Invariant: floor <= high once the window holds a sample.
struct floor_window {
    double floor = 0;        ///< the least live bytes in the window
    double at = 0;           ///< the sample (0, 1, ...) the floor was met at
    std::int64_t at_ns = 0;  ///< and its time
    double high = 0;         ///< the most live bytes in the window
};

/// Mann-Kendall's z of `f` (in order): S = sum over i < j of sign(f_j - f_i), its variance
/// n(n-1)(2n+5)/18 less the ties' share, and z = (S -+ 1) / sqrt(var) (0 when S == 0 or every
/// value ties). O(n^2); `scratch` is reused.
[[nodiscard]] inline double mann_kendall_z(std::span<const double> f, std::vector<double>& scratch) {
    const auto n = static_cast<double>(f.size());
    double s = 0;
    for (std::size_t i = 0; i < f.size(); ++i)
        for (std::size_t j = i + 1; j < f.size(); ++j) s += (f[j] > f[i]) - (f[j] < f[i]);
    scratch.assign(f.begin(), f.end());
    std::sort(scratch.begin(), scratch.end());
    double ties = 0;
    for (std::size_t i = 0; i < scratch.size();) {
        std::size_t j = i;
        while (j < scratch.size() && scratch[j] == scratch[i]) ++j;
        const auto t = static_cast<double>(j - i);
        ties += t * (t - 1) * (2 * t + 5);
        i = j;
    }
    const double variance = (n * (n - 1) * (2 * n + 5) - ties) / 18;
    if (variance <= 0 || s == 0) return 0;
    return (s > 0 ? s - 1 : s + 1) / std::sqrt(variance);
}

/// The median of `v` (the mean of the two middle values for an even count; 0 for none), reordering
/// it. O(n).
[[nodiscard]] inline double median_in_place(std::vector<double>& v) {
    if (v.empty()) return 0;
    const std::size_t m = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m), v.end());
    const double upper = v[m];
    if (v.size() % 2 == 1) return upper;
    return (upper + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m))) / 2;
}

/// Theil-Sen's slope of the points (x_i, f_i): the median of (f_j - f_i) / (x_j - x_i) over the
/// pairs with x_i != x_j (0 for none). O(n^2); `scratch` is reused.
[[nodiscard]] inline double theil_sen_slope(std::span<const double> x, std::span<const double> f,
                                            std::vector<double>& scratch) {
    scratch.clear();
    for (std::size_t i = 0; i < f.size(); ++i)
        for (std::size_t j = i + 1; j < f.size(); ++j)
            if (x[j] != x[i]) scratch.push_back((f[j] - f[i]) / (x[j] - x[i]));
    return median_in_place(scratch);
}

/// The standard normal distribution function, Phi(z).
[[nodiscard]] inline double normal_cdf(double z) noexcept { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

/// The floor test of one subject.
///
/// Invariants: level l holds windows of width(l) = window_samples * 4^l samples; ring(l) holds its
/// last min(closed(l), windows) closed windows, oldest first at head(l); the windows of level l
/// are the samples [k * width(l), (k + 1) * width(l)). rising_ implies alarms_ >= 1 and
/// rise_began_ <= samples_. reference(l) is the largest rise a test of level l showed, among the
/// tests that raised nothing, whose span ended at least one span of l ago and began after the last
/// rise settled.
/// Thread safety: none (the tracker's lock). Complexity: a sample is O(levels) plus, for each
/// window it closes, O(windows^2) (the two statistics); an alarm adds O(windows^3) once.
class floor_trend {
public:
    explicit floor_trend(const trend_options& o)
        : base_(std::max<std::uint32_t>(o.window_samples, 1)), depth_(std::clamp<std::uint32_t>(o.levels, 1, 8)),
          k_(std::clamp<std::uint32_t>(o.windows, 4, 64)), z_alarm_(o.z_alarm), z_settle_(o.z_settle),
          margin_(o.margin), levels_(depth_) {
        for (level& l : levels_) l.ring.resize(k_);
    }

    /// Adds one sample; true when it raised the alarm (a new rise).
    bool add(const floor_sample& s) {
        const auto at = static_cast<double>(samples_);
        latest_ = s;
        bool raised = false;
        for (std::uint32_t l = 0; l < depth_; ++l) {
            level& lv = levels_[l];
            if (lv.filled == 0 || static_cast<double>(s.low) < lv.open.floor) {
                lv.open.floor = static_cast<double>(s.low);
                lv.open.at = at;
                lv.open.at_ns = s.time_ns;
            }
            lv.open.high = lv.filled == 0 ? static_cast<double>(s.high) : std::max(lv.open.high, static_cast<double>(s.high));
            if (++lv.filled == width(l)) {
                lv.ring[(lv.head + lv.count) % k_] = lv.open;
                if (lv.count == k_) lv.head = (lv.head + 1) % k_;
                else ++lv.count;
                lv.filled = 0;
                raised = test(l) || raised;
            }
        }
        ++samples_;
        return raised;
    }

    [[nodiscard]] std::uint64_t samples() const noexcept { return samples_; }
    [[nodiscard]] bool rising() const noexcept { return rising_; }
    [[nodiscard]] std::uint64_t alarms() const noexcept { return alarms_; }
    [[nodiscard]] const floor_sample& latest() const noexcept { return latest_; }

    /// The estimate at the latest sample, without the time left (the caller knows the budget).
    [[nodiscard]] trend estimate() const {
        trend t;
        t.samples = samples_;
        t.floor_bytes = latest_.low;
        t.rising = rising_;
        t.alarms = alarms_;
        t.bytes_per_step = rate_;
        t.confidence = normal_cdf(z_);
        if (seconds_per_step_ > 0) t.bytes_per_second = rate_ / seconds_per_step_;
        if (rising_) {
            t.rise_began = static_cast<std::uint64_t>(rise_began_);
            t.rise_began_unix_ns = rise_began_ns_; // tracker time; the caller adds its start
            const double since = static_cast<double>(samples_ - 1) - rise_began_;
            t.leaked_bytes = rate_ > 0 && since > 0 ? to_bytes(rate_ * since) : 0;
        }
        return t;
    }

    /// The seconds per sample at the scale estimated from (0: unknown).
    [[nodiscard]] double seconds_per_step() const noexcept { return seconds_per_step_; }

    /// The most live bytes over the windows kept at the coarsest scale that has any, and since.
    [[nodiscard]] std::size_t recent_high() const noexcept {
        double high = static_cast<double>(latest_.high);
        std::uint32_t top = depth_;
        while (top > 0 && levels_[top - 1].count == 0) --top;
        for (std::uint32_t l = top == 0 ? 0 : top - 1; l < depth_; ++l) {
            const level& lv = levels_[l];
            for (std::uint32_t i = 0; i < lv.count; ++i) high = std::max(high, lv.ring[i].high);
            if (lv.filled != 0) high = std::max(high, lv.open.high);
        }
        return to_bytes(high);
    }

private:
    struct level {
        std::vector<floor_window> ring; ///< windows slots; count of them filled from head
        std::uint32_t head = 0;
        std::uint32_t count = 0;
        floor_window open;             ///< the window being filled
        std::uint64_t filled = 0;      ///< samples in `open`
        double reference = 0;          ///< see the class's invariants
        std::vector<std::pair<double, double>> pending; ///< (span's end, rise) not yet matured, oldest first
        double last_z = 0;             ///< z at its latest test
    };

    [[nodiscard]] std::uint64_t width(std::uint32_t l) const noexcept { return std::uint64_t{base_} << (2 * l); }
    [[nodiscard]] double span(std::uint32_t l) const noexcept { return static_cast<double>(width(l) * k_); }
    [[nodiscard]] static std::size_t to_bytes(double b) noexcept {
        if (!(b > 0)) return 0;
        return b >= 1.8e19 ? std::numeric_limits<std::size_t>::max() : static_cast<std::size_t>(b);
    }

    /// Copies level l's windows into xs_, fs_ (oldest first), from `first` on.
    void gather(const level& lv, std::uint32_t first = 0) {
        xs_.clear();
        fs_.clear();
        for (std::uint32_t i = first; i < lv.count; ++i) {
            const floor_window& w = lv.ring[(lv.head + i) % k_];
            xs_.push_back(w.at);
            fs_.push_back(w.floor);
        }
    }

    /// The test of level l once its window closed: true when it raised the alarm.
    bool test(std::uint32_t l) {
        level& lv = levels_[l];
        if (lv.count < k_) return false;
        gather(lv);
        const double z = mann_kendall_z(fs_, scratch_);
        const double slope = theil_sen_slope(xs_, fs_, scratch_);
        const double rise = slope * (xs_.back() - xs_.front());
        const double now = static_cast<double>(samples_);
        lv.last_z = z;
        while (!lv.pending.empty() && lv.pending.front().first <= now - span(l)) {
            lv.reference = std::max(lv.reference, lv.pending.front().second);
            lv.pending.erase(lv.pending.begin());
        }
        if (rising_) {
            follow(l);
            settle();
            return false;
        }
        const bool coarsest = l + 1 == depth_;
        const bool warm = now + 1 >= 2 * span(depth_ - 1);
        if (z >= z_alarm_ && slope > 0 && (coarsest || (warm && rise > margin_ * lv.reference))) {
            raise(l, z);
            return true;
        }
        if (xs_.front() >= learn_from_) lv.pending.emplace_back(now, rise);
        if (l >= quiet_level_) { // the coarsest scale tested so far speaks for the quiet floor
            quiet_level_ = l;
            rate_ = slope;
            z_ = z;
            seconds_per_step_ = pace(lv, 0);
        }
        return false;
    }

    /// Raises the alarm from level l: where the rise began and how fast it goes, from the split of
    /// its windows into a flat part and a rising part that fits them best (least absolute error).
    void raise(std::uint32_t l, double z) {
        const level& lv = levels_[l];
        gather(lv);
        const std::vector<double> xs = xs_;
        const std::vector<double> fs = fs_;
        double best_error = std::numeric_limits<double>::infinity();
        std::size_t best_split = 0;
        double best_slope = 0;
        for (std::size_t split = 0; split + 3 < fs.size(); ++split) {
            const std::span<const double> x(xs.data() + split, xs.size() - split);
            const std::span<const double> f(fs.data() + split, fs.size() - split);
            const double slope = theil_sen_slope(x, f, scratch_);
            if (slope <= 0) continue;
            const double flat = median(std::span<const double>(fs.data(), split + 1));
            scratch_.clear();
            for (std::size_t j = 0; j < f.size(); ++j) scratch_.push_back(f[j] - slope * (x[j] - x[0]));
            const double base = median(scratch_);
            double error = 0;
            for (std::size_t j = 0; j < split; ++j) error += std::abs(fs[j] - flat);
            for (std::size_t j = 0; j < f.size(); ++j) error += std::abs(f[j] - base - slope * (x[j] - x[0]));
            if (error < best_error) {
                best_error = error;
                best_split = split;
                best_slope = slope;
            }
        }
        rising_ = true;
        ++alarms_;
        fired_ = l;
        rise_began_ = xs[best_split];
        rise_began_ns_ = lv.ring[(lv.head + best_split) % k_].at_ns;
        rate_ = best_slope > 0 ? best_slope : theil_sen_slope(xs, fs, scratch_);
        z_ = z;
        seconds_per_step_ = pace(lv, static_cast<std::uint32_t>(best_split));
    }

    /// While rising: the rate from the coarsest scale (at or above the one that raised the alarm)
    /// with at least half its windows inside the rise.
    void follow(std::uint32_t l) {
        if (l < fired_) return;
        const level& lv = levels_[l];
        std::uint32_t first = 0;
        while (first < lv.count && lv.ring[(lv.head + first) % k_].at < rise_began_) ++first;
        if (lv.count - first < std::max<std::uint32_t>(k_ / 2, 3)) return;
        gather(lv, first);
        rate_ = theil_sen_slope(xs_, fs_, scratch_);
        z_ = mann_kendall_z(fs_, scratch_);
        seconds_per_step_ = pace(lv, first);
    }

    /// While rising: the floor has stopped rising once every scale from the one that raised the
    /// alarm up, among those with their windows full, tests below z_settle.
    void settle() {
        for (std::uint32_t l = fired_; l < depth_; ++l) {
            const level& lv = levels_[l];
            if (lv.count == k_ && lv.last_z >= z_settle_) return;
        }
        rising_ = false;
        learn_from_ = static_cast<double>(samples_);
        quiet_level_ = 0;
    }

    /// Seconds per sample over level l's windows from `first` to the last (0: unknown).
    [[nodiscard]] double pace(const level& lv, std::uint32_t first) const noexcept {
        const floor_window& a = lv.ring[(lv.head + first) % k_];
        const floor_window& b = lv.ring[(lv.head + lv.count - 1) % k_];
        if (b.at <= a.at || b.at_ns <= a.at_ns) return 0;
        return static_cast<double>(b.at_ns - a.at_ns) * 1e-9 / (b.at - a.at);
    }

    [[nodiscard]] double median(std::span<const double> v) {
        median_.assign(v.begin(), v.end());
        return median_in_place(median_);
    }

    std::uint32_t base_;
    std::uint32_t depth_;
    std::uint32_t k_;
    double z_alarm_;
    double z_settle_;
    double margin_;
    std::vector<level> levels_;
    std::uint64_t samples_ = 0;
    floor_sample latest_;
    bool rising_ = false;
    std::uint64_t alarms_ = 0;
    std::uint32_t fired_ = 0;        ///< the level that raised the current alarm
    std::uint32_t quiet_level_ = 0;  ///< while quiet: the level the estimate comes from
    double rise_began_ = 0;          ///< the sample the current rise began at
    std::int64_t rise_began_ns_ = 0;
    double learn_from_ = 0;          ///< references learn from tests whose span began here or later
    double rate_ = 0;                ///< bytes per sample
    double z_ = 0;
    double seconds_per_step_ = 0;
    std::vector<double> xs_, fs_, scratch_, median_;
};

} // namespace custody::debug::detail
