// leak_hunt: a small multi-rank inference loop with a planted slow leak, and how the debug
// resource finds it.
//
// Four ranks (threads here, processes under torchrun) each run 20 steps of data loading, prefill,
// decode and output through a tracking resource over their own (virtual) device. Rank 1's decode
// keeps 256 bytes of its KV cache per step: the slow leak that only shows after hours. Each rank
// snapshots after every step; a growth watch fires after 5 consecutive growing snapshots; a trend
// watch fires once the floor of the device's live bytes rises significantly, with the rate and the
// time left before the device's budget; the diff between step 2 and step 20 names the owner and
// the call stack (file and line when custody is built with libdw); per-rank JSON reports are
// merged into a cross-rank table that shows the imbalance, and a forecast per owner: the rank that
// grows, its rate, and when it runs out. The steps take no time here; the tracker's clock counts
// each as a 50 ms decode step, so that rates per second and times left read as in a service. The
// last line says what the run proved; the exit status is 1 when it did not.
//
//   leak_hunt [DIR]   writes DIR/rank-R.json (default: the current directory); then try
//                     custody-merge --trace trace.json DIR/rank-*.json
#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace custody;
using namespace custody::debug;
using tracker = tracking_resource<host::simulated_device_memory>;

constexpr int world = 4;
constexpr int steps = 20;
constexpr int leaky_rank = 1;
constexpr std::int64_t step_ns = 50'000'000; // a decode step, as the tracker's clock counts it

} // namespace

namespace inference {

struct block {
    void* ptr;
    std::size_t bytes;
};

/// The planted bug: a cache of KV pages that rank 1 forgets to trim.
[[gnu::noinline]] void remember_kv_page(tracker& t, host::stream_view s, std::vector<block>& cache) {
    cache.push_back({t.allocate(s, 256, 256), 256});
}

} // namespace inference

