// custody-trace: looks into custody allocation traces and converts them to and from their lossless
// CSV form.
//
//   custody-trace info TRACE            the metadata, the tables and counts of what the trace holds
//   custody-trace csv TRACE [OUT]       the trace as CSV (to OUT, or standard output)
//   custody-trace from-csv CSV OUT      a trace from its CSV form (docs/trace-format.md)
//
// Exit status: 0 done; 2 a trace or CSV that cannot be read, or a file that cannot be written (the
// message names the file, and the byte, event or line); no partial output file is left behind.
#include <custody/trace/csv.hpp>
#include <custody/core/detail/output_file.hpp>
#include <custody/trace/event.hpp>
#include <custody/trace/reader.hpp>
#include <custody/trace/writer.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <string_view>

namespace {

constexpr const char* usage =
    "usage: custody-trace info TRACE\n"
    "       custody-trace csv TRACE [OUT]\n"
    "       custody-trace from-csv CSV OUT\n"
    "  info: the trace's metadata, threads, owners and counts by kind, device and stream.\n"
    "  csv: the trace as CSV, lossless (to OUT, or standard output).\n"
    "  from-csv: the trace back from its CSV form.\n";

void info(const std::string& path) {
    using namespace custody::trace;
    reader r(path);
    std::uint64_t kinds[event_kind_count] = {};
    std::map<std::int32_t, std::uint64_t> devices;
    std::set<std::pair<std::int32_t, std::uint64_t>> streams;
    std::int64_t first = 0, last = 0;
    event e;
    while (r.next(e)) {
        if (e.sequence == 1) first = e.time_ns;
        last = e.time_ns;
        ++kinds[static_cast<int>(e.kind)];
        ++devices[e.device];
        streams.emplace(e.device, e.stream);
    }
    std::printf("trace %s: %llu events over %.3f ms\n", path.c_str(), static_cast<unsigned long long>(r.events_read()),
                static_cast<double>(last - first) / 1e6);
    for (const auto& [k, v] : r.header().metadata) std::printf("  %s = %s\n", k.c_str(), v.c_str());
    for (int k = 0; k < event_kind_count; ++k) {
        if (kinds[k] != 0) {
            std::printf("  %-19s %llu\n", std::string(to_string(static_cast<event_kind>(k))).c_str(),
                        static_cast<unsigned long long>(kinds[k]));
        }
    }
    for (const auto& [d, n] : devices) {
        const auto count = std::count_if(streams.begin(), streams.end(), [d = d](const auto& s) { return s.first == d; });
        std::printf("  device %d: %llu events on %lld streams\n", d, static_cast<unsigned long long>(n),
                    static_cast<long long>(count));
    }
    std::printf("  threads: %zu, owners: %zu\n", r.header().threads.size(), r.header().owners.size());
}

void to_csv(const std::string& path, const std::string& out_path) {
    custody::detail::output_file out(out_path.empty() ? "-" : out_path);
    custody::trace::write_csv(path, [&out](std::string_view text) { out.write(text); });
    out.commit();
}

void from_csv(const std::string& csv_path, const std::string& out_path) {
    using namespace custody::trace;
    std::ifstream in(csv_path);
    if (!in) throw custody::error("cannot open '" + csv_path + "'");
    csv_reader r(in, csv_path);
    custody::detail::output_file out(out_path);
    writer w;
    for (const auto& [k, v] : r.header().metadata) w.metadata(k, v);
    for (const auto& t : r.header().threads) w.thread(t);
    for (const auto& o : r.header().owners) w.owner(o);
    event e;
    while (r.next(e)) {
        w.write(e);
        if (w.buffered() >= (std::size_t{1} << 20)) out.write(w.take());
    }
    w.finish();
    out.write(w.take());
    out.commit();
}

} // namespace

int main(int argc, char** argv) {
    const std::string_view command = argc > 1 ? argv[1] : "";
    if (command == "-h" || command == "--help") {
        std::fputs(usage, stdout);
        return 0;
    }
    try {
        if (command == "info" && argc == 3) {
            info(argv[2]);
        } else if (command == "csv" && (argc == 3 || argc == 4)) {
            to_csv(argv[2], argc == 4 ? argv[3] : "");
        } else if (command == "from-csv" && argc == 4) {
            from_csv(argv[2], argv[3]);
        } else {
            std::fputs(usage, stderr);
            return 2;
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "custody-trace: %s\n", e.what());
        return 2;
    }
    return 0;
}
