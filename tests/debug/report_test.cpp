// Rank detection, the JSON writer and reader, the report schema, and merging reports across ranks
// (table, imbalance, Perfetto trace, bad inputs).
#include "schema_check.hpp"

#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>
#include <custody/core/rank.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/catch.hpp"
#include "../support/planted_links.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string_view>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

using namespace custody;
using namespace custody::debug;
namespace json = custody::debug::detail::json;

namespace {

rank_info from(const std::map<std::string, std::string>& env) {
    return detect_rank([&](std::string_view name) -> std::optional<std::string> {
        const auto it = env.find(std::string(name));
        if (it == env.end()) return std::nullopt;
        return it->second;
    });
}

/// Checks that the JSON reader refuses `text`, as truncated or not.
void check_refused(std::string_view text, bool truncated) {
    INFO(text);
    try {
        static_cast<void>(json::parse(text));
        FAIL_CHECK("parsed");
    } catch (const json::parse_error& e) {
        CHECK(e.truncated() == truncated);
    }
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

TEST_CASE("a rank's report file is rank-<R>.json, as Python and the trace recorder name theirs", "[debug][json]") {
    CHECK(report_file_name(make_rank(3, 1, 8)) == "rank-3.json");
    CHECK(report_file_name(make_rank(0, 0, 1)) == "rank-0.json");
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

    for (const char* cut : {"{\"a\": [1, 2", "{\"a\"", "[", "\"abc", "{\"a\": tr", "", "\"\xE2\x82"})
        check_refused(cut, true);
    for (const char* bad : {"{a: 1}", "[1,]", "01", "{\"a\" 1}", "[1] x", "\"\\q\"", "nul!"}) check_refused(bad, false);
    // The writer's output reads back to the same value.
    json::writer w;
    w.write(v);
    const json::value again = json::parse(w.str());
    CHECK(again.find("s")->as_string() == v.find("s")->as_string());
    CHECK(again.find("a")->as_array()[1].as_number() == -250);
}

TEST_CASE("a rank report is valid against docs/debug-report-schema.json", "[debug][json][schema]") {
    const json::value schema = test::report_schema();
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
        CHECK(counters[{pid, "kv_cache"}] == 1); // from the second sample on, where it appears
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

namespace {

/// `text` with the first occurrence of `from` replaced by `to`.
std::string with(std::string text, std::string_view from, std::string_view to) {
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
}

/// The reason and message of the report_error `f` throws.
template <class F>
std::pair<report_error::reason, std::string> refusal(F&& f) {
    try {
        f();
    } catch (const report_error& e) {
        return {e.why(), e.what()};
    }
    FAIL_CHECK("no report_error");
    return {report_error::reason::mismatched, {}};
}

/// UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates, nothing above U+10FFFF.
bool valid_utf8(std::string_view s) {
    std::size_t i = 0;
    while (i < s.size()) {
        const auto lead = static_cast<unsigned char>(s[i]);
        std::size_t follow = 0;
        std::uint32_t cp = 0;
        std::uint32_t least = 0;
        if (lead < 0x80) {
            ++i;
            continue;
        }
        if ((lead & 0xE0) == 0xC0) {
            follow = 1, cp = lead & 0x1Fu, least = 0x80;
        } else if ((lead & 0xF0) == 0xE0) {
            follow = 2, cp = lead & 0x0Fu, least = 0x800;
        } else if ((lead & 0xF8) == 0xF0) {
            follow = 3, cp = lead & 0x07u, least = 0x10000;
        } else {
            return false;
        }
        if (i + follow >= s.size()) return false;
        for (std::size_t k = 1; k <= follow; ++k) {
            const auto b = static_cast<unsigned char>(s[i + k]);
            if ((b & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (b & 0x3Fu);
        }
        if (cp < least || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return false;
        i += follow + 1;
    }
    return true;
}

/// A scratch file that is removed at the end of the scope.
struct scratch_file {
    std::string path;
    explicit scratch_file(const std::string& name, const std::string& text = {})
        : path((std::filesystem::temp_directory_path() / ("custody-" + std::to_string(::getpid()) + "-" + name)).string()) {
        std::ofstream(path, std::ios::binary) << text;
    }
    ~scratch_file() { std::filesystem::remove_all(path); }
    scratch_file(const scratch_file&) = delete;
    scratch_file& operator=(const scratch_file&) = delete;
};

/// The counter events ("ph": "C") of a Perfetto trace.
std::vector<json::value> counter_events(const json::value& trace) {
    std::vector<json::value> out;
    for (const auto& e : trace.find("traceEvents")->as_array())
        if (e.find("ph")->as_string() == "C") out.push_back(e);
    return out;
}

} // namespace

TEST_CASE("JSON integers keep every digit through the reader and the writer", "[debug][json]") {
    const std::string text = "[1763900000123456789,1763900000123456788,18446744073709551615,-9223372036854775808,0,-1]";
    json::writer w;
    w.write(json::parse(text));
    std::string written = w.str();
    std::erase_if(written, [](char c) { return c == '\n' || c == ' '; });
    CHECK(written == text);

    rank_report r = sample_report(0, 1);
    r.started_unix_ns = 1763900000123456789;
    r.written_unix_ns = 1763900000123456790;
    r.timeline[0].unix_ns = 1763900000123456789;
    r.timeline[1].unix_ns = 1763900000123456790;
    r.totals.allocations = UINT64_MAX;
    r.totals.live_bytes = SIZE_MAX;
    r.owners[0].live_bytes = (std::size_t{1} << 63) + 1;
    r.timeline[1].owners[0].second = SIZE_MAX - 1;
    const rank_report back = parse_rank_report(to_json(r));
    CHECK(back.started_unix_ns == 1763900000123456789);
    CHECK(back.written_unix_ns == 1763900000123456790);
    CHECK(back.timeline[0].unix_ns == 1763900000123456789);
    CHECK(back.timeline[1].unix_ns == 1763900000123456790); // two timestamps 1 ns apart stay apart
    CHECK(back.totals.allocations == UINT64_MAX);
    CHECK(back.totals.live_bytes == SIZE_MAX);
    CHECK(back.owners[0].live_bytes == (std::size_t{1} << 63) + 1);
    CHECK(back.timeline[1].owners[0].second == SIZE_MAX - 1);
}

TEST_CASE("an integer field given a fraction, an exponent or an out-of-range value is refused by name",
          "[debug][json][errors]") {
    const std::string good = to_json(sample_report(0, 1));
    const std::string digits(10000, '9');
    struct bad_field {
        std::string_view from;
        std::string to;
        std::string_view field; ///< what the message must name
    };
    const std::vector<bad_field> cases = {
        {"\"rank\":0", "\"rank\":1e19", "rank.rank"},
        {"\"rank\":0", "\"rank\":1e400", "rank.rank"},
        {"\"rank\":0", "\"rank\":9223372036854775808", "rank.rank"},
        {"\"rank\":0", "\"rank\":" + digits, "rank.rank"},
        {"\"rank\":0", "\"rank\":-" + digits, "rank.rank"},
        {"\"rank\":0", "\"rank\":0.5", "rank.rank"},
        {"\"rank\":0", "\"rank\":0e0", "rank.rank"},
        {"\"rank\":0", "\"rank\":0.0", "rank.rank"},
        {"\"local_rank\":0", "\"local_rank\":2147483648", "rank.local_rank"},
        {"\"world_size\":1", "\"world_size\":1e0", "rank.world_size"},
        {"\"version\":1", "\"version\":1.0", "version"},
        {"\"started_unix_ns\":", "\"started_unix_ns\":9.3e18,\"x\":", "started_unix_ns"},
        {"\"started_unix_ns\":", "\"started_unix_ns\":9223372036854775808,\"x\":", "started_unix_ns"},
        {"\"written_unix_ns\":", "\"written_unix_ns\":-9223372036854775809,\"x\":", "written_unix_ns"},
        {"\"live_bytes\":", "\"live_bytes\":18446744073709551616,\"x\":", "totals.live_bytes"},
        {"\"live_bytes\":", "\"live_bytes\":1e300,\"x\":", "totals.live_bytes"},
        {"\"allocations\":", "\"allocations\":-1,\"x\":", "totals.allocations"},
        {"\"device\":0", "\"device\":1e300", "devices[].device"},
        {"\"device\":0", "\"device\":4294967295", "devices[].device"},
        {"\"device\":0", "\"device\":-2", "devices[].device"},
        {"\"weights\":1000", "\"weights\":1e300", "timeline[].owners"},
        {"\"weights\":1000", "\"weights\":" + digits, "timeline[].owners"},
        {"\"unix_ns\":", "\"unix_ns\":1e400,\"x\":", "timeline[].unix_ns"},
    };
    for (const auto& c : cases) {
        const std::string text = with(good, c.from, c.to);
        INFO(c.to.substr(0, 64));
        const auto [why, message] = refusal([&] { static_cast<void>(parse_rank_report(text, "r.json")); });
        CHECK(why == report_error::reason::malformed);
        CHECK(message.find(c.field) != std::string::npos);
        CHECK(message.size() < 400); // names the field, does not echo 10,000 digits
    }
}

TEST_CASE("a rank or world size beyond int is refused, not narrowed", "[debug][json][errors]") {
    const std::string good = to_json(sample_report(0, 1));
    const std::string text = with(with(good, "\"rank\":0", "\"rank\":4294967296"), "\"world_size\":1",
                                  "\"world_size\":4294967297");
    const auto [why, message] = refusal([&] { static_cast<void>(parse_rank_report(text)); });
    CHECK(why == report_error::reason::malformed);
    CHECK(message.find("rank.") != std::string::npos);
}

TEST_CASE("a directory given as a report says it cannot be read, and why", "[debug][json][errors]") {
    const scratch_file dir("a-directory");
    std::filesystem::remove(dir.path);
    std::filesystem::create_directory(dir.path);
    const auto [why, message] = refusal([&] { static_cast<void>(read_rank_report(dir.path)); });
    CHECK(why == report_error::reason::missing);
    CHECK(message.find(dir.path) != std::string::npos);
    CHECK(message.find("directory") != std::string::npos);
    CHECK(message.find("truncated") == std::string::npos);
    const auto [why2, message2] = refusal([&] { static_cast<void>(read_rank_report(dir.path + "/none.json")); });
    CHECK(why2 == report_error::reason::missing);
    CHECK(message2.find("No such file or directory") != std::string::npos);
}

TEST_CASE("names with invalid UTF-8 still make a valid report, with U+FFFD in their place", "[debug][json][schema]") {
    rank_report r = sample_report(0, 1);
    r.tracker = "rank\xC0\x80zero";                    // an overlong NUL
    r.rank.source = "\xF4\x90\x80\x80";                // above U+10FFFF
    r.owners[0].owner = "kv\xFF";                      // a byte that is never UTF-8
    r.live.groups[0].owner = "w\xED\xA0\x80";           // an encoded surrogate
    r.live.groups[0].stack.push_back("frame\xE2\x82");  // a sequence cut by the end
    r.violations[0].detail = "cut\xE2\x82x here";       // a sequence cut by another character
    r.timeline[1].owners = {{"x\xFE", 1}, {"x\xFF", 2}, {"y\xE2\x82\xAC", 3}}; // two names that read alike
    const std::string text = to_json(r);
    CHECK(valid_utf8(text));

    const scratch_file file("bad-names.json", text);
    CHECK(std::system(("python3 -m json.tool " + file.path + " > /dev/null").c_str()) == 0);

    const json::value schema = test::report_schema();
    test::schema_checker checker(schema);
    const auto errors = checker.check(json::parse(text));
    for (const auto& e : errors) UNSCOPED_INFO(e);
    CHECK(errors.empty());

    const std::string fffd = "\xEF\xBF\xBD";
    const rank_report back = read_rank_report(file.path);
    CHECK(back.tracker == "rank" + fffd + fffd + "zero");
    CHECK(back.rank.source == fffd + fffd + fffd + fffd);
    CHECK(back.owners[0].owner == "kv" + fffd);
    CHECK(back.live.groups[0].owner == "w" + fffd + fffd + fffd);
    CHECK(back.live.groups[0].stack.back() == "frame" + fffd);
    CHECK(back.violations[0].detail == "cut" + fffd + "x here");
    // The two names that became one are one member holding both counts.
    CHECK(back.timeline[1].owners ==
          std::vector<std::pair<std::string, std::size_t>>{{"x" + fffd, 3}, {"y\xE2\x82\xAC", 3}});
}

TEST_CASE("the reader refuses duplicate keys, lone surrogates and invalid UTF-8", "[debug][json][errors]") {
    for (const char* bad : {R"({"a": 1, "a": 2})", R"({"a": 1, "b": {"c": 1, "c": 1}})", R"("\udc00")",
                            R"("x\udfffy")", R"("\ud800")", R"("\ud800x")", R"("\ud800\u0041")", R"("\ud800\ud800")",
                            "\"\xFF\"", "\"\xC0\x80\"", "\"\xED\xA0\x80\"", "\"\xE2\x82\"", "\"\xF4\x90\x80\x80\"",
                            "\"\x80\""}) {
        check_refused(bad, false);
    }
    // Many members: duplicates are found in large objects too.
    std::string many = "{";
    for (int i = 0; i < 1000; ++i) many += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
    CHECK_NOTHROW(json::parse(many + "\"last\":0}"));
    CHECK_THROWS_AS(json::parse(many + "\"k500\":0}"), json::parse_error);

    const std::string good = to_json(sample_report(0, 1));
    const auto [why, message] = refusal([&] {
        static_cast<void>(parse_rank_report(with(good, "\"rank\":0,", "\"rank\":0,\"rank\":1,"), "dup.json"));
    });
    CHECK(why == report_error::reason::malformed);
    CHECK(message.find("rank") != std::string::npos);
    CHECK(refusal([&] {
              static_cast<void>(parse_rank_report(with(good, "\"version\":1,", "\"version\":1,\"schema\":\"x\",")));
          }).first == report_error::reason::malformed);
}

TEST_CASE("the trace holds extreme timestamps without overflow", "[debug][merge]") {
    rank_report r;
    r.platform = "host";
    r.started_unix_ns = INT64_MIN;
    r.timeline.push_back(timeline_sample{INT64_MIN, {{"a", 1}}});
    r.timeline.push_back(timeline_sample{INT64_MAX, {{"a", 2}}});
    const auto events = counter_events(json::parse(to_perfetto_trace({r})));
    REQUIRE(events.size() == 2);
    CHECK(events[0].find("ts")->as_number() == 0);
    CHECK(events[1].find("ts")->as_number() == Approx(18446744073709551.615)); // (2^64 - 1) ns in µs
}

TEST_CASE("the trace grows with the timeline, not with samples x owners", "[debug][merge]") {
    // Each of 300 owners lives in one sample only: 300 entries in, at most 2 events per entry out
    // (its value, and a 0 where it disappears).
    constexpr std::size_t samples = 300;
    rank_report r;
    r.platform = "host";
    for (std::size_t i = 0; i < samples; ++i) {
        r.timeline.push_back(timeline_sample{static_cast<std::int64_t>(i * 1000), {{"o" + std::to_string(i), i + 1}}});
    }
    const auto events = counter_events(json::parse(to_perfetto_trace({r})));
    CHECK(events.size() <= 2 * samples);
    // Each owner's track: its bytes at its sample, 0 from the next one on.
    std::map<std::string, std::vector<std::pair<double, std::uint64_t>>> tracks;
    for (const auto& e : events) {
        const auto bytes = e.find("args")->find("live_bytes")->as_integer<std::uint64_t>();
        REQUIRE(bytes.has_value());
        tracks[e.find("name")->as_string()].emplace_back(e.find("ts")->as_number(), *bytes);
    }
    REQUIRE(tracks.size() == samples);
    for (std::size_t i = 0; i < samples; ++i) {
        const auto& t = tracks["o" + std::to_string(i)];
        INFO(i);
        REQUIRE(!t.empty());
        const std::pair<double, std::uint64_t> first{static_cast<double>(i), i + 1};
        CHECK(t.front() == first);
        if (i + 1 < samples) {
            REQUIRE(t.size() >= 2);
            const std::pair<double, std::uint64_t> gone{static_cast<double>(i + 1), 0};
            CHECK(t[1] == gone);
        }
    }
}

TEST_CASE("a report is written as a new file: links planted at its name are never written through",
          "[debug][json]") {
    const rank_report r = sample_report(0, 1, 2);
    scratch_file victim("report-victim", custody_test::victim_text);
    scratch_file hard_victim("report-hard-victim", custody_test::victim_text);
    scratch_file at("report-at.json");
    for (int k = 0; k < 3; ++k) {
        INFO("planted: " << (k == 0 ? "a symbolic link" : k == 1 ? "a hard link" : "a link at the temporary name"));
        std::filesystem::remove(at.path);
        if (k == 0) REQUIRE(custody_test::plant_symlink(victim.path, at.path));
        if (k == 1) REQUIRE(custody_test::plant_hard_link(hard_victim.path, at.path));
        if (k == 2) REQUIRE(custody_test::plant_symlink(victim.path, custody_test::old_temporary_name(at.path)));
        write_json_report(r, at.path);
        CHECK(custody_test::file_text(victim.path) == custody_test::victim_text);
        CHECK(custody_test::file_text(hard_victim.path) == custody_test::victim_text);
        CHECK(custody_test::is_own_regular_file(at.path));
        CHECK(parse_rank_report(custody_test::file_text(at.path)).tracker == "rank0");
        std::filesystem::remove(custody_test::old_temporary_name(at.path));
    }
    // A report that cannot be written leaves the name as it was.
    CHECK_THROWS_AS(write_json_report(r, "/nonexistent-dir/report.json"), custody::error);
}
