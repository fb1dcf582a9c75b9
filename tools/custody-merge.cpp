// custody-merge: merges the per-rank JSON reports of custody::debug::tracking_resource into one
// cross-rank table (owners x ranks, max, mean, max/mean), the forecast of the owners whose floor
// rises (each rank's rate and time left, the rank that runs out first, an owner growing on one
// rank only), the largest live groups of each rank with their call stacks, and a Chrome/Perfetto
// trace. Frames a rank could not symbolize
// ("unsymbolized [MODULE+0xOFFSET]") are symbolized here from their modules, found at the
// recorded path or by file name under a --symbols directory.
//
//   custody-merge [--table FILE] [--trace FILE] [--threshold X] [--fail-on-imbalance]
//                 [--stacks N] [--symbols DIR]... REPORT...
//
// Exit status: 0 merged; 1 usage error; 2 a report is missing, truncated, malformed or does not
// fit with the others (the message names the file and the reason); 3 --fail-on-imbalance and an
// owner's max/mean is above the threshold.
#include <custody/core/detail/output_file.hpp>
#include <custody/debug/json_report.hpp>
#include <custody/debug/merge.hpp>
#include <custody/debug/detail/symbolizer.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* usage =
    "usage: custody-merge [--table FILE] [--trace FILE] [--threshold X] [--fail-on-imbalance]\n"
    "                     [--stacks N] [--symbols DIR]... REPORT...\n"
    "  Merges per-rank custody debug reports. Prints the owners x ranks table, the forecast of\n"
    "  the owners whose floor rises (rate and time left per rank) and the largest live groups of\n"
    "  each rank with their call stacks (or writes them to --table), writes a Chrome/Perfetto\n"
    "  trace to --trace (open it in ui.perfetto.dev).\n"
    "  --threshold X: owners whose max/mean over ranks exceeds X are marked (default 1.5).\n"
    "  --stacks N: call stacks of the N largest live groups of each rank (default 3; 0: none);\n"
    "  the groups left out are counted with their bytes.\n"
    "  --symbols DIR: where to find the programs and libraries named by unsymbolized frames\n"
    "  (by file name) when reports come from another machine; may be given more than once.\n";

/// Symbolizes the reports' unsymbolized frames in place (and starts each stack at the
/// application). Returns a note on the frames of the printed stacks (the `n` per rank) that still
/// read MODULE+0xOFFSET, and why ("" when none do): information, not an error; the frames keep
/// their module and offset, which addr2line takes.
std::string symbolize_reports(std::vector<custody::debug::rank_report>& reports,
                              const std::vector<std::string>& symbol_dirs, std::size_t n) {
    namespace detail = custody::debug::detail;
    detail::symbolizer symbols(symbol_dirs);
    std::size_t left = 0;
    std::set<std::string> not_found;
    std::set<std::string> no_symbols;
    for (auto& r : reports) {
        std::size_t shown = 0;
        for (auto& g : r.live.groups) {
            const std::size_t unsymbolized = detail::symbolize_lines(symbols, g.stack);
            if (!custody::debug::detail::stack_printed(g, n, shown)) continue;
            left += unsymbolized;
            for (const auto& line : g.stack) {
                const auto at = detail::is_unsymbolized(line) ? detail::frame_location(line) : std::nullopt;
                if (!at) continue;
                (symbols.find_file(at->module).empty() ? not_found : no_symbols).insert(at->module.empty() ? "?" : at->module);
            }
        }
    }
    if (left == 0) return {};
    const auto list = [](const std::set<std::string>& modules) {
        std::string s;
        for (const auto& m : modules) s += (s.empty() ? "" : ", ") + m;
        return s;
    };
    std::string note = "note: " + std::to_string(left) + (left == 1 ? " frame" : " frames") +
                       " below show only their module and offset (addr2line -e MODULE OFFSET reads them)";
    if (!detail::symbolizer::available) return note + ": this custody-merge was built without libdw";
    if (!no_symbols.empty()) note += "; no debug information here for " + list(no_symbols);
    if (!not_found.empty()) note += "; not on this machine (--symbols DIR finds them by file name): " + list(not_found);
    return note;
}

} // namespace

int main(int argc, char** argv) {
    std::string table_path;
    std::string trace_path;
    double threshold = 1.5;
    bool fail_on_imbalance = false;
    std::size_t stacks = 3;
    std::vector<std::string> symbol_dirs;
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
        } else if (arg == "--stacks") {
            const std::string v = value();
            char* end = nullptr;
            const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
            if (v.empty() || v[0] == '-' || *end != '\0' || n > 1000000) {
                std::fprintf(stderr, "custody-merge: --stacks takes a count, not '%s'\n", v.c_str());
                return 1;
            }
            stacks = static_cast<std::size_t>(n);
        } else if (arg == "--symbols") {
            symbol_dirs.push_back(value());
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
        std::string table = custody::debug::format_table(view, threshold);
        if (stacks > 0) {
            const std::string note = symbolize_reports(reports, symbol_dirs, stacks);
            if (!note.empty()) std::fprintf(stderr, "custody-merge: %s\n", note.c_str());
            table += custody::debug::format_stacks(reports, stacks);
        }
        if (table_path.empty()) {
            std::fputs(table.c_str(), stdout);
        } else {
            custody::detail::write_file(table_path, table);
        }
        if (!trace_path.empty()) custody::detail::write_file(trace_path, custody::debug::to_perfetto_trace(reports));
        const auto imbalanced = view.imbalanced(threshold);
        for (const auto& o : imbalanced) {
            std::fprintf(stderr, "custody-merge: owner '%s' is imbalanced across ranks\n", o.c_str());
        }
        for (const auto& f : view.forecasts) {
            const auto only = f.only_rank(view.world_size);
            std::string where = only ? "on rank " + std::to_string(*only) + " only"
                                     : "on " + std::to_string(f.rising.size()) + " ranks";
            if (f.first_out) {
                where += "; rank " + std::to_string(*f.first_out) + " runs out first, in " +
                         custody::debug::detail::forecast_cell(f.at(*f.first_out), 2);
            }
            std::fprintf(stderr, "custody-merge: owner '%s' leaks slowly %s\n", f.owner.c_str(), where.c_str());
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
