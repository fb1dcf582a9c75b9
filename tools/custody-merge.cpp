// custody-merge: merges the per-rank JSON reports of custody::debug::tracking_resource into one
// cross-rank table (owners x ranks, max, mean, max/mean) and a Chrome/Perfetto trace.
//
//   custody-merge [--table FILE] [--trace FILE] [--threshold X] [--fail-on-imbalance] REPORT...
//
// Exit status: 0 merged; 1 usage error; 2 a report is missing, truncated, malformed or does not
// fit with the others (the message names the file and the reason); 3 --fail-on-imbalance and an
// owner's max/mean is above the threshold.
#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* usage =
    "usage: custody-merge [--table FILE] [--trace FILE] [--threshold X] [--fail-on-imbalance] REPORT...\n"
    "  Merges per-rank custody debug reports. Prints the owners x ranks table (or writes it to\n"
    "  --table), writes a Chrome/Perfetto trace to --trace (open it in ui.perfetto.dev).\n"
    "  --threshold X: owners whose max/mean over ranks exceeds X are marked (default 1.5).\n";

void write_file(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) throw custody::error("cannot write '" + path + "'");
}

} // namespace

int main(int argc, char** argv) {
    std::string table_path;
    std::string trace_path;
    double threshold = 1.5;
    bool fail_on_imbalance = false;
    std::vector<std::string> files;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "custody-merge: %s needs a value\n%s", argv[i], usage);
                std::exit(1);
            }
            return argv[++i];
        };
        if (arg == "--table") {
            table_path = value();
        } else if (arg == "--trace") {
            trace_path = value();
        } else if (arg == "--threshold") {
            const std::string v = value();
            char* end = nullptr;
            threshold = std::strtod(v.c_str(), &end);
            if (end == v.c_str() || *end != '\0' || !(threshold >= 1.0)) {
                std::fprintf(stderr, "custody-merge: --threshold takes a number >= 1, not '%s'\n", v.c_str());
                return 1;
            }
        } else if (arg == "--fail-on-imbalance") {
            fail_on_imbalance = true;
        } else if (arg == "-h" || arg == "--help") {
            std::fputs(usage, stdout);
            return 0;
        } else if (arg.starts_with("--")) {
            std::fprintf(stderr, "custody-merge: unknown option '%s'\n%s", argv[i], usage);
            return 1;
        } else {
            files.emplace_back(arg);
        }
    }
    if (files.empty()) {
        std::fputs(usage, stderr);
        return 1;
    }
    try {
        std::vector<custody::debug::rank_report> reports;
        reports.reserve(files.size());
        for (const auto& f : files) reports.push_back(custody::debug::read_rank_report(f));
        const custody::debug::cross_rank_view view = custody::debug::merge_reports(reports, files);
        const std::string table = custody::debug::format_table(view, threshold);
        if (table_path.empty()) {
            std::fputs(table.c_str(), stdout);
        } else {
            write_file(table_path, table);
        }
        if (!trace_path.empty()) write_file(trace_path, custody::debug::to_perfetto_trace(reports));
        const auto imbalanced = view.imbalanced(threshold);
        for (const auto& o : imbalanced) {
            std::fprintf(stderr, "custody-merge: owner '%s' is imbalanced across ranks\n", o.c_str());
        }
        return fail_on_imbalance && !imbalanced.empty() ? 3 : 0;
    } catch (const custody::debug::report_error& e) {
        std::fprintf(stderr, "custody-merge: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "custody-merge: %s\n", e.what());
        return 2;
    }
}
