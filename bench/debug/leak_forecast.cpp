// How well the slow-leak forecast (debug/trend.hpp) does on a decode loop: the false alarms over a
// long run without a leak, and for leaks of 0.01%, 0.1% and 1% of the working set per step, the
// steps until the alarm (as a share of the time that was left before the device's budget) and the
// error of the rate it forecast. Deterministic: each run's workload comes from a seed, and the
// tracker's clock is injected (25 ms per step).
//
// The workload, one decode step at a time, through a tracking_resource over an address space that
// hands out addresses and no memory (so a 80 GiB device fits in a test machine):
//   weights             16 GiB in 32 blocks, allocated once ("weights")
//   requests            Poisson arrivals, 0.12 a step; at most 64 in the batch, the rest wait;
//                       prompt 32..2048 tokens (uniform), output 8 + exponential(mean 300) tokens
//   KV cache            2 MiB pages of 16 tokens (128 KiB a token): a request's prompt pages at
//                       admission, a page each 16 generated tokens, all freed when it finishes
//                       ("decode/kv_cache": a sawtooth per request, summed over a varying batch)
//   activations         three blocks a step sized by the batch (8, 6 and 0.5 MiB a sequence),
//                       allocated at the step's start and freed at its end ("decode/activations")
//   leak                from step 20000 (after the warm-up), one block a step of a share of the
//                       working set, kept: forgotten KV pages ("decode/kv_cache")
//   budget              80 GiB device less the automatic headroom (1 GiB); a sample() per step
// The working set is the mean peak live bytes of a step in the run without a leak; the time left
// at the leak's start is (budget - the highest step peak of that run) / leak per step.
//
//   bench_leak_forecast [--steps N] [--seeds S] [--verbose]   defaults 1000000 and 10; --short: 60000
//   and 3; --verbose: each run's alarm (its subject, rate, rise, time left against the true ones)
#include <custody/debug/tracking_resource.hpp>
#include <custody/platform/host.hpp>
#include <custody/resource/detail/leaf.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

/// A device of `capacity` bytes that hands out addresses and no memory: nothing may touch them.
class address_space final : public custody::resource::detail::leaf<address_space, custody::host::platform> {
public:
    static constexpr const char* name = "address_space";
    static constexpr std::size_t max_alignment = custody::max_alignment;
    static constexpr bool interchangeable = false;

    explicit address_space(std::size_t capacity) : leaf(0), capacity_(capacity) {}
    [[nodiscard]] std::size_t device_capacity() const noexcept { return capacity_; }

    void* raw_allocate_sync(std::size_t bytes, std::size_t alignment) noexcept {
        next_ = (next_ + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
        const std::uintptr_t at = next_;
        next_ += bytes;
        return reinterpret_cast<void*>(at);
    }
    void raw_deallocate_sync(void*, std::size_t, std::size_t) noexcept {}
    void* raw_allocate(stream_type, std::size_t bytes, std::size_t alignment) noexcept {
        return raw_allocate_sync(bytes, alignment);
    }
    void raw_deallocate(stream_type, void*, std::size_t, std::size_t) noexcept {}

private:
    std::size_t capacity_;
    std::uintptr_t next_ = std::uintptr_t{1} << 40;
};

/// splitmix64, and the few distributions the workload draws from, written out so that a seed gives
/// the same workload with any standard library.
class random_source {
public:
    explicit random_source(std::uint64_t seed) : state_(seed) {}
    std::uint64_t next() noexcept {
        std::uint64_t z = (state_ += 0x9e3779b97f4a7c15);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
        z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
        return z ^ (z >> 31);
    }
    double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; } // [0, 1)
    std::uint64_t between(std::uint64_t lo, std::uint64_t hi) noexcept { return lo + next() % (hi - lo + 1); }
    double exponential(double mean) noexcept { return -mean * std::log1p(-uniform()); }
    int poisson(double mean) noexcept {
        const double limit = std::exp(-mean);
        int k = 0;
        for (double p = uniform(); p > limit; p *= uniform()) ++k;
        return k;
    }

private:
    std::uint64_t state_;
};

using tracker = custody::debug::tracking_resource<address_space>;
constexpr std::size_t page_tokens = 16;
constexpr std::size_t page_bytes = page_tokens * (128 << 10);
constexpr std::int64_t step_ns = 25'000'000;

