// A console reporter for the staging benchmarks that, after the usual table, prints each ring
// peer's throughput as a ratio to the baselines measured in the same run.
//
// Names are "<scenario>/<peer>/<bytes>/real_time"; for every scenario and size, each peer whose
// name starts with "ring" is divided by each baseline peer present (e.g. "ceiling").
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace custody::bench {

class ratio_reporter : public benchmark::ConsoleReporter {
public:
    explicit ratio_reporter(std::vector<std::string> baselines) : baselines_(std::move(baselines)) {}

    void ReportRuns(const std::vector<Run>& runs) override {
        ConsoleReporter::ReportRuns(runs);
        for (const Run& run : runs) {
            if (failed(run)) continue;
            // With --benchmark_repetitions, the median stands for the size; else each run does.
            if (run.run_type == Run::RT_Aggregate && run.aggregate_name != "median") continue;
            if (run.run_type == Run::RT_Iteration && run.repetitions > 1) continue;
            std::string name = run.run_name.str();
            if (const auto rt = name.rfind("/real_time"); rt != std::string::npos) name.erase(rt);
            const auto last = name.rfind('/');
            const auto mid = last == std::string::npos ? std::string::npos : name.rfind('/', last - 1);
            if (mid == std::string::npos) continue;
            const std::string scenario = name.substr(0, mid);
            const std::string peer = name.substr(mid + 1, last - mid - 1);
            const std::string size_text = name.substr(last + 1);
            char* end = nullptr;
            const unsigned long long size = std::strtoull(size_text.c_str(), &end, 10);
            double value = 0;
            if (auto it = run.counters.find("bytes_per_second"); it != run.counters.end()) {
                value = it->second.value;
            } else {
                value = 1.0 / (run.GetAdjustedRealTime() * unit_ns(run.time_unit)); // ops per ns
            }
            results_[{scenario, size}][peer] = value;
            ns_[{scenario, size}][peer] = run.GetAdjustedRealTime() * unit_ns(run.time_unit);
            cpu_ns_[{scenario, size}][peer] = run.GetAdjustedCPUTime() * unit_ns(run.time_unit);
        }
    }

    void Finalize() override {
        ConsoleReporter::Finalize();
        std::printf("\nratios (same run; > 1 means the ring is faster)\n");
        for (const auto& [key, peers] : results_) {
            const auto& [scenario, size] = key;
            for (const auto& [peer, value] : peers) {
                if (peer.rfind("ring", 0) != 0) continue;
                for (const std::string& base : baselines_) {
                    const auto b = peers.find(base);
                    if (b == peers.end()) continue;
                    std::printf("  %-28s %12llu B  %-16s / %-22s = %6.3f\n", scenario.c_str(), size, peer.c_str(),
                                base.c_str(), value / b->second);
                }
                std::printf("  %-28s %12llu B  %-16s %.1f ns per iteration (%.1f ns of CPU in this thread)\n",
                            scenario.c_str(), size, peer.c_str(), ns_[key][peer], cpu_ns_[key][peer]);
            }
        }
    }

private:
    // Google Benchmark 1.8 replaced Run::error_occurred with Run::skipped; take either.
    template <class R>
    static bool failed(const R& run) {
        if constexpr (requires { run.error_occurred; }) {
            return run.error_occurred;
        } else {
            return static_cast<int>(run.skipped) != 0;
        }
    }

    static double unit_ns(benchmark::TimeUnit unit) {
        switch (unit) {
        case benchmark::kNanosecond: return 1.0;
        case benchmark::kMicrosecond: return 1e3;
        case benchmark::kMillisecond: return 1e6;
        case benchmark::kSecond: return 1e9;
        }
        return 1.0;
    }

    std::vector<std::string> baselines_;
    std::map<std::tuple<std::string, unsigned long long>, std::map<std::string, double>> results_;
    std::map<std::tuple<std::string, unsigned long long>, std::map<std::string, double>> ns_;
    std::map<std::tuple<std::string, unsigned long long>, std::map<std::string, double>> cpu_ns_;
};

} // namespace custody::bench
