// Reports carry the pool: a tracker over an upstream with statistics writes the upstream's reserve
// into its rank's report (schema, reader, writer), and the merged table shows it per rank.
#include "schema_check.hpp"

#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/catch.hpp"
#include "../support/sizes.hpp"

#include <sstream>
#include <string>
#include <utility>
#include <vector>

using namespace custody;
using namespace custody::debug;
namespace json = custody::debug::detail::json;

namespace {

using custody::test::MiB;
using tracked_pool = tracking_resource<pool::stream_ordered_pool<resource::host_memory>>;

tracking_options rank_options(int rank, int world) {
    tracking_options o;
    o.name = "rank" + std::to_string(rank);
    o.rank = make_rank(rank, rank, world);
    o.on_leak = policy::ignore;
    o.canaries = false;
    return o;
}

/// A report of a tracker over a pool whose reserve is `hold` MiB while `live` MiB are live.
rank_report pooled_report(int rank, int world, std::size_t hold, std::size_t live) {
    pool::pool_options p;
    p.growth_step = 2 * MiB;
    tracked_pool t(rank_options(rank, world), p);
    void* spare = t.allocate({}, hold * MiB, 256, "cache"); // grows the pool, then goes back to it
    t.deallocate({}, spare, hold * MiB, 256);
    void* kept = t.allocate({}, live * MiB, 256, "weights");
    rank_report r = t.make_report();
    t.deallocate({}, kept, live * MiB, 256);
    return r;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
}

std::string malformed_field(const std::string& text) {
    try {
        static_cast<void>(parse_rank_report(text, "r.json"));
    } catch (const report_error& e) {
        CHECK(e.why() == report_error::reason::malformed);
        return e.what();
    }
    FAIL("the report was accepted");
    return {};
}

} // namespace

TEST_CASE("a rank's report carries its pool's reserve, and reads back", "[debug][json][upstream]") {
    const rank_report r = pooled_report(0, 1, 16, 4);
    REQUIRE(r.upstream.has_value());
    CHECK(r.upstream->resource == "stream_ordered_pool");
    CHECK(r.upstream->reserved_bytes >= 16 * MiB);
    CHECK(r.upstream->live_bytes == 4 * MiB);
    CHECK(r.upstream->peak_live_bytes == 16 * MiB);
    REQUIRE(r.upstream->largest_free_block.has_value());
    CHECK(*r.upstream->largest_free_block >= 8 * MiB);

    const std::string text = to_json(r);
    const json::value schema = test::report_schema();
    test::schema_checker checker(schema);
    const auto errors = checker.check(json::parse(text));
    for (const auto& e : errors) UNSCOPED_INFO(e);
    CHECK(errors.empty());
    CHECK(parse_rank_report(text).upstream == r.upstream);

    // An upstream without statistics: null, and the schema takes it.
    rank_report none = r;
    none.upstream.reset();
    CHECK(json::parse(to_json(none)).find("upstream")->is_null());
    CHECK(checker.check(json::parse(to_json(none))).empty());
    CHECK_FALSE(parse_rank_report(to_json(none)).upstream.has_value());
}

TEST_CASE("the reader takes a report without the upstream, and refuses a wrong one", "[debug][json][upstream]") {
    const std::string text = to_json(pooled_report(0, 1, 4, 2));
    // Written before reports carried it: no member at all.
    const auto from = text.find("\"upstream\":");
    const auto to = text.find("\"owners\":");
    REQUIRE(from != std::string::npos);
    REQUIRE(to > from);
    CHECK_FALSE(parse_rank_report(std::string(text).erase(from, to - from)).upstream.has_value());

    CHECK(malformed_field(replaced(text, "\"resource\":\"stream_ordered_pool\",", "")).find("resource") !=
          std::string::npos);
    CHECK(malformed_field(replaced(text, "\"peak_reserved_bytes\":", "\"peak_reserved_bytes\":-")).find(
              "upstream.peak_reserved_bytes") != std::string::npos);
    CHECK(malformed_field(replaced(text, "\"largest_free_block\":", "\"largest_free_block\":\"x\",\"y\":")).find(
              "largest_free_block") != std::string::npos);
    CHECK(malformed_field(replaced(text, "\"upstream\":{", "\"upstream\":7,\"x\":{")).find("upstream") != std::string::npos);
}

TEST_CASE("the merged table shows each rank's pool beside its owners", "[debug][merge][upstream]") {
    std::vector<rank_report> reports{pooled_report(0, 2, 4, 4), pooled_report(1, 2, 64, 4)};
    const cross_rank_view v = merge_reports(reports);
    REQUIRE(v.upstream.size() == 2);
    CHECK(v.upstream[1]->peak_reserved_bytes > v.upstream[0]->peak_reserved_bytes);
    const std::string table = format_table(v, 1.5);
    INFO(table);
    CHECK(table.find("upstream (stream_ordered_pool)") != std::string::npos);
    const auto row = [&](const std::string& label) {
        const auto at = table.find("\n  " + label);
        REQUIRE(at != std::string::npos);
        std::istringstream line(table.substr(at + 3 + label.size(), table.find('\n', at + 1) - at - 3 - label.size()));
        std::vector<std::string> cells;
        for (std::string c; line >> c;) cells.push_back(c);
        return cells;
    };
    const auto reserved = row("reserved");
    REQUIRE(reserved.size() == 2);
    CHECK(std::stoull(reserved[0]) == v.upstream[0]->reserved_bytes);
    CHECK(std::stoull(reserved[1]) == v.upstream[1]->reserved_bytes);
    const auto ratio = row("peak reserved/live");
    REQUIRE(ratio.size() == 2);
    CHECK(std::stod(ratio[1]) == Approx(v.upstream[1]->fragmentation()).epsilon(0.01));
    CHECK(row("largest free block").size() == 2);

    // A rank that did not report its upstream reads "-"; none reporting it: no such rows.
    reports[0].upstream.reset();
    CHECK(row("live").size() == 2);
    const std::string partial = format_table(merge_reports(reports), 1.5);
    CHECK(partial.find("                 -") != std::string::npos);
    reports[1].upstream.reset();
    CHECK(format_table(merge_reports(reports), 1.5).find("upstream") == std::string::npos);
}
