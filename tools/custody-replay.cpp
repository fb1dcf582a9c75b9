// custody-replay: replays an allocation trace (recorded by custody's recorder, or imported from a
// PyTorch memory snapshot or an RMM log by custody-import) through allocators named on the command
// line, side by side, and reports for each: time per operation, peak reserved, fragmentation,
// reserved and largest free block at the trace's peak, the first operation over a device capacity.
//
//   custody-replay [options] TRACE ALLOCATOR...
//
// Exit status: 0 replayed; 2 bad input (unknown allocator or option, a trace that cannot be read
// or replayed), with a message that names the place; no output file is left behind then.
#include "replay/allocators.hpp"
#include "replay/program.hpp"
#include "replay/progress.hpp"
#include "replay/replay.hpp"
#include "replay/report.hpp"
#include "replay/streams.hpp"
#include "replay/torch_library.hpp"

#include <custody/platform/host.hpp>
#include <custody/core/detail/output_file.hpp>
#include <custody/trace/reader.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

constexpr const char* usage =
    "usage: custody-replay [options] TRACE ALLOCATOR...\n"
    "  Replays TRACE (a custody trace: recorded, or made by custody-import) through each ALLOCATOR,\n"
    "  written NAME or NAME:KEY=VALUE[,KEY=VALUE...] (see --list), and prints a table per device.\n"
    "options:\n"
    "  --capacity SIZE     device capacity for 'first op over capacity' (default 80GiB)\n"
    "  --repetitions N     timed replays per allocator; the median is reported (default 5)\n"
    "  --device N          replay only the trace's device N\n"
    "  --json FILE         also write the report as JSON (FILE '-': to standard output, no table)\n"
    "  --perfetto FILE     also write live and reserved bytes as a Chrome/Perfetto trace\n"
    "  --progress          draw a progress bar on standard error (default: when it is a terminal)\n"
    "  --no-progress       never draw it\n"
    "  --list              list the allocators and their options\n"
    "exit status: 0 replayed; 2 bad input (the message names the allocator, option, file or event)\n";

struct options {
    std::string trace;
    std::vector<std::string> allocators;
    std::uint64_t capacity = std::uint64_t{80} << 30;
    int repetitions = 5;
    std::optional<int> device;
    std::string json;
    std::string perfetto;
    std::optional<bool> progress;
};

[[noreturn]] void bad_input(const std::string& what) {
    std::fprintf(stderr, "custody-replay: %s\n", what.c_str());
    std::exit(2);
}

options parse(int argc, char** argv) {
    options o;
    std::vector<std::string> positional;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const auto value = [&]() -> std::string {
            if (i + 1 >= argc) bad_input(std::string(arg) + " needs a value\n" + usage);
            return argv[++i];
        };
        const auto integer = [&](int lowest) {
            const std::string v = value();
            int n = 0;
            const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
            if (v.empty() || ec != std::errc{} || end != v.data() + v.size() || n < lowest) {
                bad_input(std::string(arg) + " takes an integer of at least " + std::to_string(lowest) + ", not '" + v + "'");
            }
            return n;
        };
        if (arg == "-h" || arg == "--help") {
            std::fputs(usage, stdout);
            std::exit(0);
        } else if (arg == "--list") {
            std::vector<custody::replay::allocator_info> entries = custody::replay::catalog();
            entries.push_back(custody::replay::torch_library_info);
            for (const auto& e : entries) {
                std::printf("%-14s %-5s %s\n", std::string(e.name).c_str(), std::string(e.platform).c_str(),
                            std::string(e.summary).c_str());
                if (!e.options.empty()) std::printf("%-20s options: %s\n", "", std::string(e.options).c_str());
            }
            std::exit(0);
        } else if (arg == "--capacity") {
            const std::string v = value();
            const auto bytes = custody::replay::allocator_spec::parse_byte_count(v);
            if (!bytes || *bytes == 0) bad_input("--capacity takes a size such as 80GiB, not '" + v + "'");
            o.capacity = *bytes;
        } else if (arg == "--repetitions") {
            o.repetitions = integer(1);
        } else if (arg == "--device") {
            o.device = integer(-1);
        } else if (arg == "--json") {
            o.json = value();
        } else if (arg == "--perfetto") {
            o.perfetto = value();
        } else if (arg == "--progress") {
            o.progress = true;
        } else if (arg == "--no-progress") {
            o.progress = false;
        } else if (arg.starts_with("-") && arg != "-") {
            bad_input("unknown option '" + std::string(arg) + "'\n" + usage);
        } else {
            positional.emplace_back(arg);
        }
    }
    if (positional.size() < 2) bad_input(std::string(positional.empty() ? "no trace" : "no allocator") + " given\n" + usage);
    o.trace = positional.front();
    o.allocators.assign(positional.begin() + 1, positional.end());
    return o;
}

