/// @file
/// The host streams the benchmarks run on: one per benchmark thread, shared by every benchmark of
/// an executable (host streams are worker threads, so they are made once).
#pragma once

#include <custody/platform/host.hpp>

#include <cstddef>
#include <vector>

namespace custody_bench {

/// The stream of benchmark thread `thread` (8 streams, taken in turn).
inline custody::host::stream_view stream_of(int thread) {
    static std::vector<custody::host::stream> streams = [] {
        std::vector<custody::host::stream> v;
        for (int i = 0; i < 8; ++i) v.emplace_back(0);
        return v;
    }();
    return streams[static_cast<std::size_t>(thread) % streams.size()].view();
}

} // namespace custody_bench
