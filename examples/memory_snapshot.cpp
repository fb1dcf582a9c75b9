// A C++ program's memory written as a PyTorch memory snapshot, for PyTorch's viewer and
// custody-import: a tracker over a pool whose chunks a segment_journal watches, both writing one
// history (docs/debug.md, "A PyTorch memory snapshot from C++").
//
// Usage: memory_snapshot PATH [--no-canaries]. Runs on the host platform (a virtual device), so
// it runs anywhere; on a GPU the same code takes a cuda upstream. The last line says what it wrote.
#include <custody/debug/history.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/pytorch_snapshot.hpp>
#include <custody/debug/segment_journal.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

using journaled_memory = custody::debug::segment_journal<custody::host::simulated_device_memory>;
using tracked_pool = custody::debug::tracking_resource<custody::pool::stream_ordered_pool<journaled_memory>>;

/// A few owners' blocks, some freed: what an engine's first steps leave behind.
std::size_t run_some_steps(tracked_pool& memory, custody::host::stream& stream) {
    std::vector<std::pair<void*, std::size_t>> activations;
    {
        custody::debug::owner_scope owner("weights");
        for (std::size_t i = 0; i < 4; ++i) static_cast<void>(memory.allocate(stream, (i + 1) << 20, 256));
    }
    {
        custody::debug::owner_scope owner("kv_cache");
        for (std::size_t i = 0; i < 3; ++i) static_cast<void>(memory.allocate(stream, 3 << 20, 256));
    }
    custody::debug::owner_scope owner("activations");
    for (std::size_t i = 0; i < 6; ++i) {
        const std::size_t bytes = (i + 1) * 100'000;
        activations.emplace_back(memory.allocate(stream, bytes, 256), bytes);
    }
    for (std::size_t i = 0; i < activations.size(); i += 2) {
        memory.deallocate(stream, activations[i].first, activations[i].second, 256);
    }
    return memory.statistics().live_allocations;
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 2 || (argc == 3 && std::string(argv[2]) != "--no-canaries") || argc > 3) {
        std::fprintf(stderr, "usage: memory_snapshot PATH [--no-canaries]\n");
        return 2;
    }
    const std::string path = argv[1];
    try {
        // [excerpt: memory snapshot]
        auto history = std::make_shared<custody::debug::allocation_history>(100'000); // the last events
        custody::debug::tracking_options options;
        options.history = history;     // the tracker's allocations and frees
        options.canaries = argc == 2;  // on by default; the snapshot is drawn the same either way
        // tracker -> pool -> segment_journal (the pool's chunks, into the same history) -> device memory
        tracked_pool memory(options, custody::pool::pool_options{}, history, /*device*/ 0, std::size_t{1} << 30);
        // [end excerpt]
        custody::host::stream stream;
        const std::size_t live = run_some_steps(memory, stream);

        // [excerpt: device_memory_state]
        custody::debug::device_memory_state device;
        device.device = 0;
        device.segments = memory.upstream().upstream().segments(); // the pool's chunks, from its journal
        device.blocks = memory.live_blocks();                     // every live block: owner, address, stack
        device.history = history->events();                      // what happened, oldest first
        custody::debug::write_pytorch_snapshot(custody::debug::make_pytorch_snapshot({device}), path);
        // [end excerpt]

        std::printf("wrote %s: %zu live blocks in %zu segments, %zu events (canaries %s)\n", path.c_str(), live,
                    device.segments.size(), device.history.size(), options.canaries ? "on" : "off");
        // The blocks still live are reported as leaks when the tracker goes (policy on_leak): here
        // they are the point of the snapshot, so they are given back quietly.
        for (const custody::debug::live_block& b : device.blocks) {
            memory.deallocate(stream, reinterpret_cast<void*>(b.address), b.bytes, 256);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "memory_snapshot: %s\n", e.what());
        return 1;
    }
    return 0;
}