std::string machine() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line, model;
    while (std::getline(cpuinfo, line)) {
        if (line.starts_with("model name")) {
            model = line.substr(line.find(':') + 2);
            break;
        }
    }
    const unsigned cores = std::thread::hardware_concurrency();
    return (model.empty() ? std::string("unknown CPU") : model) + ", " + std::to_string(cores) + " cores";
}

std::string today() {
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char buf[16];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", &utc);
    return buf;
}

} // namespace

int main(int argc, char** argv) {
    using namespace custody;
    const options o = parse(argc, argv);
    try {
        // Every allocator and option is checked before the trace is read.
        std::vector<replay::driver_factory> factories;
        for (const auto& text : o.allocators) factories.push_back(replay::plan_any(replay::allocator_spec(text)));
        // The output files are created up front (under temporary names), so a path that cannot be
        // written fails before the replay rather than after it.
        std::optional<custody::detail::output_file> json_file, perfetto_file;
        if (!o.json.empty()) json_file.emplace(o.json);
        if (!o.perfetto.empty()) perfetto_file.emplace(o.perfetto);

        trace::reader in(o.trace);
        replay::compile_options co;
        co.only_device = o.device;
        const replay::program program = replay::compile(in, co);
        if (program.devices.empty()) {
            throw error("trace '" + o.trace + "': no allocation to replay" +
                        (o.device ? " on device " + std::to_string(*o.device) : std::string()));
        }
        int highest = 0;
        for (const auto& d : program.devices) highest = std::max(highest, replay::host_device_of(d.device));
        // The host platform numbers its devices with an int: its count, highest + 1, must be one.
        if (highest == std::numeric_limits<int>::max()) {
            throw error("trace '" + o.trace + "': device " + std::to_string(highest) +
                        " is beyond the host platform's devices (0 .. " + std::to_string(highest - 1) + ")");
        }
        if (highest >= host::platform::device_count()) host::set_device_count(highest + 1);

        replay::report r;
        r.trace = &program;
        r.capacity = o.capacity;
        r.repetitions = o.repetitions;
        r.machine = machine();
        r.date = today();
        replay::progress bar(o.progress.value_or(::isatty(STDERR_FILENO) == 1));
        std::uint64_t work = 0;
        for (const auto& d : program.devices) {
            work += d.ops.size() * factories.size() * (1 + static_cast<std::uint64_t>(o.repetitions)); // progress only
        }
        bar.total(work);
        replay::run_options ro;
        ro.capacity = o.capacity;
        for (const auto& p : program.devices) {
            replay::device_result d;
            d.program = &p;
            if (p.reference) d.reference = replay::reference_figures(p, o.capacity);
            replay::stream_pool streams(p);
            for (std::size_t a = 0; a < factories.size(); ++a) {
                replay::allocator_result result;
                result.spec = o.allocators[a];
                const std::unique_ptr<replay::driver> driver = factories[a](p, streams);
                bar.label(result.spec + ", device " + std::to_string(p.device) + ": measuring");
                result.m = driver->measure(p, ro, bar);
                for (int k = 0; k < o.repetitions; ++k) {
                    bar.label(result.spec + ", device " + std::to_string(p.device) + ": timed replay " +
                              std::to_string(k + 1) + " of " + std::to_string(o.repetitions));
                    result.seconds.push_back(driver->timed(p));
                    bar.advance(p.ops.size());
                }
                const double median = replay::median(result.seconds);
                result.ns_per_op = p.ops.empty() ? 0.0 : median * 1e9 / static_cast<double>(p.ops.size());
                d.allocators.push_back(std::move(result));
            }
            r.devices.push_back(std::move(d));
        }
        bar.finish();
        if (o.json != "-") std::fputs(replay::format_table(r).c_str(), stdout);
        if (json_file) {
            json_file->write(replay::to_json(r));
            json_file->commit();
        }
        if (perfetto_file) {
            perfetto_file->write(replay::to_perfetto(r));
            perfetto_file->commit();
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "custody-replay: %s\n", e.what());
        return 2;
    }
}
