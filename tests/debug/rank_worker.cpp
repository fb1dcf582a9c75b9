// One rank of the multi-rank test: reads its rank from the environment (RANK, LOCAL_RANK,
// WORLD_SIZE), runs a few "inference steps" through a tracking resource over its virtual device,
// then 20 decode steps with a trend sample each, and writes its report to DIR/rank-R.json. Rank 2
// holds a planted extra KV cache; rank 1's output keeps 128 B a decode step (a slow leak).
//
//   rank_worker DIR                     write this rank's report
//   rank_worker --check-trace FILE N    check that a merged trace has N ranks and the owners' tracks
#include <custody/debug/detail/json.hpp>
#include <custody/debug/json_report.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/core/rank.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace custody;
using namespace custody::debug;
namespace json = custody::debug::detail::json;

int fail(const std::string& what) {
    std::fprintf(stderr, "rank_worker: %s\n", what.c_str());
    return 1;
}

int check_trace(const std::string& path, int ranks) {
    std::ifstream in(path);
    std::ostringstream text;
    text << in.rdbuf();
    const json::value trace = json::parse(text.str());
    std::set<std::string> processes;
    std::map<int, std::set<std::string>> tracks;
    for (const auto& e : trace.find("traceEvents")->as_array()) {
        const std::string& ph = e.find("ph")->as_string();
        const int pid = static_cast<int>(e.find("pid")->as_number());
        if (ph == "M" && e.find("name")->as_string() == "process_name") {
            processes.insert(e.find("args")->find("name")->as_string());
        } else if (ph == "C") {
            tracks[pid].insert(e.find("name")->as_string());
        }
    }
    if (static_cast<int>(processes.size()) != ranks) return fail("expected " + std::to_string(ranks) + " processes");
    const std::set<std::string> owners{"data_loading", "prefill", "decode/kv_cache", "output"};
    for (int r = 0; r < ranks; ++r) {
        if (processes.count("rank " + std::to_string(r)) == 0) return fail("no process for rank " + std::to_string(r));
        if (tracks[r + 1] != owners) return fail("rank " + std::to_string(r) + " lacks an owner's counter track");
    }
    std::printf("trace: %d processes, %zu counter tracks each\n", ranks, owners.size());
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    if (argc == 4 && std::string(argv[1]) == "--check-trace") return check_trace(argv[2], std::stoi(argv[3]));
    if (argc != 2) return fail("usage: rank_worker DIR | --check-trace FILE N");
    const rank_info rank = detect_rank();
    if (rank.source != "torchrun") return fail("RANK is not set");
    tracking_options o;
    o.name = "rank" + std::to_string(rank.rank);
    o.rank = rank;
    o.on_leak = policy::ignore;
    o.trend.levels = 1; // one time scale of 16 samples: the 20 decode steps below show a rise
    tracking_resource<host::simulated_device_memory> t(o, rank.local_rank % host::platform::device_count(),
                                                          std::size_t{1} << 30);
    host::stream stream(rank.local_rank % host::platform::device_count());
    std::vector<std::pair<void*, std::size_t>> cache;
    for (int step = 0; step < 3; ++step) {
        {
            owner_scope s("data_loading");
            void* batch = t.allocate(stream, 4096, 256);
            t.deallocate(stream, batch, 4096, 256);
            cache.emplace_back(t.allocate(stream, 1024, 256), 1024); // pinned batch kept
        }
        {
            owner_scope s("prefill");
            cache.emplace_back(t.allocate(stream, 2048, 256), 2048);
        }
        {
            owner_scope s("decode");
            owner_scope kv("kv_cache");
            const std::size_t kv_bytes = rank.rank == 2 ? 16384 : 4096; // the planted imbalance
            cache.emplace_back(t.allocate(stream, kv_bytes, 256), kv_bytes);
        }
        {
            owner_scope s("output");
            cache.emplace_back(t.allocate(stream, 512, 256), 512);
        }
        static_cast<void>(t.snapshot());
    }
    for (int step = 0; step < 20; ++step) {
        {
            owner_scope s("decode");
            owner_scope kv("kv_cache");
            t.deallocate(stream, t.allocate(stream, 8192, 256), 8192, 256);
        }
        if (rank.rank == 1) {
            owner_scope s("output");
            cache.emplace_back(t.allocate(stream, 128, 256), 128); // the slow leak
        }
        t.sample();
    }
    const std::string path = std::string(argv[1]) + "/" + report_file_name(rank);
    write_json_report(t.make_report(), path);
    for (auto [p, n] : cache) t.deallocate(stream, p, n, 256);
    host::platform::synchronize(stream);
    std::printf("rank %d of %d wrote %s\n", rank.rank, rank.world_size, path.c_str());
    return 0;
}
