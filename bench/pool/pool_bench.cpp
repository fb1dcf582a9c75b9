// The stream-ordered pool against its peers on the host platform, side by side in one run:
// glibc malloc, std::pmr::unsynchronized_pool_resource and std::pmr::synchronized_pool_resource,
// the pmr pools and custody's pool drawing from the same upstream (custody::resource::host_memory).
//
// Names are <scenario>/<resource>/<args>:
//   <scenario>/pool_checked the pool in checked mode (pool_options::checked), beside pool: its cost
//   pair/*/<bytes>          one allocate + free, 64 B .. 64 MiB, single thread
//   pair_mt/*/<bytes>       the same from 1..8 threads on one shared resource (each thread its own stream)
//   churn/*                 random sizes (log-uniform 64 B .. 4 MiB) replacing a window of 256 live blocks
//   churn_mt/*              the same from 1..8 threads
//   trace/*                 an inference-like step: per-layer activations allocated and freed, a KV
//                           cache that grows every step and is released when the request ends;
//                           batch sizes padded to CUDA-graph buckets; counter `fragmentation` =
//                           peak reserved / peak live (malloc: not observable, 0)
//   trace_unbucketed/*      the same with every batch size 1..64
//   cross_stream/*          a producer stream allocates, a consumer stream frees, 10^6 rounds of 8
//                           blocks (4 KiB .. 3 MiB); counters `reserved_MiB` and
//                           `reserved_over_peak_live`, the pool (limited to 1 GiB) under each reuse
//                           policy beside pmr
// No memory is touched: the figures are the allocators' own costs.
#include "../support/host_streams.hpp"

#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <memory_resource>
#include <random>
#include <vector>

namespace {

using pool_type = custody::pool::stream_ordered_pool<custody::resource::host_memory>;
constexpr std::size_t alignment = 256;
constexpr std::size_t MiB = std::size_t{1} << 20;

/// The pmr pools' upstream: aligned operator new (what custody::resource::host_memory is), with the bytes it holds counted so that
/// a pmr pool's reserve can be compared with custody's pool's.
class counting_upstream final : public std::pmr::memory_resource {
public:
    std::size_t peak() const noexcept { return peak_.load(); }

private:
    void* do_allocate(std::size_t bytes, std::size_t align) override {
        // pmr pools ask for chunks aligned to their block size, beyond host_memory's page maximum:
        // the same aligned operator new host_memory uses, called directly for those.
        void* p = ::operator new(bytes, std::align_val_t{std::max(align, alignment)});
        const std::size_t now = held_.fetch_add(bytes) + bytes;
        std::size_t seen = peak_.load();
        while (seen < now && !peak_.compare_exchange_weak(seen, now)) {
        }
        return p;
    }
    void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
        ::operator delete(p, std::align_val_t{std::max(align, alignment)});
        held_.fetch_sub(bytes);
    }
    bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

    std::atomic<std::size_t> held_{0};
    std::atomic<std::size_t> peak_{0};
};

std::pmr::pool_options pmr_options() {
    std::pmr::pool_options o;
    o.largest_required_pool_block = custody::pool::detail::small_threshold; // the same threshold as custody's pool
    return o;
}

using custody_bench::stream_of;

// ---- the resources, behind one small interface each --------------------------------------------

custody::pool::pool_options pool_options_checked(bool checked) {
    custody::pool::pool_options o;
    o.checked = checked;
    return o;
}

template <bool Checked>
struct basic_pool_adapter {
    static constexpr const char* name = Checked ? "pool_checked" : "pool";
    pool_type pool{pool_options_checked(Checked)};
    custody::host::stream_view stream;
    explicit basic_pool_adapter(int thread = 0) : stream(stream_of(thread)) {}
    void* allocate(std::size_t n) { return pool.allocate(stream, n, alignment); }
    void deallocate(void* p, std::size_t n) { pool.deallocate(stream, p, n, alignment); }
    double fragmentation(std::size_t) const { return pool.detailed_statistics().fragmentation(); }
};

using pool_adapter = basic_pool_adapter<false>;
using pool_checked_adapter = basic_pool_adapter<true>;

/// Whether `Adapter` is custody's pool (checked or not), which takes a stream.
template <class Adapter>
constexpr bool is_pool = std::is_same_v<Adapter, pool_adapter> || std::is_same_v<Adapter, pool_checked_adapter>;

