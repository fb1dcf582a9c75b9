// Rank detection, the JSON writer and reader, the report schema, and merging reports across ranks
// (table, imbalance, Perfetto trace, bad inputs).
#include "schema_check.hpp"

#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>
#include <custody/core/rank.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/catch.hpp"

#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string_view>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace custody;
using namespace custody::debug;

#ifndef CUSTODY_SCHEMA_PATH
#error "the build defines CUSTODY_SCHEMA_PATH (docs/debug-report-schema.json)"
#endif

namespace {

rank_info from(const std::map<std::string, std::string>& env) {
    return detect_rank([&](std::string_view name) -> std::optional<std::string> {
        const auto it = env.find(std::string(name));
        if (it == env.end()) return std::nullopt;
        return it->second;
    });
}

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

/// A report of rank `rank` of `world`: "weights" 1000 B everywhere, "kv_cache" 100 B (times
/// `kv_factor` on this rank), a violation, and two timeline samples.
rank_report sample_report(int rank, int world, std::size_t kv_factor = 1) {
    tracking_options o;
    o.name = "rank" + std::to_string(rank);
    o.rank = make_rank(rank, rank, world);
    o.on_leak = policy::ignore;
    o.on_violation = policy::ignore;
    o.capture_stacks = true;
    tracking_resource<resource::host_memory> t(o);
    std::vector<std::pair<void*, std::size_t>> blocks;
    blocks.emplace_back(t.allocate({}, 1000, 256, "weights"), 1000);
    static_cast<void>(t.snapshot());
    blocks.emplace_back(t.allocate({}, 100 * kv_factor, 256, "kv_cache"), 100 * kv_factor);
    int x = 0;
    t.deallocate({}, &x, 4, 4); // an unknown pointer: one violation in the report
    rank_report r = t.make_report();
    for (auto [p, n] : blocks) t.deallocate({}, p, n, 256);
    return r;
}

} // namespace

TEST_CASE("detect_rank reads the launcher's variables, and outside a job is rank 0 of 1", "[debug][rank]") {
    CHECK(from({}) == rank_info{0, 0, 1, -1, "default"});
    CHECK(from({{"RANK", "3"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}}) == rank_info{3, 1, 8, -1, "torchrun"});
    CHECK(from({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "6"}}) ==
          rank_info{5, 1, 6, -1, "Open MPI"});
    CHECK(from({{"SLURM_PROCID", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "4"}}) ==
          rank_info{2, 0, 4, -1, "Slurm"});
    // Variables that are set but wrong are an error, not a silent rank 0: a report filed under the
    // wrong rank is worse than none.
    CHECK_THROWS_AS(from({{"RANK", "4"}}), custody::rank_error);                                  // incomplete
    CHECK_THROWS_AS(from({{"RANK", "4"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "4"}}), custody::rank_error); // rank >= size
    CHECK_THROWS_AS(from({{"RANK", "-1"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "4"}}), custody::rank_error);
    CHECK_THROWS_AS(from({{"RANK", ""}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "4"}}), custody::rank_error);
    CHECK(make_rank(2, 0, 4) == rank_info{2, 0, 4, -1, "caller"});
    CHECK_THROWS_AS(make_rank(4, 0, 4), custody::rank_error);
    CHECK_THROWS_AS(make_rank(1, 4, 4), custody::rank_error);
    CHECK_THROWS_AS(make_rank(0, 0, 0), custody::rank_error);
}

TEST_CASE("the JSON reader handles the grammar and reports truncation apart", "[debug][json]") {
    const json::value v = json::parse(R"( {"a": [1, -2.5e2, true, false, null], "s": "q\"\\\n\u00e9\ud83d\ude00", "o": {}} )");
    REQUIRE(v.is_object());
    const auto& a = v.find("a")->as_array();
    REQUIRE(a.size() == 5);
    CHECK(a[0].as_number() == 1);
    CHECK(a[1].as_number() == -250);
    CHECK(a[2].as_bool());
    CHECK(a[4].is_null());
    CHECK(v.find("s")->as_string() == "q\"\\\n\xc3\xa9\xf0\x9f\x98\x80");
    CHECK(v.find("o")->as_object().empty());
    CHECK(v.find("missing") == nullptr);

    for (const char* cut : {"{\"a\": [1, 2", "{\"a\"", "[", "\"abc", "{\"a\": tr", ""}) {
        INFO(cut);
        try {
            static_cast<void>(json::parse(cut));
            FAIL("parsed");
        } catch (const json::parse_error& e) {
            CHECK(e.truncated());
        }
    }
    for (const char* bad : {"{a: 1}", "[1,]", "01", "{\"a\" 1}", "[1] x", "\"\\q\"", "nul!"}) {
        INFO(bad);
        try {
            static_cast<void>(json::parse(bad));
            FAIL("parsed");
        } catch (const json::parse_error& e) {
            CHECK_FALSE(e.truncated());
        }
    }
    // The writer's output reads back to the same value.
    json::writer w;
    w.write(v);
    const json::value again = json::parse(w.str());
    CHECK(again.find("s")->as_string() == v.find("s")->as_string());
    CHECK(again.find("a")->as_array()[1].as_number() == -250);
}

