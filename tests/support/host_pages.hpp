// What the kernel says of a range of pages of this process: mapped and accessible (/proc/self/maps),
// resident (mincore), the process's resident memory (/proc/self/statm) and whether the kernel
// refuses commits (overcommit_memory). Host platform only:
// the virtual-memory, pool and sleep tests check what the kernel holds, not a counter.
#pragma once

#include <custody/core/align.hpp>
#include <custody/platform/host_vmm.hpp>

#include "catch.hpp"

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace custody_test::host_pages {

inline std::size_t page() { return custody::host::vmm::page_size(); }

/// The permissions /proc/self/maps gives the page at `p` ("rw-p", "---p"), or "" if unmapped.
inline std::string protection(const void* p) {
    std::ifstream maps("/proc/self/maps");
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    for (std::string line; std::getline(maps, line);) {
        std::istringstream fields(line);
        std::string range;
        std::string perms;
        fields >> range >> perms;
        const auto dash = range.find('-');
        const std::uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
        const std::uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
        if (lo <= at && at < hi) return perms;
    }
    return "";
}

/// The page at `p` has memory mapped and accessible: a sleeping page is the reservation again ("---p").
inline bool mapped(const void* p) { return protection(p).rfind("rw", 0) == 0; }

/// How many of the pages that lie wholly inside [p, p + n) are in memory (mincore): what the
/// process really holds.
inline std::size_t resident_pages(const void* p, std::size_t n) {
    const std::uintptr_t first = custody::align_up(reinterpret_cast<std::uintptr_t>(p), page());
    const std::uintptr_t last = custody::align_down(reinterpret_cast<std::uintptr_t>(p) + n, page());
    if (last <= first) return 0;
    std::vector<unsigned char> in((last - first) / page());
    REQUIRE(::mincore(reinterpret_cast<void*>(first), last - first, in.data()) == 0);
    std::size_t pages = 0;
    for (unsigned char c : in) pages += c & 1U;
    return pages;
}

/// Bytes of [p, p+n) in memory now (whole pages inside it).
inline std::size_t resident_bytes(const void* p, std::size_t n) { return resident_pages(p, n) * page(); }

/// The process's resident memory, in bytes.
inline std::size_t process_resident() {
    std::ifstream statm("/proc/self/statm");
    std::size_t size = 0;
    std::size_t resident = 0;
    statm >> size >> resident;
    return resident * page();
}

/// The kernel's overcommit mode (/proc/sys/vm/overcommit_memory): 0 heuristic, 1 always (a commit
/// is never refused), 2 strict; -1 when it cannot be read.
inline int overcommit_mode() {
    std::ifstream in("/proc/sys/vm/overcommit_memory");
    int mode = -1;
    in >> mode;
    return in ? mode : -1;
}

} // namespace custody_test::host_pages
