// The slow-leak forecast: the floor test on small fixed sequences (a sawtooth without a leak, a
// rising floor, a pause in the rise, a rise that stops and a new one, a fast leak caught at a fine
// scale), the tracker's trend watches and samples (the clock injected), the threshold watch's one
// alarm for one leak, the trends in reports and in the cross-rank forecast, and the sequence
// shared with the Python package's test (trend_sequence.txt).
#include "schema_check.hpp"

#include <custody/debug/detail/floor_trend.hpp>
#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/catch.hpp"

#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#ifndef CUSTODY_TREND_SEQUENCE
#error "the build defines CUSTODY_TREND_SEQUENCE (tests/debug/trend_sequence.txt)"
#endif

using namespace custody;
using namespace custody::debug;
namespace json = custody::debug::detail::json;

namespace {

/// One scale of 16 windows of 8 samples: the smallest setting the sequences below need.
trend_options one_scale() {
    trend_options o;
    o.window_samples = 8;
    o.levels = 1;
    o.windows = 16;
    return o;
}

/// Feeds samples 0..n-1 of `live(i)` (low == high: the value at the sample) to a floor test; returns
/// the samples at which it raised its alarm.
std::vector<int> alarms_of(debug::detail::floor_trend& t, int n, const std::function<std::size_t(int)>& live) {
    std::vector<int> raised;
    for (int i = 0; i < n; ++i) {
        const std::size_t v = live(i);
        if (t.add({v, v, std::int64_t{i} * 1'000'000'000})) raised.push_back(i);
    }
    return raised;
}

/// A sawtooth of period 8 (a request's KV cache grown and freed) over `floor(i)`.
std::size_t saw(int i) { return static_cast<std::size_t>(100 * (i % 8)); }

using tracker = tracking_resource<resource::host_memory>;

/// A tracker on `rank` of `world` whose clock is `now` (ns), with `trend` options.
tracking_options clocked(const std::int64_t& now, trend_options trend, int rank = 0, int world = 1) {
    tracking_options o;
    o.name = "trend";
    o.rank = make_rank(rank, rank, world);
    o.on_leak = policy::ignore;
    o.canaries = false;
    o.poison = false;
    o.trend = trend;
    o.clock = [&now] { return now; };
    return o;
}

} // namespace

TEST_CASE("a sawtooth without a leak raises no alarm, its peaks growing, spikes and a dip included",
          "[debug][trend]") {
    debug::detail::floor_trend t(one_scale());
    const auto raised = alarms_of(t, 1000, [](int i) {
        // Requests grow longer: the peaks rise, the floor (each request's start) does not.
        std::size_t v = 100000 + saw(i) * (10 + static_cast<std::size_t>(i) / 8) / 10;
        if (i % 50 == 7) v += 10000; // a spike: never a floor
        if (i % 97 == 3) v -= 50000; // a dip: one window's floor, an outlier to Theil-Sen
        return v;
    });
    CHECK(raised.empty());
    CHECK_FALSE(t.rising());
    CHECK(t.estimate().bytes_per_step == 0);
}

TEST_CASE("a rising floor under a sawtooth raises one alarm, with its rate and what leaked", "[debug][trend]") {
    debug::detail::floor_trend t(one_scale());
    const auto raised = alarms_of(t, 600, [](int i) { return 100000 + saw(i) + 5 * static_cast<std::size_t>(i); });
    // The 16th window closes at sample 127: 16 floors rising, z = 5.36 >= 4.
    CHECK(raised == std::vector<int>{127});
    const trend e = t.estimate();
    CHECK(e.rising);
    CHECK(e.alarms == 1);
    CHECK(e.bytes_per_step == Approx(5.0)); // each window's floor is its first sample: exactly 5 a sample
    CHECK(e.rise_began == 0);
    CHECK(e.leaked_bytes == 5 * 599);
    CHECK(e.bytes_per_second == Approx(5.0)); // a sample a second
    CHECK(e.confidence > 0.9999);
}

TEST_CASE("a pause in the rise raises no second alarm; a stop and a new rise does", "[debug][trend]") {
    SECTION("a pause of three windows") {
        debug::detail::floor_trend t(one_scale());
        const auto raised = alarms_of(t, 800, [](int i) {
            const int risen = i < 300 ? i : i < 324 ? 300 : i - 24;
            return 100000 + saw(i) + 5 * static_cast<std::size_t>(risen);
        });
        CHECK(raised == std::vector<int>{127});
        CHECK(t.alarms() == 1);
        CHECK(t.rising());
    }
    SECTION("a stop of fifty windows, then a new rise") {
        debug::detail::floor_trend t(one_scale());
        const auto raised = alarms_of(t, 1000, [](int i) {
            const int risen = i < 300 ? i : i < 700 ? 300 : i - 400;
            return 100000 + saw(i) + 5 * static_cast<std::size_t>(risen);
        });
        REQUIRE(raised.size() == 2);
        CHECK(raised[0] == 127);
        CHECK(raised[1] > 700);
        const trend e = t.estimate();
        CHECK(e.alarms == 2);
        CHECK(e.rise_began >= 696); // the window the new rise began in
        CHECK(e.rise_began <= 704);
        CHECK(e.bytes_per_step == Approx(5.0));
    }
}

TEST_CASE("a fast leak is caught at the fine scale, a sawtooth there is not", "[debug][trend]") {
    trend_options o;
    o.window_samples = 1;
    o.levels = 3; // 16, 64 and 256 samples; the fine ones start once 2 x 256 samples are seen
    o.windows = 16;
    debug::detail::floor_trend t(o);
    const auto live = [](int i) {
        // A sawtooth of period 40: its climbs fill the finest scale's 16 samples with a steady rise.
        const std::size_t base = 100000 + 250 * static_cast<std::size_t>(i % 40);
        return base + (i >= 2000 ? 3000 * static_cast<std::size_t>(i - 2000) : 0);
    };
    const auto raised = alarms_of(t, 2100, live);
    REQUIRE(raised.size() == 1);
    CHECK(raised[0] >= 2000);
    CHECK(raised[0] < 2016); // within the finest scale's 16 samples, long before the coarse one could
    CHECK(t.estimate().rise_began >= 1995);
    CHECK(t.estimate().bytes_per_step == Approx(3000.0).epsilon(0.05)); // by now from the rise's own windows
}

TEST_CASE("the statistics: Mann-Kendall's z with ties, Theil-Sen's slope past an outlier", "[debug][trend]") {
    std::vector<double> scratch;
    const std::vector<double> rising{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    CHECK(debug::detail::mann_kendall_z(rising, scratch) == Approx(119 / std::sqrt(16.0 * 15 * 37 / 18)));
    const std::vector<double> flat(16, 7.0);
    CHECK(debug::detail::mann_kendall_z(flat, scratch) == 0);
    const std::vector<double> x{0, 1, 2, 3, 4, 5, 6};
    const std::vector<double> f{0, 2, 4, 600, 8, 10, 12}; // a line of slope 2 and one wild point
    CHECK(debug::detail::theil_sen_slope(x, f, scratch) == Approx(2.0));
    CHECK(debug::detail::normal_cdf(0) == Approx(0.5));
}

TEST_CASE("a trend watch fires once with the owner, rate, confidence, leak and time left", "[debug][trend][watch]") {
    std::int64_t now = 0;
    trend_options o;
    o.levels = 1;
    o.windows = 16;
    o.budget_bytes = 1 << 20;
    tracker t(clocked(now, o));
    std::vector<watch_event> events;
    watch w;
    w.owner = "decode/kv_cache";
    w.trend = true;
    w.callback = [&](const watch_event& e) { events.push_back(e); };
    t.add_watch(w);
    watch quiet_owner = w;
    quiet_owner.owner = "decode/activations";
    t.add_watch(quiet_owner);

    std::vector<void*> kept;
    for (int step = 0; step < 40; ++step) {
        void* activations = t.allocate({}, 4096 + 512 * static_cast<std::size_t>(step % 3), 64, "decode/activations");
        kept.push_back(t.allocate({}, 64, 64, "decode/kv_cache")); // the leak: 64 B a step
        t.deallocate({}, activations, 4096 + 512 * static_cast<std::size_t>(step % 3), 64);
        now += 500'000'000; // two steps a second
        t.sample();
    }
    REQUIRE(events.size() == 1);
    const watch_event& e = events[0];
    CHECK(e.trend);
    CHECK_FALSE(e.growth);
    CHECK(e.owner == "decode/kv_cache");
    CHECK(e.subject == "owner 'decode/kv_cache'");
    CHECK(e.forecast.owner == "decode/kv_cache");
    CHECK(e.forecast.rising);
    CHECK(e.forecast.bytes_per_step == Approx(64.0));
    REQUIRE(e.forecast.bytes_per_second);
    CHECK(*e.forecast.bytes_per_second == Approx(128.0));
    CHECK(e.forecast.confidence > 0.9999);
    CHECK(e.forecast.leaked_bytes == 64 * 15); // 16 samples, the rise from the first
    // Time left: the budget less the device's highest live bytes, at 64 B a step.
    const double room = static_cast<double>((1 << 20) - (64 * 15 + 4096 + 1024)); // step 14's peak
    REQUIRE(e.forecast.steps_left);
    CHECK(*e.forecast.steps_left == Approx(room / 64));
    REQUIRE(e.forecast.seconds_left);
    CHECK(*e.forecast.seconds_left == Approx(room / 128));
    const auto trend_now = t.trend_of("decode/kv_cache");
    REQUIRE(trend_now);
    CHECK(trend_now->alarms == 1);
    CHECK(trend_now->leaked_bytes == 64 * 39);
    for (void* p : kept) t.deallocate({}, p, 64, 64);
}

TEST_CASE("samples come with snapshots, every N allocations and every T of the clock", "[debug][trend]") {
    std::int64_t now = 0;
    SECTION("every 10 allocations") {
        trend_options o;
        o.every_allocations = 10;
        tracker t(clocked(now, o));
        for (int i = 0; i < 95; ++i) t.deallocate({}, t.allocate({}, 8, 8, "x"), 8, 8);
        static_cast<void>(t.snapshot());
        CHECK(t.trend_of("x")->samples == 10); // 9 from allocations, 1 from the snapshot
    }
    SECTION("every second of the tracker's clock") {
        trend_options o;
        o.every_ns = 1'000'000'000;
        tracker t(clocked(now, o));
        for (int i = 0; i < 50; ++i) {
            now += 250'000'000;
            t.deallocate({}, t.allocate({}, 8, 8, "x"), 8, 8);
        }
        CHECK(t.trend_of("x")->samples == 12); // at 1, 2, ... 12 s; the allocation at 12.5 s is not due
    }
}

TEST_CASE("a threshold watch raises one alarm for one leak under swinging activations", "[debug][watch]") {
    // A rank leaks 64 KiB a step while its activations are taken and freed each step: the live
    // bytes swing across the threshold every step. One alarm, not one per swing.
    std::int64_t now = 0;
    tracker t(clocked(now, trend_options{}));
    std::vector<watch_event> events;
    watch w;
    w.what = watch::subject::device;
    w.device = 0;
    w.threshold_bytes = 1 << 20;
    w.callback = [&](const watch_event& e) { events.push_back(e); };
    t.add_watch(w);
    std::vector<void*> kept;
    for (int step = 0; step < 20; ++step) {
        void* activations = t.allocate({}, 256 << 10, 64, "activations");
        kept.push_back(t.allocate({}, 64 << 10, 64, "leak"));
        t.deallocate({}, activations, 256 << 10, 64);
        static_cast<void>(t.snapshot());
    }
    REQUIRE(events.size() == 1);
    CHECK(events[0].live_bytes == (256 << 10) + 13 * (64 << 10)); // 1114112 B
    CHECK_FALSE(events[0].trend);
    // Back below it for a whole step (the sample that finds it below, then one more): re-armed,
    // and the next crossing is a new alarm.
    for (void* p : kept) t.deallocate({}, p, 64 << 10, 64);
    kept.clear();
    static_cast<void>(t.snapshot());
    void* again = t.allocate({}, 2 << 20, 64, "big");
    CHECK(events.size() == 1); // the step it fell below in began above: not yet re-armed
    t.deallocate({}, again, 2 << 20, 64);
    static_cast<void>(t.snapshot());
    static_cast<void>(t.snapshot());
    void* big = t.allocate({}, 2 << 20, 64, "big");
    CHECK(events.size() == 2);
    t.deallocate({}, big, 2 << 20, 64);
}

TEST_CASE("a report carries the trends, valid against the schema, and reads back", "[debug][trend][json]") {
    std::int64_t now = 0;
    trend_options o;
    o.levels = 1;
    o.budget_bytes = 1 << 20;
    tracker t(clocked(now, o));
    std::vector<void*> kept;
    for (int step = 0; step < 20; ++step) {
        kept.push_back(t.allocate({}, 100, 64, "kv"));
        now += 1'000'000'000;
        t.sample();
    }
    const rank_report r = t.make_report();
    CHECK(r.trends.samples == 20);
    CHECK(r.trends.budget_bytes == std::size_t{1} << 20);
    REQUIRE(r.trends.owners.size() == 1);
    REQUIRE(r.trends.devices.size() == 1);
    CHECK(r.trends.devices[0].device == 0);
    CHECK(r.trends.devices[0].rising);
    const std::string text = to_json(r);
    const json::value schema = test::report_schema(); // the checker keeps a reference to it
    test::schema_checker checker(schema);
    const auto errors = checker.check(json::parse(text));
    for (const auto& e : errors) UNSCOPED_INFO(e);
    CHECK(errors.empty());
    const rank_report back = parse_rank_report(text);
    REQUIRE(back.trends.owners.size() == 1);
    const trend& a = r.trends.owners[0];
    const trend& b = back.trends.owners[0];
    CHECK(b.owner == "kv");
    CHECK(b.rising == a.rising);
    CHECK(b.alarms == a.alarms);
    CHECK(b.bytes_per_step == a.bytes_per_step);
    CHECK(b.bytes_per_second == a.bytes_per_second);
    CHECK(b.confidence == a.confidence);
    CHECK(b.leaked_bytes == a.leaked_bytes);
    CHECK(b.rise_began_unix_ns == a.rise_began_unix_ns);
    CHECK(b.steps_left == a.steps_left);
    CHECK(back.trends.budget_bytes == r.trends.budget_bytes);
    // A report from before trends existed reads as none; a wrong one is refused by name.
    json::value doc = json::parse(text);
    const std::string without = [&] {
        std::string s = text;
        s.erase(s.find(",\n  \"trends\""), s.rfind('}') - s.find(",\n  \"trends\""));
        return s;
    }();
    CHECK(parse_rank_report(without).trends.owners.empty());
    std::string bad = text;
    bad.replace(bad.find("\"confidence\":"), 13, "\"confidence\":\"x\",\"y\":");
    CHECK_THROWS_WITH(parse_rank_report(bad), CUSTODY_CATCH_CONTAINS("trends.owners[].confidence"));
    for (void* p : kept) t.deallocate({}, p, 100, 64);
}

TEST_CASE("the cross-rank forecast marks the rank that runs out first and an owner growing on one rank",
          "[debug][trend][merge]") {
    std::vector<rank_report> reports;
    for (int rank = 0; rank < 3; ++rank) {
        std::int64_t now = 0;
        trend_options o;
        o.levels = 1;
        o.budget_bytes = 1 << 20;
        tracker t(clocked(now, o, rank, 3));
        std::vector<std::pair<void*, std::size_t>> kept;
        for (int step = 0; step < 20; ++step) {
            if (rank != 0) kept.emplace_back(t.allocate({}, 100 * static_cast<std::size_t>(rank), 64, "kv"), 100 * rank);
            if (rank == 2) kept.emplace_back(t.allocate({}, 10, 64, "logits"), 10);
            t.deallocate({}, t.allocate({}, 50, 64, "steady"), 50, 64);
            now += 1'000'000'000;
            t.sample();
        }
        reports.push_back(parse_rank_report(to_json(t.make_report())));
        for (auto [p, n] : kept) t.deallocate({}, p, n, 64);
    }
    const cross_rank_view v = merge_reports(reports);
    REQUIRE(v.forecasts.size() == 2);
    const owner_forecast& kv = v.forecasts[0]; // runs out first: 200 B a step on rank 2
    CHECK(kv.owner == "kv");
    CHECK(kv.rising.size() == 2);
    CHECK(kv.first_out == 2);
    CHECK_FALSE(kv.only_rank(3));
    CHECK(kv.at(0) == nullptr); // rank 0 has no such owner
    REQUIRE(kv.at(1) != nullptr);
    CHECK(kv.at(1)->bytes_per_step == Approx(100.0));
    REQUIRE(kv.at(2) != nullptr);
    CHECK(kv.at(2)->bytes_per_step == Approx(200.0));
    const owner_forecast& logits = v.forecasts[1];
    CHECK(logits.owner == "logits");
    CHECK(logits.only_rank(3) == 2);
    const std::string table = format_table(v, 1.5);
    INFO(table);
    CHECK(table.find("slow leaks forecast") != std::string::npos);
    CHECK(table.find("kv\n") != std::string::npos);
    CHECK(table.find("<< rank 2 runs out first") != std::string::npos);
    CHECK(table.find("logits  << grows on rank 2 only") != std::string::npos);
    CHECK(table.find("steady") < table.find("slow leaks forecast"));
}

namespace {

/// tests/debug/trend_sequence.txt: the options, the live bytes to reach at each sample, and what the
/// floor test must say (see the file's comments).
struct shared_sequence {
    trend_options options;
    std::vector<std::size_t> live;
    std::map<std::string, double> expect;
};

shared_sequence read_sequence() {
    std::ifstream in(CUSTODY_TREND_SEQUENCE);
    REQUIRE(in);
    shared_sequence s;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream words(line);
        std::string kind;
        words >> kind;
        std::string item;
        while (words >> item) {
            if (kind == "live") {
                s.live.push_back(std::stoull(item));
                continue;
            }
            const auto eq = item.find('=');
            REQUIRE(eq != std::string::npos);
            const std::string key = item.substr(0, eq);
            const std::string value = item.substr(eq + 1);
            if (kind == "expect") {
                s.expect[key] = std::stod(value);
            } else if (key == "window_samples") {
                s.options.window_samples = static_cast<std::uint32_t>(std::stoul(value));
            } else if (key == "levels") {
                s.options.levels = static_cast<std::uint32_t>(std::stoul(value));
            } else if (key == "windows") {
                s.options.windows = static_cast<std::uint32_t>(std::stoul(value));
            } else {
                FAIL("unknown option " << key);
            }
        }
    }
    return s;
}

} // namespace

TEST_CASE("the sequence the Python package's test reads gives what the file expects", "[debug][trend]") {
    const shared_sequence s = read_sequence();
    REQUIRE(s.live.size() > 100);
    std::int64_t now = 0;
    tracker t(clocked(now, s.options));
    std::vector<std::pair<void*, std::size_t>> blocks; // a stack, as the Python test keeps it
    std::size_t live = 0;
    std::vector<std::size_t> alarms;
    watch w;
    w.owner = "sequence";
    w.trend = true;
    w.callback = [&](const watch_event&) { alarms.push_back(t.trend_of("sequence")->samples); };
    t.add_watch(w);
    for (const std::size_t target : s.live) {
        // Free whole blocks from the top while above the target, then allocate up to it.
        while (live > target) {
            live -= blocks.back().second;
            t.deallocate({}, blocks.back().first, blocks.back().second, 64);
            blocks.pop_back();
        }
        if (target > live) {
            blocks.emplace_back(t.allocate({}, target - live, 64, "sequence"), target - live);
            live = target;
        }
        t.sample();
    }
    const trend e = *t.trend_of("sequence");
    REQUIRE(alarms.size() == static_cast<std::size_t>(s.expect.at("alarms")));
    CHECK(static_cast<double>(alarms[0] - 1) == s.expect.at("alarm_sample"));
    CHECK(e.rising == (s.expect.at("rising") != 0));
    CHECK(e.bytes_per_step == Approx(s.expect.at("bytes_per_step")).epsilon(1e-9));
    CHECK(static_cast<double>(e.rise_began) == s.expect.at("rise_began"));
    CHECK(static_cast<double>(e.leaked_bytes) == s.expect.at("leaked_bytes"));
    CHECK(e.confidence == Approx(s.expect.at("confidence")).epsilon(1e-9));
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) t.deallocate({}, it->first, it->second, 64);
}