TEST_CASE("a rank report is valid against docs/debug-report-schema.json", "[debug][json][schema]") {
    const json::value schema = json::parse(slurp(CUSTODY_SCHEMA_PATH));
    test::schema_checker checker(schema);
    const rank_report r = sample_report(1, 2, 3);
    const std::string text = to_json(r);
    const json::value doc = json::parse(text);
    const auto errors = checker.check(doc);
    for (const auto& e : errors) UNSCOPED_INFO(e);
    CHECK(errors.empty());

    // Required keys and their types, spelled out.
    CHECK(doc.find("schema")->as_string() == "custody.debug.rank_report");
    CHECK(doc.find("version")->as_number() == 1);
    CHECK(doc.find("rank")->find("world_size")->as_number() == 2);
    CHECK(doc.find("owners")->is_array());
    CHECK(doc.find("live")->find("groups")->as_array().size() == 2);
    CHECK(doc.find("violations")->as_array().at(0).find("kind")->as_string() == "unknown_pointer");
    CHECK(doc.find("violations")->as_array().at(0).find("allocated")->is_null());
    CHECK(doc.find("timeline")->as_array().size() == 2);

    // The checker itself catches a broken report.
    json::value broken = json::parse(R"({"schema": "custody.debug.rank_report", "version": 2, "rank": {"rank": -1}})");
    const auto found = checker.check(broken);
    CHECK(found.size() >= 4); // version const, rank minimum, rank's missing keys, top-level missing keys
}

TEST_CASE("a report reads back to what was written", "[debug][json]") {
    const rank_report r = sample_report(0, 1, 2);
    const rank_report back = parse_rank_report(to_json(r));
    CHECK(back.rank == r.rank);
    CHECK(back.tracker == "rank0");
    CHECK(back.platform == "host");
    CHECK(back.totals.live_bytes == 1200);
    REQUIRE(back.owners.size() == 2);
    CHECK(back.owners[0].owner == "kv_cache");
    CHECK(back.owners[0].live_bytes == 200);
    CHECK(back.owners[1].owner == "weights");
    CHECK(back.live.total_bytes == 1200);
    REQUIRE(back.live.groups.size() == 2);
    CHECK(back.live.groups[0].owner == "weights");
    CHECK_FALSE(back.live.groups[0].stack.empty());
    REQUIRE(back.violations.size() == 1);
    CHECK(back.violations[0].kind == violation_kind::unknown_pointer);
    REQUIRE(back.timeline.size() == 2);
    CHECK(back.timeline[0].owners == std::vector<std::pair<std::string, std::size_t>>{{"weights", 1000}});
    CHECK(back.timeline[1].owners.size() == 2);
}