namespace {

using inference::block;

/// "by 256 B a step (5120 B/s, confidence 0.99999996); 4864 B since step 1; 2.1 days left before the device's budget"
std::string describe_rate(const trend& t) {
    char text[256];
    std::snprintf(text, sizeof text, "by %.0f B a step (%.0f B/s, confidence %.8f); %zu B since step %llu",
                  t.bytes_per_step, t.bytes_per_second.value_or(0), t.confidence, t.leaked_bytes,
                  static_cast<unsigned long long>(t.rise_began + 1));
    std::string s = text;
    if (t.seconds_left) s += "; " + custody::debug::detail::duration_text(*t.seconds_left) + " left before the device's budget";
    return s;
}

struct rank_output {
    std::string alarms; ///< the watches' alarms, printed under the rank's heading
    int trend_alarms = 0;
    std::string log;
    leak_report grown;  ///< what appeared between step 2 and the last step and stayed
    rank_report report;
};

void run_rank(int rank, const std::string& dir, rank_output& out) {
    tracking_options o;
    o.name = "engine";
    o.rank = make_rank(rank, rank, world);
    o.capture_stacks = true;
    o.on_leak = policy::ignore; // the example frees what it can and reports the rest itself
    o.trend.levels = 1;         // one time scale of 16 samples (the default's coarsest is 4096)
    std::int64_t now = 0;
    o.clock = [&now] { return now; };
    tracker t(o, rank, std::size_t{1} << 30); // a 1 GiB device: its budget is 1 GiB less 128 MiB of headroom
    host::stream stream(rank);
    watch w;
    w.what = watch::subject::device;
    w.device = rank;
    w.growth_snapshots = 5;
    w.callback = [&](const watch_event& e) {
        out.alarms += "  ALARM rank " + std::to_string(e.rank) + ": " + e.subject + " grew across " +
                      std::to_string(e.consecutive_growths) + " snapshots, now " + std::to_string(e.live_bytes) +
                      " B\n";
    };
    t.add_watch(w);
    watch floor;
    floor.what = watch::subject::device;
    floor.device = rank;
    floor.trend = true;
    floor.callback = [&](const watch_event& e) {
        ++out.trend_alarms;
        out.alarms += "  ALARM rank " + std::to_string(e.rank) + ": " + e.subject + "'s floor rises " +
                      describe_rate(e.forecast) + "\n";
    };
    t.add_watch(floor);

    std::vector<block> weights;
    {
        owner_scope s("weights");
        weights.push_back({t.allocate(stream, 1 << 20, 256), 1 << 20});
    }
    std::vector<block> kv_cache;
    std::vector<snapshot> snaps;
    for (int step = 1; step <= steps; ++step) {
        block batch{};
        {
            owner_scope s("data_loading");
            batch = {t.allocate(stream, 64 << 10, 256), 64 << 10};
        }
        block activations{};
        {
            owner_scope s("prefill");
            activations = {t.allocate(stream, 256 << 10, 256), 256 << 10};
        }
        {
            owner_scope s("decode");
            owner_scope kv("kv_cache");
            block page{t.allocate(stream, 256, 256), 256};
            if (rank == leaky_rank) {
                inference::remember_kv_page(t, stream, kv_cache); // kept: the leak
            }
            t.deallocate(stream, page.ptr, page.bytes, 256);
        }
        {
            owner_scope s("output");
            block logits{t.allocate(stream, 32 << 10, 256), 32 << 10};
            t.deallocate(stream, logits.ptr, logits.bytes, 256);
        }
        t.deallocate(stream, activations.ptr, activations.bytes, 256);
        t.deallocate(stream, batch.ptr, batch.bytes, 256);
        now += step_ns;
        snaps.push_back(t.snapshot()); // also the trend's sample of this step
    }

    out.grown = diff(snaps[1], snaps.back());
    const leak_report& grown = out.grown;
    out.log += "  what appeared between step 2 and step " + std::to_string(steps) + " and stayed:";
    if (grown.empty()) {
        out.log += " nothing\n";
    } else {
        out.log += "\n";
        for (const auto& g : grown.groups) {
            out.log += "    " + std::to_string(g.bytes) + " B in " + std::to_string(g.count) + " blocks from '" +
                       g.owner + "'\n";
            for (std::size_t i = 0; i < g.stack.size() && i < 4; ++i) out.log += "      at " + g.stack[i] + "\n";
        }
    }
    out.report = t.make_report();
    write_json_report(out.report, dir + "/" + report_file_name(out.report.rank));
    for (const block& b : kv_cache) t.deallocate(stream, b.ptr, b.bytes, 256);
    for (const block& b : weights) t.deallocate(stream, b.ptr, b.bytes, 256);
    host::platform::synchronize(stream);
}

/// The run's verdict in one line: whether the watches, the diff, the merged table and the
/// forecast each point at the planted leak (rank 1's 'decode/kv_cache', allocated in
/// remember_kv_page) and nothing else.
std::pair<bool, std::string> verdict(const std::vector<rank_output>& outputs, const cross_rank_view& view) {
    std::string site;
    bool alone = true;
    for (int r = 0; r < world; ++r) {
        const rank_output& o = outputs[static_cast<std::size_t>(r)];
        if (r != leaky_rank) {
            alone = alone && o.alarms.empty() && o.grown.empty();
            continue;
        }
        if (o.alarms.empty() || o.trend_alarms != 1 || o.grown.groups.size() != 1 ||
            o.grown.groups[0].owner != "decode/kv_cache") {
            return {false, "rank 1's leak was not found by the watches (growth, one trend alarm) and the diff"};
        }
        const auto& stack = o.grown.groups[0].stack;
        if (stack.empty()) return {false, "the diff has no call stack"};
        if (stack[0].starts_with("unsymbolized")) { // custody built without libdw
            site = "a call stack left unsymbolized (custody-merge can symbolize the reports)";
        } else if (stack[0].find("remember_kv_page") == std::string::npos) {
            return {false, "the diff's call stack does not start at the leaking call (remember_kv_page)"};
        } else {
            site = stack[0].substr(0, stack[0].find(" ["));
        }
    }
    if (!alone) return {false, "a rank without the leak raised an alarm or grew"};
    if (view.imbalanced(1.5) != std::vector<std::string>{"decode/kv_cache"}) {
        return {false, "the merged table did not single out decode/kv_cache"};
    }
    if (view.forecasts.size() != 1 || view.forecasts[0].owner != "decode/kv_cache" ||
        view.forecasts[0].only_rank(world) != leaky_rank || view.forecasts[0].first_out != leaky_rank) {
        return {false, "the forecast did not name decode/kv_cache growing on rank 1 only"};
    }
    return {true, "the growth and trend watches, the step diff, the cross-rank table and the forecast all found "
                  "rank 1's slow leak in 'decode/kv_cache', at " + site};
}

/// The forecast in one line per owner that grows: where, how fast, and when it runs out.
std::string forecast_lines(const cross_rank_view& view) {
    std::string out;
    for (const owner_forecast& f : view.forecasts) {
        if (!f.first_out) continue;
        const trend& t = *f.at(*f.first_out);
        out += "forecast: '" + f.owner + "' grows on " +
               (f.only_rank(world) ? "rank " + std::to_string(*f.first_out) + " only"
                                   : std::to_string(f.rising.size()) + " ranks") +
               "; rank " + std::to_string(*f.first_out) + " runs out first: its floor rises " + describe_rate(t) + "\n";
    }
    return out;
}

} // namespace

int main(int argc, char** argv) {
    const std::string dir = argc > 1 ? argv[1] : ".";
    std::vector<rank_output> outputs(world);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(run_rank, r, dir, std::ref(outputs[static_cast<std::size_t>(r)]));
    for (auto& t : ranks) t.join();
    std::vector<rank_report> reports;
    std::puts("leak_hunt: 4 ranks on the host platform (threads over virtual devices), 20 steps each");
    for (int r = 0; r < world; ++r) {
        const rank_output& o = outputs[static_cast<std::size_t>(r)];
        std::printf("rank %d:\n%s%s", r, o.alarms.c_str(), o.log.c_str());
        reports.push_back(o.report);
    }
    const cross_rank_view view = merge_reports(reports);
    std::printf("\nlive bytes per owner and rank at the end:\n%s", format_table(view, 1.5).c_str());
    for (const auto& o : view.imbalanced(1.5)) std::printf("imbalanced across ranks: %s\n", o.c_str());
    std::printf("%s", forecast_lines(view).c_str());
    std::printf("reports: %s/rank-*.json\n", dir.c_str());
    const auto [proved, what] = verdict(outputs, view);
    std::printf("%s %s\n", proved ? "leak_hunt proved:" : "leak_hunt did NOT prove its point:", what.c_str());
    return proved ? 0 : 1;
}