struct malloc_adapter {
    static constexpr const char* name = "malloc";
    explicit malloc_adapter(int = 0) {}
    void* allocate(std::size_t n) { return std::malloc(n); }
    void deallocate(void* p, std::size_t) { std::free(p); }
    double fragmentation(std::size_t) const { return 0.0; } // not observable
};

template <class PmrPool, const char* Name>
struct pmr_adapter {
    static constexpr const char* name = Name;
    counting_upstream upstream;
    PmrPool pool{pmr_options(), &upstream};
    explicit pmr_adapter(int = 0) {}
    void* allocate(std::size_t n) { return pool.allocate(n, alignment); }
    void deallocate(void* p, std::size_t n) { pool.deallocate(p, n, alignment); }
    double fragmentation(std::size_t peak_live) const {
        return peak_live == 0 ? 0.0 : static_cast<double>(upstream.peak()) / static_cast<double>(peak_live);
    }
};

constexpr char unsync_name[] = "pmr_unsync";
constexpr char sync_name[] = "pmr_sync";
using pmr_unsync_adapter = pmr_adapter<std::pmr::unsynchronized_pool_resource, unsync_name>;
using pmr_sync_adapter = pmr_adapter<std::pmr::synchronized_pool_resource, sync_name>;

/// One resource shared by every thread of a multi-threaded benchmark, built once.
template <class Adapter>
Adapter& shared_instance() {
    static Adapter instance;
    return instance;
}

// ---- scenarios -----------------------------------------------------------------------------------

template <class Adapter>
void pair(benchmark::State& state) {
    Adapter r;
    const auto n = static_cast<std::size_t>(state.range(0));
    r.deallocate(r.allocate(n), n); // warm: the first growth is not what is measured
    for (auto _ : state) {
        void* p = r.allocate(n);
        benchmark::DoNotOptimize(p);
        r.deallocate(p, n);
    }
    state.SetItemsProcessed(state.iterations());
}

/// Multi-threaded pairs: the pool is shared; each thread uses its own stream.
template <class Adapter>
void pair_mt(benchmark::State& state) {
    auto& r = shared_instance<Adapter>();
    const auto n = static_cast<std::size_t>(state.range(0));
    const auto stream = stream_of(state.thread_index());
    for (auto _ : state) {
        void* p;
        if constexpr (is_pool<Adapter>) {
            p = r.pool.allocate(stream, n, alignment);
            benchmark::DoNotOptimize(p);
            r.pool.deallocate(stream, p, n, alignment);
        } else {
            p = r.allocate(n);
            benchmark::DoNotOptimize(p);
            r.deallocate(p, n);
        }
    }
    state.SetItemsProcessed(state.iterations());
}

/// Sizes log-uniform in [64 B, 4 MiB], a fixed seeded sequence.
std::vector<std::size_t> churn_sizes(unsigned seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> exponent(6.0, 22.0);
    std::vector<std::size_t> v(1 << 14);
    for (auto& n : v) n = static_cast<std::size_t>(std::exp2(exponent(rng)));
    return v;
}

template <class Adapter>
void churn_loop(benchmark::State& state, Adapter& r, custody::host::stream_view stream, unsigned seed) {
    const auto sizes = churn_sizes(seed);
    constexpr std::size_t window = 256;
    std::vector<std::pair<void*, std::size_t>> live(window, {nullptr, 0});
    auto allocate = [&](std::size_t n) -> void* {
        if constexpr (is_pool<Adapter>) return r.pool.allocate(stream, n, alignment);
        else return r.allocate(n);
    };
    auto deallocate = [&](void* p, std::size_t n) {
        if constexpr (is_pool<Adapter>) r.pool.deallocate(stream, p, n, alignment);
        else r.deallocate(p, n);
    };
    std::size_t i = 0;
    for (auto _ : state) {
        auto& slot = live[(i * 7919) % window];
        if (slot.first != nullptr) deallocate(slot.first, slot.second);
        const std::size_t n = sizes[i % sizes.size()];
        slot = {allocate(n), n};
        ++i;
    }
    for (auto& [p, n] : live)
        if (p != nullptr) deallocate(p, n);
    if constexpr (is_pool<Adapter>) {
        const auto p = r.pool.detailed_statistics();
        state.counters["fast_path_share"] =
            static_cast<double>(p.fast_allocations) / static_cast<double>(std::max<std::uint64_t>(p.totals.allocations, 1));
        state.counters["reclaims"] = static_cast<double>(p.reclaims);
    }
    state.SetItemsProcessed(state.iterations());
}