TEST_CASE("merging finds a planted imbalance and builds the Perfetto trace", "[debug][merge]") {
    std::vector<rank_report> reports;
    for (int r = 0; r < 4; ++r) reports.push_back(sample_report(r, 4, r == 2 ? 8 : 1));
    const cross_rank_view v = merge_reports(reports);
    CHECK(v.world_size == 4);
    REQUIRE(v.owners == std::vector<std::string>{"kv_cache", "weights"});
    CHECK(v.bytes[0] == std::vector<std::size_t>{100, 100, 800, 100});
    CHECK(v.max_of(0) == 800);
    CHECK(v.mean_of(0) == Approx(275.0));
    CHECK(v.imbalance_of(0) == Approx(800.0 / 275.0));
    CHECK(v.imbalance_of(1) == Approx(1.0));
    CHECK(v.imbalanced(1.5) == std::vector<std::string>{"kv_cache"});
    CHECK(v.rank_totals[2] == 1800);
    const std::string table = format_table(v, 1.5);
    CHECK(table.find("kv_cache") != std::string::npos);
    CHECK(table.find("<< imbalanced") != std::string::npos);
    CHECK(table.find("2.91") != std::string::npos);
    CHECK(table.find("weights") < table.find("total"));

    const json::value trace = json::parse(to_perfetto_trace(reports));
    const auto& events = trace.find("traceEvents")->as_array();
    std::set<std::string> process_names;
    std::map<std::pair<int, std::string>, int> counters; // (pid, owner) -> samples
    for (const auto& e : events) {
        const std::string& ph = e.find("ph")->as_string();
        if (ph == "M" && e.find("name")->as_string() == "process_name") {
            process_names.insert(e.find("args")->find("name")->as_string());
        } else if (ph == "C") {
            CHECK(e.find("ts")->as_number() >= 0);
            CHECK(e.find("args")->find("live_bytes")->is_integer());
            ++counters[{static_cast<int>(e.find("pid")->as_number()), e.find("name")->as_string()}];
        }
    }
    CHECK(process_names == std::set<std::string>{"rank 0", "rank 1", "rank 2", "rank 3"});
    CHECK(counters.size() == 8); // 4 ranks x 2 owners
    for (int pid = 1; pid <= 4; ++pid) {
        CHECK(counters[{pid, "weights"}] == 2);
        CHECK(counters[{pid, "kv_cache"}] == 2); // 0 at the first sample, then its bytes
    }
}

TEST_CASE("bad inputs to the merge give typed errors naming the problem", "[debug][merge][errors]") {
    using reason = report_error::reason;
    const auto why = [](auto&& f) {
        try {
            f();
        } catch (const report_error& e) {
            return std::pair{e.why(), std::string(e.what())};
        }
        FAIL("no report_error");
        return std::pair{reason::malformed, std::string()};
    };
    const std::string good = to_json(sample_report(0, 2));

    auto [r1, m1] = why([&] { static_cast<void>(read_rank_report("/nonexistent/rank-0.json")); });
    CHECK(r1 == reason::missing);
    CHECK(m1.find("/nonexistent/rank-0.json") != std::string::npos);
    auto [r2, m2] = why([&] { static_cast<void>(parse_rank_report(good.substr(0, good.size() / 2), "half.json")); });
    CHECK(r2 == reason::truncated);
    CHECK(m2.find("half.json") != std::string::npos);
    CHECK(why([&] { static_cast<void>(parse_rank_report("")); }).first == reason::truncated);
    CHECK(why([&] { static_cast<void>(parse_rank_report("hello")); }).first == reason::malformed);
    CHECK(why([&] { static_cast<void>(parse_rank_report(R"({"schema": "other", "version": 1})")); }).first ==
          reason::malformed);
    std::string v2 = good;
    v2.replace(v2.find("\"version\":1"), 11, "\"version\":2");
    auto [r3, m3] = why([&] { static_cast<void>(parse_rank_report(v2)); });
    CHECK(r3 == reason::malformed);
    CHECK(m3.find("version 2") != std::string::npos);
    std::string wrong_type = good;
    wrong_type.replace(wrong_type.find("\"tracker\":\"rank0\""), 17, "\"tracker\":17");
    CHECK(why([&] { static_cast<void>(parse_rank_report(wrong_type)); }).second.find("tracker") != std::string::npos);

    const rank_report a = sample_report(0, 2);
    const rank_report b = sample_report(1, 2);
    const rank_report c = sample_report(1, 3);
    CHECK(why([&] { static_cast<void>(merge_reports({})); }).first == reason::mismatched);
    auto [r4, m4] = why([&] { static_cast<void>(merge_reports({a, c}, {"a.json", "c.json"})); });
    CHECK(r4 == reason::mismatched);
    CHECK(m4.find("world size 3") != std::string::npos);
    auto [r5, m5] = why([&] { static_cast<void>(merge_reports({a, a}, {"a.json", "again.json"})); });
    CHECK(r5 == reason::mismatched);
    CHECK(m5.find("rank 0 already came from 'a.json'") != std::string::npos);
    auto [r6, m6] = why([&] { static_cast<void>(merge_reports({b})); });
    CHECK(r6 == reason::missing);
    CHECK(m6.find("no report for rank 0") != std::string::npos);
    CHECK(merge_reports({b, a}).world_size == 2); // order does not matter
    rank_report outside = a;
    outside.rank.rank = 7;
    CHECK(why([&] { static_cast<void>(merge_reports({a, outside})); }).first == reason::mismatched);
}