struct request {
    std::size_t tokens = 0;
    std::size_t left = 0; ///< tokens still to generate
    std::vector<void*> pages;
};

/// The decode loop over one tracker.
class decode_loop {
public:
    decode_loop(std::uint64_t seed, const custody::debug::trend_options& trend) : random_(seed) {
        custody::debug::tracking_options o;
        o.name = "decode";
        o.rank = custody::rank_info{};
        o.canaries = false;
        o.poison = false;
        o.on_leak = custody::debug::policy::ignore;
        o.release_leaks = false;
        o.trend = trend;
        o.clock = [this] { return now_; };
        tracker_.emplace(std::move(o), std::size_t{80} * GiB);
        custody::debug::watch w;
        w.trend = true;
        w.callback = [this](const custody::debug::watch_event& e) { alarms_.push_back({step_, e}); };
        for (const char* owner : {"weights", "decode/kv_cache", "decode/activations"}) {
            w.what = custody::debug::watch::subject::owner;
            w.owner = owner;
            tracker_->add_watch(w);
        }
        w.what = custody::debug::watch::subject::device;
        w.device = 0;
        tracker_->add_watch(w);
        for (int i = 0; i < 32; ++i) static_cast<void>(tracker_->allocate_sync(512 * MiB, 256, "weights"));
    }

    /// The live bytes at the end of the last step.
    [[nodiscard]] std::size_t live() const noexcept { return tracker_->statistics().live_bytes; }

    /// One step; `leak` bytes are kept (0: none). Returns the step's peak live bytes.
    std::size_t step(std::size_t leak) {
        for (int n = random_.poisson(0.12); n > 0; --n) ++waiting_;
        while (waiting_ > 0 && batch_.size() < 64) {
            --waiting_;
            request r;
            r.tokens = random_.between(32, 2048);
            r.left = 8 + static_cast<std::size_t>(random_.exponential(300));
            for (std::size_t p = 0; p < (r.tokens + page_tokens - 1) / page_tokens; ++p) r.pages.push_back(page());
            batch_.push_back(std::move(r));
        }
        const std::size_t n = batch_.size();
        const std::size_t sizes[] = {n * 8 * MiB, n * 6 * MiB, n * MiB / 2};
        void* activations[3];
        for (int i = 0; i < 3; ++i) activations[i] = tracker_->allocate_sync(sizes[i], 256, "decode/activations");
        if (leak != 0) static_cast<void>(tracker_->allocate_sync(leak, 256, "decode/kv_cache"));
        const std::size_t peak = tracker_->statistics().live_bytes;
        for (int i = 0; i < 3; ++i) tracker_->deallocate_sync(activations[i], sizes[i], 256);
        for (std::size_t i = 0; i < batch_.size();) {
            request& r = batch_[i];
            if (r.tokens++ % page_tokens == 0) r.pages.push_back(page());
            if (--r.left == 0) {
                for (void* p : r.pages) tracker_->deallocate_sync(p, page_bytes, 256);
                batch_[i] = std::move(batch_.back());
                batch_.pop_back();
            } else {
                ++i;
            }
        }
        now_ += step_ns;
        tracker_->sample();
        ++step_;
        return peak;
    }

    struct alarm {
        std::uint64_t step;
        custody::debug::watch_event event;
    };
    [[nodiscard]] const std::vector<alarm>& alarms() const noexcept { return alarms_; }
    /// The trend now of an alarm's subject.
    [[nodiscard]] custody::debug::trend trend_of(const custody::debug::watch_event& e) {
        if (e.owner.empty()) return tracker_->make_report().trends.devices.at(0);
        return *tracker_->trend_of(e.owner);
    }
    [[nodiscard]] std::size_t budget() const { return std::size_t{80} * GiB - GiB; }

private:
    void* page() { return tracker_->allocate_sync(page_bytes, 256, "decode/kv_cache"); }

    random_source random_;
    std::optional<tracker> tracker_;
    std::vector<request> batch_;
    std::size_t waiting_ = 0;
    std::int64_t now_ = 0;
    std::uint64_t step_ = 0;
    std::vector<alarm> alarms_;
};

struct baseline {
    double working_set = 0;  ///< mean step peak
    std::size_t highest = 0; ///< highest step peak
    std::size_t alarms = 0;  ///< trend alarms without a leak
    std::string first;       ///< the first of them, described
    std::vector<std::size_t> floors; ///< each step's least live bytes (a step's low point is its start or its end)

