/// @file
/// What the tracking resource reports: the two sides of a bad free (`violation`), the typed error
/// that carries one (`tracking_error`), the policy that decides what happens, leak reports,
/// snapshots and their differences. Plain values, no locks.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/detail/format.hpp>
#include <custody/core/statistics.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/core/rank.hpp>
#include <custody/debug/detail/call_stack.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::debug {

/// One side of an allocation's life: where it was allocated, or where someone tried to free it.
/// `stream` is the platform's stream key (0: the default stream, or a synchronous call).
struct allocation_site {
    std::string owner{untagged_owner};
    int rank = 0;
    int device = -1;
    std::uintptr_t stream = 0;
    bool synchronous = false;       ///< allocate_sync / deallocate_sync: no stream
    std::uint64_t sequence = 0;     ///< the tracker's allocation (or free) number, from 1
    std::int64_t time_ns = 0;       ///< steady-clock nanoseconds since the tracker was made
    std::size_t bytes = 0;
    std::size_t alignment = 0;
    std::vector<std::string> stack; ///< symbolized call stack, innermost first; empty unless captured

    /// "owner 'decoder' rank 1 device 2 stream 0x7f.. seq 42 (128 B, align 256)"
    [[nodiscard]] std::string describe() const {
        std::string s = "owner '" + owner + "' rank " + std::to_string(rank) + " device " + std::to_string(device);
        s += synchronous ? std::string(" (synchronous)") : " stream " + custody::detail::to_hex(reinterpret_cast<const void*>(stream));
        s += " seq " + std::to_string(sequence) + " (" + std::to_string(bytes) + " B, align " +
             std::to_string(alignment) + ")";
        return s;
    }
};

/// The kinds of misuse the tracking resource detects.
enum class violation_kind {
    double_free,      ///< the pointer was already given back to this tracker
    unknown_pointer,  ///< no tracker ever handed out this pointer (or it was forgotten long ago)
    wrong_size,       ///< deallocate's bytes differ from allocate's
    wrong_alignment,  ///< deallocate's alignment differs from allocate's
    wrong_device,     ///< freed with another device current (or on another device's stream)
    foreign_free,     ///< freed through a tracker other than the one that handed it out
    interior_pointer, ///< the pointer lies inside a live block of this tracker, not at its start
    stream_hazard,    ///< freed on another stream than the ones it was used on, with no ordering
    buffer_underflow, ///< the guard bytes before the block were overwritten
    buffer_overflow,  ///< the guard bytes after the block were overwritten
    leak,             ///< still live when the tracker was destroyed
};

[[nodiscard]] constexpr const char* to_string(violation_kind k) noexcept {
    switch (k) {
    case violation_kind::double_free: return "double_free";
    case violation_kind::unknown_pointer: return "unknown_pointer";
    case violation_kind::wrong_size: return "wrong_size";
    case violation_kind::wrong_alignment: return "wrong_alignment";
    case violation_kind::wrong_device: return "wrong_device";
    case violation_kind::foreign_free: return "foreign_free";
    case violation_kind::interior_pointer: return "interior_pointer";
    case violation_kind::stream_hazard: return "stream_hazard";
    case violation_kind::buffer_underflow: return "buffer_underflow";
    case violation_kind::buffer_overflow: return "buffer_overflow";
    case violation_kind::leak: return "leak";
    }
    return "?";
}

/// A detected misuse, naming both sides.
///
/// `allocated` is where the block came from (absent for an unknown pointer); `freed` is the call
/// that went wrong; `first_free` the earlier free of a double free. `tracker` names the tracker
/// that saw the call, `other_tracker` the one that owns the block in a foreign free.
struct violation {
    violation_kind kind = violation_kind::unknown_pointer;
    const void* pointer = nullptr;
    std::string tracker;
    std::string other_tracker;
    bool has_allocated = false;
    allocation_site allocated;
    allocation_site freed;
    bool has_first_free = false;
    allocation_site first_free;
    std::string detail; ///< what exactly differed ("freed with 64 B, allocated 128 B")

    /// The full multi-line report.
    [[nodiscard]] std::string describe() const {
        std::string s = std::string("custody: ") + to_string(kind) + " of " + custody::detail::to_hex(pointer) +
                        " in tracker '" + tracker + "'";
        if (!detail.empty()) s += ": " + detail;
        if (has_allocated) {
            s += "\n  allocated by " + allocated.describe();
            if (!other_tracker.empty()) s += " in tracker '" + other_tracker + "'";
            for (const auto& f : allocated.stack) s += "\n      at " + f;
        } else {
            s += "\n  never allocated by any live tracker";
        }
        if (has_first_free) {
            s += "\n  first freed by " + first_free.describe();
            for (const auto& f : first_free.stack) s += "\n      at " + f;
        }
        if (kind != violation_kind::leak) {
            s += "\n  freed by " + freed.describe();
            for (const auto& f : freed.stack) s += "\n      at " + f;
        }
        return s;
    }
};