template <class Adapter>
void churn(benchmark::State& state) {
    Adapter r;
    churn_loop(state, r, stream_of(0), 42);
}

template <class Adapter>
void churn_mt(benchmark::State& state) {
    churn_loop(state, shared_instance<Adapter>(), stream_of(state.thread_index()),
               42u + static_cast<unsigned>(state.thread_index()));
}

/// An inference-like workload. One iteration is one decoding step of a batch of `tokens` through
/// 16 layers: each layer allocates its q/k/v, attention output and MLP activations (the MLP's are
/// above 1 MiB for large batches) and frees them before the next layer, keeping its output for the
/// next; each layer's KV cache grows by a page of tokens x 4 KiB per step; every 128 steps the
/// request ends and the whole KV cache is freed. `bucketed`: batch sizes are padded to the CUDA
/// graph sizes inference engines capture (1, 2, 4, 8, 16, 32, 48, 64), drawn by a seeded RNG;
/// otherwise every batch size 1..64 occurs (a harder case for size-class caches).
template <class Adapter, bool bucketed>
void trace(benchmark::State& state) {
    Adapter r;
    constexpr int layers = 16;
    constexpr std::size_t hidden = 4096, intermediate = 11008, element = 2;
    constexpr std::size_t buckets[] = {1, 2, 4, 8, 16, 32, 48, 64};
    std::mt19937 rng(2024);
    std::vector<std::pair<void*, std::size_t>> kv;
    kv.reserve(layers * 128);
    std::size_t live = 0, peak = 0, step = 0;
    auto take = [&](std::size_t n) {
        live += n;
        peak = std::max(peak, live);
        return r.allocate(n);
    };
    auto give = [&](void* p, std::size_t n) {
        live -= n;
        r.deallocate(p, n);
    };
    for (auto _ : state) {
        const std::size_t tokens = bucketed ? buckets[rng() % 8] : 1 + rng() % 64;
        const std::size_t x_bytes = tokens * hidden * element;
        std::pair<void*, std::size_t> x{take(x_bytes), x_bytes};
        for (int l = 0; l < layers; ++l) {
            void* q = take(x_bytes);
            void* k = take(x_bytes / 4); // grouped-query attention: 8 of 32 heads for k and v
            void* v = take(x_bytes / 4);
            void* attn = take(x_bytes);
            const std::size_t up_bytes = tokens * intermediate * element;
            void* gate = take(up_bytes);
            void* up = take(up_bytes);
            give(q, x_bytes);
            give(k, x_bytes / 4);
            give(v, x_bytes / 4);
            const std::size_t page = tokens * 4096; // this step's K and V for this layer
            kv.emplace_back(take(page), page);
            give(gate, up_bytes);
            give(up, up_bytes);
            std::pair<void*, std::size_t> out{take(x_bytes), x_bytes};
            give(attn, x_bytes);
            give(x.first, x.second);
            x = out;
        }
        give(x.first, x.second);
        if (++step % 128 == 0) {
            for (auto [p, n] : kv) give(p, n);
            kv.clear();
        }
    }
    for (auto [p, n] : kv) give(p, n);
    state.counters["fragmentation"] = r.fragmentation(peak);
    if constexpr (is_pool<Adapter>) {
        const auto p = r.pool.detailed_statistics();
        state.counters["fast_path_share"] =
            static_cast<double>(p.fast_allocations) / static_cast<double>(std::max<std::uint64_t>(p.totals.allocations, 1));
    }
    state.counters["peak_live_MiB"] = static_cast<double>(peak) / MiB;
    state.SetItemsProcessed(state.iterations());
}

/// Producer and consumer on two streams: each round, the producer's stream allocates 8 blocks
/// (4 KiB, 64 KiB, 1 MiB and 3 MiB, twice) and the consumer's stream gives them back. Counters:
/// reserved_MiB at the end and its ratio to the live peak (custody's pool under `policy`; for the
/// pmr peer, which has no streams, the peak its upstream held).
constexpr std::size_t cross_sizes[] = {4096, 65536, MiB, 3 * MiB, 4096, 65536, MiB, 3 * MiB};
constexpr std::size_t cross_live = 2 * (4096 + 65536 + MiB + 3 * MiB);