    /// The largest rise of the floor within `span` steps: how far the workload's own wander goes.
    [[nodiscard]] std::size_t largest_rise(std::size_t span) const {
        std::size_t rise = 0;
        for (std::size_t t = 0; t + span < floors.size(); ++t) {
            if (floors[t + span] > floors[t]) rise = std::max(rise, floors[t + span] - floors[t]);
        }
        return rise;
    }
};

baseline run_without_leak(std::uint64_t steps, const custody::debug::trend_options& trend) {
    decode_loop loop(1, trend);
    baseline b;
    double sum = 0;
    b.floors.reserve(steps);
    std::size_t before = loop.live();
    for (std::uint64_t s = 0; s < steps; ++s) {
        const std::size_t peak = loop.step(0);
        b.floors.push_back(std::min(before, loop.live()));
        before = loop.live();
        sum += static_cast<double>(peak);
        b.highest = std::max(b.highest, peak);
    }
    b.working_set = sum / static_cast<double>(steps);
    b.alarms = loop.alarms().size();
    if (!loop.alarms().empty()) {
        const auto& a = loop.alarms().front();
        b.first = "step " + std::to_string(a.step) + ": " + a.event.subject;
    }
    return b;
}

struct leak_result {
    std::optional<double> share;  ///< steps to the alarm / time left at the leak's start
    double rate_error = 0;        ///< |forecast - true| / true, at the alarm
    double later_error = 0;       ///< the same once 25% of the time left has passed (or at the alarm, if later)
    double left_error = 0;        ///< the forecast time left against the true one then
    std::string subject;
    bool early = false;           ///< an alarm before the leak began
};

constexpr std::uint64_t leak_start = 20000;
bool verbose = false; ///< --verbose: each run's alarm