/// A violation as an exception.
class tracking_error : public std::logic_error {
public:
    explicit tracking_error(violation v) : std::logic_error(v.describe()), violation_(std::move(v)) {}
    [[nodiscard]] const violation& report() const noexcept { return violation_; }
    [[nodiscard]] violation_kind kind() const noexcept { return violation_.kind; }

private:
    violation violation_;
};

/// What the tracker does with a violation (or a leak at destruction).
///
///  - throw_error: throws tracking_error. deallocate is noexcept, so a violation found there is
///    kept and thrown by the next throwing call on the tracker (allocate, allocate_sync,
///    rethrow_pending, check_guards); deallocate_checked throws at once. A leak at destruction is
///    logged.
///  - abort: writes the report through custody::report_failure, then std::abort().
///  - log: writes the report through custody::report_failure and goes on.
///  - callback: calls tracking_options::violation_callback with the violation (for a leak,
///    tracking_options::leak_callback with the leak report), which must not throw, then goes on.
///    Without a violation_callback, the violation is logged.
///  - ignore: a violation is only counted and kept (violations(), the rank report); a leak is
///    dropped.
enum class policy { throw_error, abort, log, callback, ignore };

/// Live memory grouped by owner and call stack.
struct leak_group {
    std::string owner;
    std::vector<std::string> stack; ///< symbolized; empty when stacks were not captured
    std::size_t bytes = 0;
    std::size_t count = 0;
    std::uint64_t first_sequence = 0; ///< the oldest allocation in the group
    std::vector<int> devices;         ///< sorted, distinct
};

/// A leak report: one group per (owner, call stack), largest bytes first (ties: owner name).
struct leak_report {
    int rank = 0;
    std::size_t total_bytes = 0;
    std::size_t total_count = 0;
    std::vector<leak_group> groups;

    [[nodiscard]] bool empty() const noexcept { return total_count == 0; }

    /// The group of `owner` with no regard to stack, summed; zeros when absent.
    [[nodiscard]] std::pair<std::size_t, std::size_t> owner_totals(std::string_view owner) const {
        std::size_t b = 0;
        std::size_t c = 0;
        for (const auto& g : groups) {
            if (g.owner == owner) {
                b += g.bytes;
                c += g.count;
            }
        }
        return {b, c};
    }

    [[nodiscard]] std::string describe() const {
        std::string s = "custody: rank " + std::to_string(rank) + ": " + std::to_string(total_bytes) + " B live in " +
                        std::to_string(total_count) + " allocations";
        for (const auto& g : groups) {
            s += "\n  " + std::to_string(g.bytes) + " B in " + std::to_string(g.count) + " from '" + g.owner +
                 "' (first seq " + std::to_string(g.first_sequence) + ", devices";
            for (int d : g.devices) s += " " + std::to_string(d);
            s += ")";
            for (const auto& f : g.stack) s += "\n      at " + f;
        }
        return s;
    }
};

/// One live allocation as seen by a snapshot.
struct snapshot_entry {
    const void* pointer = nullptr;
    std::uint64_t sequence = 0;
    std::size_t bytes = 0;
    owner_id owner = nullptr;
    int device = -1;
    detail::call_stack stack;
};

/// One live block as the tracker holds it: where the upstream's block lies and the user's bytes in
/// it, for a layout of memory (debug/pytorch_snapshot.hpp). `stream` is the platform's stream key.
struct live_block {
    std::uintptr_t address = 0; ///< the user's pointer
    std::size_t bytes = 0;      ///< the user's bytes
    std::uintptr_t outer = 0;   ///< the upstream's block (guards included)
    std::size_t total = 0;
    owner_id owner = nullptr;
    int device = -1;
    std::uintptr_t stream = 0;
    std::int64_t unix_ns = 0;   ///< when it was allocated
    detail::call_stack stack;
};

/// The live allocations at one moment, in sequence order.
/// Invariant: entries sorted by sequence; every entry's sequence <= last_sequence.
struct snapshot {
    int rank = 0;
    std::uint64_t last_sequence = 0; ///< the highest sequence number handed out when it was taken
    std::int64_t time_ns = 0;
    std::vector<snapshot_entry> entries;

    [[nodiscard]] std::size_t live_bytes() const noexcept {
        std::size_t b = 0;
        for (const auto& e : entries) b += e.bytes;
        return b;
    }
};

