// The instruction counter's driver: runs one workload of scenarios.hpp through one peer, warm
// first, then once more inside measured(), the only function callgrind collects (instructions.py
// runs it as `valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured*'`).
// Prints the operations measured ("ops N"); the peer `none` (hands out one address, keeps
// nothing) gives the workload's own instructions, which instructions.py subtracts.
//
//   bench_pool_ops SCENARIO PEER [STREAMS]
//   SCENARIO: pair:BYTES, churn, trace, trace_unbucketed, llm; PEER: pool, pool_checked,
//   pool_capture_calls, pool_graph_kept, malloc, pmr_unsync, pmr_sync, jemalloc, mimalloc, lifo, none;
//   STREAMS: how many streams the thread takes in turn (1 by default)
// jemalloc loads only when glibc keeps static TLS for it: instructions.py sets GLIBC_TUNABLES.
#include "peers.hpp"
#include "scenarios.hpp"

#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

namespace {

using namespace custody_bench;

/// Hands out one address and keeps nothing: the workloads' own cost.
struct none_peer {
    static constexpr const char* name = "none";
    static constexpr bool has_streams = false;
    static constexpr bool thread_safe = true;
    static bool available() { return true; }
    void* allocate(stream, std::size_t, std::size_t) {
        void* p = reinterpret_cast<void*>(alignment);
        asm volatile("" : "+r"(p)); // kept as a call would: the workload around it is what is counted
        return p;
    }
    void deallocate(stream, void* p, std::size_t, std::size_t) { asm volatile("" : : "r"(p)); }
};

/// The only function callgrind collects.
template <class F>
[[gnu::noinline]] void measured(F&& f) {
    f();
    asm volatile("" : : : "memory");
}

template <class Peer>
std::size_t run(std::string_view scenario, int streams) {
    Peer r;
    counted<Peer> c{r};
    const thread_streams t(0, streams);
    const std::span<const stream> s(t.compute);
    if (scenario.starts_with("pair:")) {
        const auto bytes = static_cast<std::size_t>(std::strtoull(scenario.data() + 5, nullptr, 10));
        constexpr std::size_t n = 100000;
        pairs(r, s, bytes, 1000); // the peer itself: a pair's two operations are known
        measured([&] { pairs(r, s, bytes, n); });
        c.ops = 2 * n;
    } else if (scenario == "churn") {
        churn_state<counted<Peer>> w(c, s, 42);
        for (int i = 0; i < 20000; ++i) w.step();
        c.ops = 0;
        measured([&] {
            for (int i = 0; i < 20000; ++i) w.step();
        });
    } else if (scenario == "trace" || scenario == "trace_unbucketed") {
        trace_state<counted<Peer>> w(c, s, scenario == "trace");
        for (int i = 0; i < 256; ++i) w.step();
        c.ops = 0;
        measured([&] {
            for (int i = 0; i < 256; ++i) w.step();
        });
    } else if (scenario == "llm") {
        for (int i = 0; i < 2; ++i) llm_request(c, t);
        c.ops = 0;
        measured([&] {
            for (int i = 0; i < 4; ++i) llm_request(c, t);
        });
    } else {
        std::fprintf(stderr, "unknown scenario %.*s\n", static_cast<int>(scenario.size()), scenario.data());
        std::exit(2);
    }
    return c.ops;
}

template <class Peer>
bool try_peer(std::string_view name, std::string_view scenario, int streams) {
    if (name != Peer::name) return false;
    if (!Peer::available()) {
        say_missing_peers();
        std::exit(77);
    }
    std::printf("ops %zu\n", run<Peer>(scenario, streams));
    return true;
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s SCENARIO PEER [STREAMS]\n", argv[0]);
        return 2;
    }
    const std::string_view scenario = argv[1], peer = argv[2];
    const int streams = argc > 3 ? std::atoi(argv[3]) : 1;
    if (streams < 1 || streams > 15) {
        std::fprintf(stderr, "STREAMS: 1 .. 15\n");
        return 2;
    }
    const bool known = try_peer<pool_peer<pool_variant::plain>>(peer, scenario, streams) ||
                       try_peer<pool_peer<pool_variant::checked>>(peer, scenario, streams) ||
                       try_peer<pool_peer<pool_variant::capture_calls>>(peer, scenario, streams) ||
                       try_peer<pool_peer<pool_variant::graph_kept>>(peer, scenario, streams) ||
                       try_peer<malloc_peer>(peer, scenario, streams) || try_peer<pmr_unsync_peer>(peer, scenario, streams) ||
                       try_peer<pmr_sync_peer>(peer, scenario, streams) || try_peer<jemalloc_peer>(peer, scenario, streams) ||
                       try_peer<mimalloc_peer>(peer, scenario, streams) || try_peer<lifo_peer>(peer, scenario, streams) ||
                       try_peer<none_peer>(peer, scenario, streams);
    if (!known) {
        std::fprintf(stderr, "unknown peer %s\n", argv[2]);
        return 2;
    }
    return 0;
}