leak_result run_with_leak(std::uint64_t seed, double share_of_working_set, const baseline& b,
                          const custody::debug::trend_options& trend) {
    decode_loop loop(seed, trend);
    const auto leak = static_cast<std::size_t>(share_of_working_set * b.working_set);
    const double time_left = static_cast<double>(loop.budget() - b.highest) / static_cast<double>(leak);
    leak_result r;
    for (std::uint64_t s = 0; s < leak_start + static_cast<std::uint64_t>(time_left); ++s) {
        static_cast<void>(loop.step(s >= leak_start ? leak : 0));
        if (loop.alarms().empty()) continue;
        const auto a = loop.alarms().front(); // a copy: the steps below may add alarms
        if (a.step < leak_start) {
            r.early = true;
            return r;
        }
        const double elapsed = static_cast<double>(a.step + 1 - leak_start);
        r.share = elapsed / time_left;
        r.rate_error = std::abs(a.event.forecast.bytes_per_step / static_cast<double>(leak) - 1);
        if (a.event.forecast.steps_left) r.left_error = *a.event.forecast.steps_left / (time_left - elapsed) - 1;
        r.subject = a.event.subject;
        r.later_error = r.rate_error;
        const auto later = static_cast<std::uint64_t>(0.25 * time_left);
        if (a.step + 1 - leak_start < later) {
            for (std::uint64_t k = s + 1; k < leak_start + later; ++k) static_cast<void>(loop.step(leak));
            r.later_error = std::abs(loop.trend_of(a.event).bytes_per_step / static_cast<double>(leak) - 1);
        }
        if (verbose) {
            std::printf("  seed %llu: %s after %.0f steps: %.0f B a step (true %zu), confidence %.8f, rise from step "
                        "%llu, %zu B leaked, %.0f steps left (true %.0f)\n",
                        static_cast<unsigned long long>(seed), r.subject.c_str(), elapsed, a.event.forecast.bytes_per_step,
                        leak, a.event.forecast.confidence, static_cast<unsigned long long>(a.event.forecast.rise_began),
                        a.event.forecast.leaked_bytes, a.event.forecast.steps_left.value_or(0), time_left - elapsed);
        }
        return r;
    }
    return r;
}

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
    std::uint64_t steps = 1000000;
    std::uint64_t seeds = 10;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--short") == 0) {
            steps = 60000;
            seeds = 3;
        } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
            steps = std::strtoull(argv[++i], nullptr, 10);
        } else if (std::strcmp(argv[i], "--seeds") == 0 && i + 1 < argc) {
            seeds = std::strtoull(argv[++i], nullptr, 10);
        } else if (std::strcmp(argv[i], "--verbose") == 0) {
            verbose = true;
        } else {
            std::fprintf(stderr, "usage: bench_leak_forecast [--short] [--steps N] [--seeds S] [--verbose]\n");
            return 1;
        }
    }
    const custody::debug::trend_options trend; // the defaults
    const baseline b = run_without_leak(steps, trend);
    std::printf("decode loop without a leak: %llu steps, working set %.2f GiB (mean step peak), highest %.2f GiB, "
                "budget 79 GiB\n",
                static_cast<unsigned long long>(steps), b.working_set / GiB, static_cast<double>(b.highest) / GiB);
    std::printf("false alarms: %zu%s%s\n\n", b.alarms, b.first.empty() ? "" : ", the first at ", b.first.c_str());
    std::printf("%-9s %11s | %-31s %8s | %-15s %8s | %9s | %-15s | %s\n", "leak/step", "time left",
                "steps to the alarm: median, worst", "< 5%", "rate error: med, max", "< 25%", "left err",
                "at 25%: med, max", "missed, early");
    std::string wander;
    for (const double share : {0.0001, 0.001, 0.01}) {
        std::vector<double> shares;
        std::vector<double> errors;
        std::vector<double> left_errors;
        std::vector<double> later_errors;
        int missed = 0;
        int early = 0;
        const double leak = share * b.working_set;
        const double time_left = static_cast<double>(79 * GiB - b.highest) / leak;
        for (std::uint64_t seed = 2; seed < 2 + seeds; ++seed) {
            const leak_result r = run_with_leak(seed, share, b, trend);
            if (r.early) {
                ++early;
            } else if (!r.share) {
                ++missed;
            } else {
                shares.push_back(*r.share);
                errors.push_back(r.rate_error);
                left_errors.push_back(std::abs(r.left_error));
                later_errors.push_back(r.later_error);
            }
        }
        const auto within = [](const std::vector<double>& v, double limit) {
            return std::count_if(v.begin(), v.end(), [&](double x) { return x < limit; });
        };
        const double worst = shares.empty() ? 0.0 : *std::max_element(shares.begin(), shares.end());
        std::printf("%8.2f%% %5.0f steps | %6.0f (%5.1f%%) %6.0f (%5.1f%%) %5ld/%-2zu | %6.1f%% %6.1f%% %5ld/%-2zu | %8.1f%% | "
                    "%6.1f%% %6.1f%% | %d, %d\n",
                    share * 100, time_left, median_of(shares) * time_left, median_of(shares) * 100, worst * time_left,
                    worst * 100, static_cast<long>(within(shares, 0.05)), shares.size(), median_of(errors) * 100,
                    errors.empty() ? 0.0 : *std::max_element(errors.begin(), errors.end()) * 100,
                    static_cast<long>(within(errors, 0.25)), errors.size(), median_of(left_errors) * 100,
                    median_of(later_errors) * 100,
                    later_errors.empty() ? 0.0 : *std::max_element(later_errors.begin(), later_errors.end()) * 100,
                    missed, early);
        wander += "  within " + std::to_string(static_cast<std::size_t>(0.05 * time_left)) + " steps (5% of " +
                  std::to_string(static_cast<std::size_t>(time_left)) + "): up to " +
                  std::to_string(static_cast<double>(b.largest_rise(static_cast<std::size_t>(0.05 * time_left))) / GiB)
                      .substr(0, 4) +
                  " GiB\n";
    }
    std::printf("\nThe floor without a leak rose, from one step's low point to another's (a leak reaching 5%% of the "
                "time left has added %.2f GiB):\n%s",
                0.05 * static_cast<double>(79 * GiB - b.highest) / GiB, wander.c_str());
    std::printf("\n(%llu seeds a leak, each %llu steps without a leak first; time left: (budget - highest step peak) / leak; "
                "left err: the forecast time left against the true one at the alarm, median; at 25%%: the rate's error once "
                "25%% of the time left has passed)\n",
                static_cast<unsigned long long>(seeds), static_cast<unsigned long long>(leak_start));
    return 0;
}