template <custody::pool::reuse_policy policy>
void cross_stream_pool(benchmark::State& state) {
    custody::pool::pool_options o;
    o.reuse = policy;
    o.checked = false;
    o.maximum_size = std::size_t{1} << 30; // same_stream reaches it: only the last resort moves blocks across
    pool_type pool(o);
    const auto producer = stream_of(0);
    const auto consumer = stream_of(1);
    void* blocks[std::size(cross_sizes)];
    for (auto _ : state) {
        for (std::size_t i = 0; i < std::size(cross_sizes); ++i) blocks[i] = pool.allocate(producer, cross_sizes[i], alignment);
        benchmark::DoNotOptimize(blocks);
        for (std::size_t i = 0; i < std::size(cross_sizes); ++i) pool.deallocate(consumer, blocks[i], cross_sizes[i], alignment);
    }
    const auto s = pool.statistics();
    state.counters["reserved_MiB"] = static_cast<double>(s.reserved_bytes) / MiB;
    state.counters["reserved_over_peak_live"] = static_cast<double>(s.reserved_bytes) / static_cast<double>(s.peak_live_bytes);
    state.counters["reclaims"] = static_cast<double>(pool.detailed_statistics().reclaims);
    state.SetItemsProcessed(state.iterations());
}

void cross_stream_pmr(benchmark::State& state) {
    pmr_sync_adapter r;
    void* blocks[std::size(cross_sizes)];
    for (auto _ : state) {
        for (std::size_t i = 0; i < std::size(cross_sizes); ++i) blocks[i] = r.allocate(cross_sizes[i]);
        benchmark::DoNotOptimize(blocks);
        for (std::size_t i = 0; i < std::size(cross_sizes); ++i) r.deallocate(blocks[i], cross_sizes[i]);
    }
    state.counters["reserved_MiB"] = static_cast<double>(r.upstream.peak()) / MiB;
    state.counters["reserved_over_peak_live"] = r.fragmentation(cross_live);
    state.SetItemsProcessed(state.iterations());
}

void register_cross_stream() {
    using custody::pool::reuse_policy;
    constexpr int rounds = 1000000;
    benchmark::RegisterBenchmark("cross_stream/pool_same_stream", cross_stream_pool<reuse_policy::same_stream>)
        ->Iterations(rounds);
    benchmark::RegisterBenchmark("cross_stream/pool_opportunistic", cross_stream_pool<reuse_policy::opportunistic>)
        ->Iterations(rounds);
    benchmark::RegisterBenchmark("cross_stream/pool_follow_dependencies",
                                 cross_stream_pool<reuse_policy::follow_dependencies>)
        ->Iterations(rounds);
    benchmark::RegisterBenchmark("cross_stream/pmr_sync", cross_stream_pmr)->Iterations(rounds);
}

template <class Adapter>
void register_all(bool single_threaded_only) {
    const std::string n = Adapter::name;
    benchmark::RegisterBenchmark(("pair/" + n).c_str(), pair<Adapter>)->RangeMultiplier(8)->Range(64, 64 * MiB);
    benchmark::RegisterBenchmark(("churn/" + n).c_str(), churn<Adapter>);
    // A fixed number of steps (10240: 80 requests), so that every resource replays the same
    // trace and its fragmentation (which depends on the largest request seen) is comparable.
    benchmark::RegisterBenchmark(("trace/" + n).c_str(), trace<Adapter, true>)->Unit(benchmark::kMicrosecond)->Iterations(10240);
    benchmark::RegisterBenchmark(("trace_unbucketed/" + n).c_str(), trace<Adapter, false>)
        ->Unit(benchmark::kMicrosecond)->Iterations(10240);
    if (!single_threaded_only) {
        benchmark::RegisterBenchmark(("pair_mt/" + n).c_str(), pair_mt<Adapter>)
            ->Arg(256)->Arg(64 << 10)->ThreadRange(1, 8)->UseRealTime();
        benchmark::RegisterBenchmark(("churn_mt/" + n).c_str(), churn_mt<Adapter>)->ThreadRange(1, 8)->UseRealTime();
    }
}

} // namespace

int main(int argc, char** argv) {
    register_all<pool_adapter>(false);
    register_all<pool_checked_adapter>(false); // checked mode (pool_options::checked): its cost beside pool
    register_all<malloc_adapter>(false);
    register_all<pmr_unsync_adapter>(true); // not thread-safe: single thread only
    register_all<pmr_sync_adapter>(false);
    register_cross_stream();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
