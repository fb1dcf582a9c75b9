// Interop overheads, peers side by side in one run:
//   pmr_churn/<resource>     a std::pmr::memory_resource serving batches of mixed-size blocks
//   pluggable/<path>         PyTorch's entry point (pluggable_allocator) against the resource
//                            called directly, on one host virtual device, bare and pooled, and
//                            the pool under recorded_streams (what the PyTorch library serves:
//                            its cost when no stream is recorded)
#include <custody/interop/pmr.hpp>
#include <custody/interop/pluggable_allocator.hpp>
#include <custody/platform/host.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/recorded_streams.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include <benchmark/benchmark.h>

#include <array>
#include <cstddef>
#include <memory>
#include <memory_resource>
#include <random>

namespace {

constexpr std::size_t batch = 64;

/// Sizes from 16 B to 64 KiB, log-uniform, seeded: the same sequence for every peer.
std::array<std::size_t, batch> sizes() {
    std::mt19937 rng(42);
    std::uniform_int_distribution<int> shift(4, 16);
    std::array<std::size_t, batch> s{};
    for (auto& v : s) v = (std::size_t{1} << shift(rng)) + static_cast<std::size_t>(rng() % 16);
    return s;
}

void churn(benchmark::State& state, std::pmr::memory_resource& r) {
    const auto sz = sizes();
    std::array<void*, batch> blocks{};
    for (auto _ : state) {
        for (std::size_t i = 0; i < batch; ++i) blocks[i] = r.allocate(sz[i], 16);
        benchmark::DoNotOptimize(blocks.data());
        for (std::size_t i = 0; i < batch; ++i) r.deallocate(blocks[i], sz[i], 16);
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

void pmr_churn_new_delete(benchmark::State& state) { churn(state, *std::pmr::new_delete_resource()); }

void pmr_churn_custody_host_memory(benchmark::State& state) {
    custody::resource::host_memory memory;
    custody::interop::pmr_adaptor adaptor(memory);
    churn(state, adaptor);
}

void pmr_churn_custody_pool(benchmark::State& state) {
    custody::pool::stream_ordered_pool<custody::resource::host_memory> pool(custody::pool::pool_options{});
    custody::interop::pmr_adaptor adaptor(pool);
    churn(state, adaptor);
}

void pmr_churn_unsynchronized_pool(benchmark::State& state) {
    std::pmr::unsynchronized_pool_resource pool;
    churn(state, pool);
}

void pmr_churn_synchronized_pool(benchmark::State& state) {
    std::pmr::synchronized_pool_resource pool;
    churn(state, pool);
}

using device_resource = custody::host::simulated_device_memory;

void pluggable_direct(benchmark::State& state) {
    device_resource memory(0, std::size_t{1} << 30);
    const auto sz = sizes();
    std::array<void*, batch> blocks{};
    for (auto _ : state) {
        for (std::size_t i = 0; i < batch; ++i) blocks[i] = memory.allocate({}, sz[i], 256);
        benchmark::DoNotOptimize(blocks.data());
        for (std::size_t i = 0; i < batch; ++i) memory.deallocate({}, blocks[i], sz[i], 256);
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

using device_pool = custody::pool::stream_ordered_pool<device_resource>;

void pluggable_pool_direct(benchmark::State& state) {
    device_pool pool(custody::pool::pool_options{}, 0, std::size_t{1} << 30);
    const auto sz = sizes();
    std::array<void*, batch> blocks{};
    for (auto _ : state) {
        for (std::size_t i = 0; i < batch; ++i) blocks[i] = pool.allocate({}, sz[i], 256);
        benchmark::DoNotOptimize(blocks.data());
        for (std::size_t i = 0; i < batch; ++i) pool.deallocate({}, blocks[i], sz[i], 256);
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

void pluggable_pool_entry_point(benchmark::State& state) {
    custody::interop::pluggable_allocator<device_pool> alloc(1, [](int device) {
        return std::make_unique<device_pool>(custody::pool::pool_options{}, device, std::size_t{1} << 30);
    });
    const auto sz = sizes();
    std::array<void*, batch> blocks{};
    for (auto _ : state) {
        for (std::size_t i = 0; i < batch; ++i) blocks[i] = alloc.alloc(static_cast<std::ptrdiff_t>(sz[i]), 0, {});
        benchmark::DoNotOptimize(blocks.data());
        for (std::size_t i = 0; i < batch; ++i) alloc.free(blocks[i], static_cast<std::ptrdiff_t>(sz[i]), 0, {});
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

void pluggable_entry_point(benchmark::State& state) {
    custody::interop::pluggable_allocator<device_resource> alloc(
        1, [](int device) { return std::make_unique<device_resource>(device, std::size_t{1} << 30); });
    const auto sz = sizes();
    std::array<void*, batch> blocks{};
    for (auto _ : state) {
        for (std::size_t i = 0; i < batch; ++i) blocks[i] = alloc.alloc(static_cast<std::ptrdiff_t>(sz[i]), 0, {});
        benchmark::DoNotOptimize(blocks.data());
        for (std::size_t i = 0; i < batch; ++i) alloc.free(blocks[i], static_cast<std::ptrdiff_t>(sz[i]), 0, {});
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

/// Batches of `batch` allocations then frees, through `allocate(size)` and `deallocate(p, size)`.
template <class Allocate, class Deallocate>
void serve_batches(benchmark::State& state, Allocate&& allocate, Deallocate&& deallocate) {
    const auto sz = sizes();
    std::array<void*, batch> blocks{};
    for (auto _ : state) {
        for (std::size_t i = 0; i < batch; ++i) blocks[i] = allocate(sz[i]);
        benchmark::DoNotOptimize(blocks.data());
        for (std::size_t i = 0; i < batch; ++i) deallocate(blocks[i], sz[i]);
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
}

using recorded_pool = custody::resource::recorded_streams<device_pool>;

void pluggable_recorded_pool_direct(benchmark::State& state) {
    recorded_pool pool(custody::pool::pool_options{}, 0, std::size_t{1} << 30);
    serve_batches(
        state, [&](std::size_t n) { return pool.allocate({}, n, 256); },
        [&](void* p, std::size_t n) { pool.deallocate({}, p, n, 256); });
}

void pluggable_recorded_pool_entry_point(benchmark::State& state) {
    custody::interop::pluggable_allocator<recorded_pool> alloc(1, [](int device) {
        return std::make_unique<recorded_pool>(custody::pool::pool_options{}, device, std::size_t{1} << 30);
    });
    serve_batches(
        state, [&](std::size_t n) { return alloc.allocate(static_cast<std::ptrdiff_t>(n), 0, {}); },
        [&](void* p, std::size_t n) { alloc.free(p, static_cast<std::ptrdiff_t>(n), 0, {}); });
}

} // namespace

BENCHMARK(pmr_churn_new_delete)->Name("pmr_churn/new_delete_resource");
BENCHMARK(pmr_churn_custody_host_memory)->Name("pmr_churn/pmr_adaptor<host_memory>");
BENCHMARK(pmr_churn_custody_pool)->Name("pmr_churn/pmr_adaptor<stream_ordered_pool<host_memory>>");
BENCHMARK(pmr_churn_unsynchronized_pool)->Name("pmr_churn/unsynchronized_pool_resource");
BENCHMARK(pmr_churn_synchronized_pool)->Name("pmr_churn/synchronized_pool_resource");
BENCHMARK(pluggable_direct)->Name("pluggable/simulated_device_memory_direct");
BENCHMARK(pluggable_entry_point)->Name("pluggable/pluggable_allocator<simulated_device_memory>");
BENCHMARK(pluggable_pool_direct)->Name("pluggable/stream_ordered_pool_direct");
BENCHMARK(pluggable_pool_entry_point)->Name("pluggable/pluggable_allocator<stream_ordered_pool>");
BENCHMARK(pluggable_recorded_pool_direct)->Name("pluggable/recorded_streams<stream_ordered_pool>_direct");
BENCHMARK(pluggable_recorded_pool_entry_point)
    ->Name("pluggable/pluggable_allocator<recorded_streams<stream_ordered_pool>>");

BENCHMARK_MAIN();
