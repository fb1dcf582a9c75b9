// A libFuzzer target for what reads untrusted files: the JSON reader and writer, the report reader
// and writer, and the merge (table and Perfetto trace). The input is one or more documents
// separated by NUL bytes (JSON text holds none), so that several reports reach the merge.
//
// Besides crashes, undefined behaviour and leaks (the sanitizers), it checks properties:
//  - what the JSON reader accepts writes back as valid UTF-8 that reads back and writes the same;
//  - every report the reader accepts writes as JSON that passes docs/debug-report-schema.json and
//    reads back to the same text;
//  - the merge either succeeds or throws report_error, and its trace is JSON the reader accepts.
#include "../debug/schema_check.hpp"

#include <custody/debug/detail/json.hpp>
#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#ifndef CUSTODY_SCHEMA_PATH
#error "the build defines CUSTODY_SCHEMA_PATH (docs/debug-report-schema.json)"
#endif

namespace {

namespace json = custody::debug::detail::json;
using custody::debug::rank_report;
using custody::debug::report_error;

[[noreturn]] void broken(const char* what, std::string_view detail = {}) {
    std::fprintf(stderr, "report_fuzz: %s\n%.*s\n", what, static_cast<int>(std::min<std::size_t>(detail.size(), 2000)),
                 detail.data());
    std::abort();
}

const json::value& schema() {
    static const json::value s = [] {
        std::ifstream in(CUSTODY_SCHEMA_PATH);
        std::ostringstream text;
        text << in.rdbuf();
        return json::parse(text.str());
    }();
    return s;
}

std::string written(const json::value& v) {
    json::writer w;
    w.write(v);
    return w.take();
}

/// JSON: accepted text writes back as valid UTF-8 that reads back to the same text.
void check_json(std::string_view text) {
    json::value v;
    try {
        v = json::parse(text);
    } catch (const json::parse_error&) {
        return;
    }
    const std::string once = written(v);
    if (!json::is_valid_utf8(once)) broken("the writer wrote invalid UTF-8", once);
    json::value again;
    try {
        again = json::parse(once);
    } catch (const json::parse_error& e) {
        broken("the reader refused what the writer wrote", e.what());
    }
    if (written(again) != once) broken("a value changed through writing and reading", once);
}

/// A report: accepted, it writes as JSON that passes the schema and reads back to the same text.
bool check_report(std::string_view text, rank_report& out) {
    try {
        out = custody::debug::parse_rank_report(text, "fuzz.json");
    } catch (const report_error&) {
        return false;
    }
    const std::string once = custody::debug::to_json(out);
    const json::value doc = json::parse(once);
    custody::test::schema_checker checker(schema());
    if (const auto errors = checker.check(doc); !errors.empty()) broken("a written report fails the schema", errors[0]);
    try {
        if (custody::debug::to_json(custody::debug::parse_rank_report(once)) != once) {
            broken("a report changed through writing and reading", once);
        }
    } catch (const report_error& e) {
        broken("the reader refused a report custody wrote", e.what());
    }
    return true;
}

void check_merge(const std::vector<rank_report>& reports) {
    try {
        const auto view = custody::debug::merge_reports(reports);
        static_cast<void>(custody::debug::format_table(view, 1.5));
        static_cast<void>(view.imbalanced(1.5));
    } catch (const report_error&) {
    }
    const std::string trace = custody::debug::to_perfetto_trace(reports);
    try {
        static_cast<void>(json::parse(trace));
    } catch (const json::parse_error& e) {
        broken("the trace is not JSON", e.what());
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    std::vector<rank_report> reports;
    std::size_t start = 0;
    for (;;) {
        const std::size_t end = std::min(input.find('\0', start), input.size());
        const std::string_view part = input.substr(start, end - start);
        check_json(part);
        if (rank_report r; check_report(part, r)) reports.push_back(std::move(r));
        if (end == input.size()) break;
        start = end + 1;
    }
    if (!reports.empty()) check_merge(reports);
    return 0;
}
