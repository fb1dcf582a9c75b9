/// @file
/// The host streams the benchmarks run on: one per benchmark thread, shared by every benchmark of
/// an executable (host streams are worker threads, so they are made once).
#pragma once

#include <custody/platform/host.hpp>

#include <cstddef>
#include <vector>

namespace custody_bench {

/// Stream number `i` (16 streams, taken in turn): a benchmark thread's own, or one of the several
/// streams one thread uses.
inline custody::host::stream_view stream_of(int i) {
    static std::vector<custody::host::stream> streams = [] {
        std::vector<custody::host::stream> v;
        for (int k = 0; k < 16; ++k) v.emplace_back(0);
        return v;
    }();
    return streams[static_cast<std::size_t>(i) % streams.size()].view();
}

} // namespace custody_bench
