// The reporter of the sleep benchmarks: after the usual table, every figure in GiB/s, and each
// offload peer's throughput as a share of the copies of its direction and size measured in the
// same run ("sleep/offload/N" against "copy/out/N" and "copy/out_fresh/N", "wake/offload/N"
// against "copy/in/N" and "copy/in_fresh/N", where present).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace custody::bench {

class throughput_reporter : public benchmark::ConsoleReporter {
public:
    void ReportRuns(const std::vector<Run>& runs) override {
        ConsoleReporter::ReportRuns(runs);
        for (const Run& run : runs) {
            if (run.error_occurred) continue;
            // With --benchmark_repetitions, the median stands for the size; else each run does.
            if (run.run_type == Run::RT_Aggregate && run.aggregate_name != "median") continue;
            if (run.run_type == Run::RT_Iteration && run.repetitions > 1) continue;
            const auto it = run.counters.find("bytes_per_second");
            if (it == run.counters.end()) continue;
            std::string name = run.run_name.str();
            if (const auto rt = name.find("/manual_time"); rt != std::string::npos) name.erase(rt);
            rates_[name] = it->second.value;
        }
    }
    void Finalize() override {
        ConsoleReporter::Finalize();
        std::printf("\nGiB/s, and offload as a share of the copies of the same direction and size (same run)\n");
        for (const auto& [name, rate] : rates_) {
            const auto first = name.find('/');
            const auto second = name.find('/', first + 1);
            const std::string op = name.substr(0, first);
            const std::string peer = name.substr(first + 1, second - first - 1);
            const std::string size = name.substr(second + 1);
            std::printf("  %-36s %8.2f GiB/s", name.c_str(), rate / double(1ULL << 30));
            const std::string direction = op == "sleep" ? "out" : "in";
            if (peer.rfind("offload", 0) == 0) {
                for (const std::string& base : {"copy/" + direction + "/" + size, "copy/" + direction + "_fresh/" + size}) {
                    if (rates_.contains(base)) std::printf("   %.2f of %s", rate / rates_[base], base.c_str());
                }
            }
            std::printf("\n");
        }
    }

private:
    std::map<std::string, double> rates_;
};

} // namespace custody::bench