namespace detail {

/// Groups entries by (owner, stack) into a leak report (stacks symbolized here, once per group).
template <class Range>
leak_report group_entries(int rank, const Range& entries) {
    struct key {
        owner_id owner;
        call_stack stack;
        bool operator==(const key& o) const noexcept { return owner == o.owner && stack == o.stack; }
    };
    struct key_hash {
        std::size_t operator()(const key& k) const noexcept {
            return std::hash<owner_id>{}(k.owner) ^ (call_stack_hash{}(k.stack) << 1);
        }
    };
    struct acc {
        std::size_t bytes = 0;
        std::size_t count = 0;
        std::uint64_t first = UINT64_MAX;
        std::vector<int> devices;
    };
    std::unordered_map<key, acc, key_hash> groups;
    leak_report r;
    r.rank = rank;
    for (const snapshot_entry& e : entries) {
        acc& a = groups[key{e.owner, e.stack}];
        a.bytes += e.bytes;
        ++a.count;
        a.first = std::min(a.first, e.sequence);
        if (std::find(a.devices.begin(), a.devices.end(), e.device) == a.devices.end()) a.devices.push_back(e.device);
        r.total_bytes += e.bytes;
        ++r.total_count;
    }
    for (auto& [k, a] : groups) {
        std::sort(a.devices.begin(), a.devices.end());
        r.groups.push_back(leak_group{std::string(owner_name(k.owner)), k.stack.symbolize(), a.bytes, a.count, a.first,
                                      std::move(a.devices)});
    }
    std::sort(r.groups.begin(), r.groups.end(), [](const leak_group& a, const leak_group& b) {
        return std::tie(b.bytes, a.owner, a.first_sequence) < std::tie(a.bytes, b.owner, b.first_sequence);
    });
    return r;
}

} // namespace detail

/// What appeared between snapshot `a` and snapshot `b` and did not go away: the entries of b with
/// a sequence number above a.last_sequence, grouped by owner and call stack.
/// Precondition: both snapshots come from the same tracker, a taken before b.
/// Complexity: O(n log n) in the entries of b.
[[nodiscard]] inline leak_report diff(const snapshot& a, const snapshot& b) {
    std::vector<snapshot_entry> grown;
    for (const auto& e : b.entries)
        if (e.sequence > a.last_sequence) grown.push_back(e);
    return detail::group_entries(b.rank, grown);
}

/// One owner's live memory in a tracker. Invariant: live_bytes <= peak_bytes.
struct owner_usage {
    std::string owner;
    std::size_t live_bytes = 0;
    std::size_t live_count = 0;
    std::size_t peak_bytes = 0;
};

/// One device's live memory in a tracker (device -1: memory of no device).
struct device_usage {
    int device = -1;
    std::size_t live_bytes = 0;
    std::size_t live_count = 0;
};

/// Live bytes per owner at one moment (taken by every snapshot() and when a report is made).
struct timeline_sample {
    std::int64_t unix_ns = 0;
    std::vector<std::pair<std::string, std::size_t>> owners; ///< sorted by owner name
};

/// What the tracked resource's upstream (a pool, a leaf) holds, when it keeps statistics: its
/// reserve beside the bytes it serves, so a rank whose pool is bloated shows in the merged view.
/// Invariants (for a consistent upstream): live_bytes <= reserved_bytes, peak_live_bytes <=
/// peak_reserved_bytes.
struct upstream_usage {
    std::string resource;              ///< the upstream's name ("stream_ordered_pool"), "" when it has none
    std::size_t live_bytes = 0;        ///< what it serves (the tracker's blocks, guards included)
    std::size_t peak_live_bytes = 0;
    std::size_t reserved_bytes = 0;    ///< what it holds from its own upstream
    std::size_t peak_reserved_bytes = 0;
    std::optional<std::size_t> largest_free_block; ///< when the upstream tells it (a pool)

    /// Peak reserved over peak live bytes (a pool's fragmentation(): 1.0 is perfect); 0 when
    /// nothing was ever live.
    [[nodiscard]] double fragmentation() const noexcept {
        return peak_live_bytes == 0 ? 0.0
                                    : static_cast<double>(peak_reserved_bytes) / static_cast<double>(peak_live_bytes);
    }
    friend bool operator==(const upstream_usage&, const upstream_usage&) = default;
};

namespace detail {

/// `u`'s usage for a report, when it keeps statistics; nothing otherwise.
template <class Upstream>
[[nodiscard]] std::optional<upstream_usage> upstream_usage_of(const Upstream& u) {
    if constexpr (resource_with_statistics<Upstream>) {
        const resource_statistics s = u.statistics();
        upstream_usage usage{{}, s.live_bytes, s.peak_live_bytes, s.reserved_bytes, s.peak_reserved_bytes, {}};
        if constexpr (requires { std::string(Upstream::name); }) usage.resource = Upstream::name;
        if constexpr (requires { u.detailed_statistics().largest_free_block; }) {
            usage.largest_free_block = u.detailed_statistics().largest_free_block;
        }
        return usage;
    } else {
        static_cast<void>(u);
        return std::nullopt;
    }
}

} // namespace detail

/// Everything one rank's JSON report holds (see docs/debug-report-schema.json). A plain value
/// made by tracking_resource::make_report(); json_report.hpp writes and reads it.
struct rank_report {
    rank_info rank;
    std::string tracker;
    std::string platform;
    std::int64_t started_unix_ns = 0;
    std::int64_t written_unix_ns = 0;
    resource_statistics totals;
    std::optional<upstream_usage> upstream; ///< the tracked resource's upstream, when it keeps statistics
    std::vector<owner_usage> owners;   ///< sorted by owner name
    std::vector<device_usage> devices; ///< sorted by device
    leak_report live;                  ///< the live allocations grouped by owner and call stack
    std::vector<violation> violations; ///< in the order they were found (the most recent ones kept)
    std::vector<timeline_sample> timeline;
};

} // namespace custody::debug
