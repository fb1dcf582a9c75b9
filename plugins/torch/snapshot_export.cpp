// The allocator library's memory snapshot in PyTorch's format (debug/pytorch_snapshot.hpp): what
// torch.cuda.memory._dump_snapshot() writes, which PyTorch refuses to write for a pluggable
// allocator. Needs tracking on: the tracker knows the blocks, the segment journal under each pool
// the segments, each device's history the events.
#include "custody_torch_allocator.h"
#include "plugin_state.hpp"

#include <custody/debug/pytorch_snapshot.hpp>

#include <cstddef>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace custody_plugin; // NOLINT(google-build-using-namespace): the library's own state

/// What each device of the tracked allocator holds now. Gathered layer by layer without stopping
/// the allocator: a block allocated or freed meanwhile may be in one list and not another (take
/// the snapshot where the program is quiet for an exact one). Throws when tracking is off.
std::vector<custody::debug::device_memory_state> device_states() {
    if (!options().tracking.load()) {
        throw std::logic_error("custody: a memory snapshot needs tracking on before the first allocation "
                               "(custody_configure(\"tracking\", 1), custody.torch.enable(tracking=True))");
    }
    std::vector<custody::debug::device_memory_state> states;
    for (int d = 0; d < platform::device_count(); ++d) {
        dispatch_known(d, [&](auto& a) {
            auto* r = a.find(d);
            if constexpr (is_tracked<std::remove_pointer_t<decltype(r)>>) {
                if (r == nullptr) return;
                custody::debug::device_memory_state s;
                s.device = d;
                s.segments = pool_of(*r).upstream().segments();
                s.blocks = r->upstream().live_blocks();
                s.pending_free = r->held_addresses();
                if (const auto& history = pool_of(*r).upstream().history()) s.history = history->events();
                states.push_back(std::move(s));
            }
        });
    }
    return states;
}

} // namespace

extern "C" {

CUSTODY_EXPORT int custody_record_history(uint64_t max_entries) {
    return checked([&] {
        options().history_entries.store(static_cast<std::size_t>(max_entries));
        std::lock_guard lock(histories_mutex());
        for (const auto& history : histories()) {
            if (history) history->set_capacity(static_cast<std::size_t>(max_entries));
        }
    });
}

CUSTODY_EXPORT ssize_t custody_snapshot_pickle(char* buffer, size_t capacity) {
    try {
        const std::string data = custody::debug::to_pickle(custody::debug::make_pytorch_snapshot(device_states()));
        if (buffer != nullptr && capacity >= data.size()) std::memcpy(buffer, data.data(), data.size());
        set_error("");
        return static_cast<ssize_t>(data.size());
    } catch (const std::exception& e) {
        return refuse(e.what());
    }
}

CUSTODY_EXPORT int custody_write_snapshot(const char* path) {
    return checked([&] {
        if (path == nullptr || *path == '\0') throw std::invalid_argument("custody: empty snapshot path");
        custody::debug::write_pytorch_snapshot(custody::debug::make_pytorch_snapshot(device_states()), path);
    });
}

} // extern "C"
