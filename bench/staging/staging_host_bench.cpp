// The staging ring on the host platform, side by side with its baselines in one run:
//
//   staging/reserve_commit/<peer>/64     the ring's own cost per reserve + commit of 64 bytes on the
//                                        default stream (the copy runs inline: 64 bytes, a few ns),
//                                        next to the bare 64-byte memcpy it wraps; ring_shared:
//                                        two producer threads on one ring
//   staging/upload/<peer>/<bytes>        4 KiB .. 256 MiB to a destination through a host stream:
//     ceiling       memcpy_async from a pinned-equivalent buffer (one copy on the stream)
//     ring_pageable copy_to_device from a pageable buffer (host copy into the ring overlapping
//                   the stream's copy of the previous chunk)
//     ring_in_place reserve, commit: the data is produced in the ring (no host copy)
//
// At the end each ring peer's ratio to its baselines is printed. CUSTODY_BENCH_SHORT=1 (the registered
// `meson test --benchmark` run) keeps to sizes up to 1 MiB.
#include <custody/platform/host.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/staging/staging_ring.hpp>

#include "ratio_reporter.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

using custody::host::platform;
using ring_t = custody::staging::staging_ring<custody::resource::host_memory>;

constexpr std::size_t ring_capacity = std::size_t{16} << 20;
constexpr std::size_t ring_chunk = std::size_t{1} << 20;

ring_t& shared_ring() {
    static ring_t ring([] {
        custody::staging::ring_options o;
        o.capacity = ring_capacity;
        o.chunk_bytes = ring_chunk;
        o.max_regions = 64;
        return o;
    }());
    return ring;
}

/// A buffer from host_memory: the host platform's stand-in for pinned memory.
struct pinned_buffer {
    custody::resource::host_memory memory;
    std::byte* ptr;
    std::size_t bytes;
    explicit pinned_buffer(std::size_t n)
        : ptr(static_cast<std::byte*>(memory.allocate_sync(n, 256))), bytes(n) {
        std::memset(ptr, 1, n);
    }
    ~pinned_buffer() { memory.deallocate_sync(ptr, bytes, 256); }
    pinned_buffer(const pinned_buffer&) = delete;
    pinned_buffer& operator=(const pinned_buffer&) = delete;
};

void reserve_commit_ring(benchmark::State& state) {
    custody::staging::ring_options o;
    o.capacity = std::size_t{1} << 20;
    o.max_regions = 64;
    ring_t ring(o);
    std::vector<std::byte> dst(64);
    const custody::host::stream_view inline_stream{};
    for (auto _ : state) {
        auto r = ring.reserve<std::byte>(64);
        ring.commit(std::move(r), dst.data(), inline_stream);
    }
    benchmark::DoNotOptimize(dst.data());
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

/// Two producers on one ring: the cost of sharing its lock.
void reserve_commit_ring_shared(benchmark::State& state) {
    static ring_t ring([] {
        custody::staging::ring_options o;
        o.capacity = std::size_t{1} << 20;
        o.max_regions = 64;
        return o;
    }());
    std::vector<std::byte> dst(64);
    const custody::host::stream_view inline_stream{};
    for (auto _ : state) {
        auto r = ring.reserve<std::byte>(64);
        ring.commit(std::move(r), dst.data(), inline_stream);
    }
    benchmark::DoNotOptimize(dst.data());
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void reserve_commit_memcpy(benchmark::State& state) {
    std::vector<std::byte> src(64, std::byte{1});
    std::vector<std::byte> dst(64);
    for (auto _ : state) {
        benchmark::DoNotOptimize(src.data());
        std::memcpy(dst.data(), src.data(), 64);
        benchmark::ClobberMemory();
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void upload_ceiling(benchmark::State& state, std::size_t n) {
    pinned_buffer src(n);
    std::vector<std::byte> dst(n);
    custody::host::stream s;
    for (auto _ : state) {
        platform::memcpy_async(dst.data(), src.ptr, n, s);
        platform::synchronize(s);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
}

void upload_ring_pageable(benchmark::State& state, std::size_t n) {
    std::vector<std::byte> src(n, std::byte{1});
    std::vector<std::byte> dst(n);
    custody::host::stream s;
    ring_t& ring = shared_ring();
    for (auto _ : state) {
        ring.copy_to_device(std::span<const std::byte>(src), dst.data(), s);
        platform::synchronize(s);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
}

void upload_ring_in_place(benchmark::State& state, std::size_t n) {
    std::vector<std::byte> dst(n);
    custody::host::stream s;
    ring_t& ring = shared_ring();
    for (auto _ : state) {
        for (std::size_t done = 0; done < n;) {
            const std::size_t k = std::min(ring_chunk, n - done);
            auto r = ring.reserve<std::byte>(k);
            ring.commit(std::move(r), dst.data() + done, s);
            done += k;
        }
        platform::synchronize(s);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
}

} // namespace

int main(int argc, char** argv) {
    const char* short_env = std::getenv("CUSTODY_BENCH_SHORT");
    const bool short_mode = short_env != nullptr && std::string(short_env) == "1";
    const std::int64_t max_size = short_mode ? (std::int64_t{1} << 20) : (std::int64_t{256} << 20);

    benchmark::RegisterBenchmark("staging/reserve_commit/ring/64", reserve_commit_ring)->UseRealTime();
    benchmark::RegisterBenchmark("staging/reserve_commit/memcpy/64", reserve_commit_memcpy)->UseRealTime();
    benchmark::RegisterBenchmark("staging/reserve_commit/ring_shared/64", reserve_commit_ring_shared)
        ->Threads(2)
        ->UseRealTime();
    for (std::int64_t n = 4096; n <= max_size; n *= 16) {
        for (auto [name, fn] : {std::pair{"ceiling", &upload_ceiling}, std::pair{"ring_pageable", &upload_ring_pageable},
                                std::pair{"ring_in_place", &upload_ring_in_place}}) {
            benchmark::RegisterBenchmark(("staging/upload/" + std::string(name) + "/" + std::to_string(n)).c_str(),
                                         [fn = fn, n](benchmark::State& st) { fn(st, static_cast<std::size_t>(n)); })
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
        }
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    custody::bench::ratio_reporter reporter({"ceiling", "memcpy"});
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return 0;
}
