/// @file
/// `replay::program`: a trace compiled for replay. Every allocation and deallocation of each device
/// becomes a 16-byte operation that names a slot instead of an address, checked once here so that
/// the replay loop is nothing but calls to the allocator.
#pragma once

#include <custody/core/detail/format.hpp>
#include <custody/core/error.hpp>
#include <custody/trace/detail/codec.hpp>
#include <custody/trace/event.hpp>
#include <custody/trace/reader.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::replay {

/// A trace that cannot be replayed: frees that match no allocation, sizes of zero or larger than
/// any device. The message names the trace and the event.
class program_error final : public custody::error {
public:
    program_error(const std::string& trace, std::uint64_t sequence, const std::string& what)
        : custody::error("trace '" + trace + "': event " + std::to_string(sequence) + ": " + what),
          sequence_(sequence) {}
    [[nodiscard]] std::uint64_t sequence() const noexcept { return sequence_; }

private:
    std::uint64_t sequence_;
};

enum class op_kind : std::uint8_t { allocate, deallocate };

/// One operation of the replay loop.
struct op {
    std::uint64_t bytes;
    std::uint32_t slot;   ///< where the allocation's pointer is kept until its deallocation
    std::uint16_t stream; ///< index into device_program::streams
    op_kind kind;
    std::uint8_t alignment_log2;
};
static_assert(sizeof(op) == 16);

/// A block still live when the trace ends: the replay gives it back after the timed loop.
struct live_block {
    std::uint32_t slot;
    std::uint16_t stream;
    std::uint8_t alignment_log2;
    std::uint64_t bytes;
};

/// A reference allocator's reserved bytes over the replay (PyTorch's, for an imported snapshot):
/// `points` = (k, v) means v bytes from operation k on, until the next point. Events that come
/// before operation k (the segment a request needed comes right before it) count at k.
struct reference_series {
    std::string name;
    std::vector<std::pair<std::size_t, std::uint64_t>> points; ///< k strictly increasing
    std::uint64_t peak = 0;                                    ///< the largest value ever, exact

    /// The largest value in effect at any operation from k on (and after the last).
    [[nodiscard]] std::uint64_t peak_from(std::size_t k) const noexcept {
        std::uint64_t v = at(k);
        for (const auto& [at_op, value] : points)
            if (at_op > k) v = std::max(v, value);
        return v;
    }

    /// Reserved bytes at operation k.
    [[nodiscard]] std::uint64_t at(std::size_t k) const noexcept {
        const auto after = std::upper_bound(points.begin(), points.end(), k,
                                            [](std::size_t key, const auto& p) { return key < p.first; });
        return after == points.begin() ? 0 : std::prev(after)->second;
    }
};

/// One device's operations and what is known of them before any replay.
///
/// Invariants: every deallocate op names a slot its allocate op filled before and no op between
/// reused; slots < `slots`; streams[0] == 0 (the default stream); live after op i
/// (sum of allocate bytes minus deallocate bytes up to i) peaks first at peak_live_op.
struct device_program {
    int device = 0;
    std::vector<op> ops;
    std::vector<std::uint64_t> sequence; ///< the trace's sequence number of each op
    std::vector<std::uint64_t> streams{0};
    std::uint32_t slots = 0;
    std::uint64_t peak_live = 0;
    std::size_t peak_live_op = 0;
    std::uint64_t allocations = 0;
    std::uint64_t deallocations = 0;
    std::uint64_t pre_trace = 0;          ///< allocations flagged pre_trace (live before recording began)
    std::size_t first_trace_op = 0;       ///< the first op not flagged pre_trace (they come first)
    std::uint64_t failures_in_trace = 0;  ///< allocation_failure events (not replayed)
    std::uint64_t largest_request = 0;
    std::vector<live_block> live_at_end;
    std::optional<reference_series> reference;

    [[nodiscard]] std::uint64_t live_at_end_bytes() const noexcept {
        std::uint64_t b = 0;
        for (const auto& l : live_at_end) b += l.bytes;
        return b;
    }
};

/// A whole trace compiled: one program per device, in device order.
struct program {
    std::string name; ///< the trace's file
    trace::trace_header header;
    std::uint64_t events = 0;
    std::vector<device_program> devices;
};

struct compile_options {
    /// A request above this is larger than any device: 1 TiB.
    std::uint64_t max_request = std::uint64_t{1} << 40;
    /// The largest alignment replayed (what the allocators accept): a page.
    std::uint64_t max_alignment = 4096;
    /// Compile only this device's events.
    std::optional<int> only_device;
};

namespace detail {

/// The state of one device while compiling.
struct device_builder {
    struct block {
        std::uint32_t slot;
        std::uint16_t stream;
        std::uint8_t alignment_log2;
        std::uint64_t bytes;
        std::uint64_t sequence;
    };
    device_program p;
    std::unordered_map<std::uint64_t, block> live;           // by address
    std::unordered_map<std::uint64_t, std::uint16_t> stream_index{{0, 0}};
    std::vector<std::uint32_t> free_slots;
    std::uint64_t live_bytes = 0;
    std::uint64_t reference = 0;
    bool has_reference = false;
};

} // namespace detail

/// Reads the whole trace from `in` and compiles it. Throws program_error for a trace that cannot
/// be replayed (naming the event), trace_error for one that cannot be read.
/// Memory: 24 bytes per replayed operation plus the live blocks. Time: O(events).
[[nodiscard]] inline program compile(trace::reader& in, const compile_options& options = {}) {
    program out;
    out.name = in.name();
    std::map<int, detail::device_builder> devices;
    trace::event e;
    const auto fail = [&](const std::string& what) { throw program_error(out.name, e.sequence, what); };
    while (in.next(e)) {
        if (options.only_device && e.device != *options.only_device) continue;
        auto& d = devices[e.device];
        d.p.device = e.device;
        switch (e.kind) {
        case trace::event_kind::allocation_failure:
            ++d.p.failures_in_trace;
            continue;
        case trace::event_kind::reference_reserve:
        case trace::event_kind::reference_release: {
            if (e.kind == trace::event_kind::reference_release && e.bytes > d.reference) {
                fail("the reference allocator gives back " + std::to_string(e.bytes) + " bytes but holds only " +
                     std::to_string(d.reference) + " on device " + std::to_string(e.device));
            }
            if (e.kind == trace::event_kind::reference_reserve && e.bytes > UINT64_MAX - d.reference) {
                fail("the reference allocator would hold more than 2^64-1 bytes on device " + std::to_string(e.device) +
                     " (" + std::to_string(d.reference) + " and " + std::to_string(e.bytes) + " more)");
            }
            d.reference = e.kind == trace::event_kind::reference_reserve ? d.reference + e.bytes : d.reference - e.bytes;
            if (!d.p.reference) d.p.reference.emplace();
            auto& points = d.p.reference->points;
            if (!points.empty() && points.back().first == d.p.ops.size()) {
                points.back().second = d.reference;
            } else {
                points.emplace_back(d.p.ops.size(), d.reference);
            }
            d.p.reference->peak = std::max(d.p.reference->peak, d.reference);
            continue;
        }
        case trace::event_kind::allocate:
        case trace::event_kind::deallocate:
            break;
        }
        if (e.address == 0) fail(std::string(to_string(e.kind)) + " of a null pointer");
        if (e.alignment > options.max_alignment) {
            fail("alignment " + std::to_string(e.alignment) + " is above the " + std::to_string(options.max_alignment) +
                 " that allocators replay");
        }
        auto [sit, added] = d.stream_index.try_emplace(e.stream, static_cast<std::uint16_t>(d.p.streams.size()));
        if (added) {
            if (d.p.streams.size() > UINT16_MAX) fail("more than 65535 streams on one device");
            d.p.streams.push_back(e.stream);
        }
        const std::uint16_t stream = sit->second;
        const auto align_log2 = static_cast<std::uint8_t>(trace::detail::log2_of(e.alignment));
        if (e.kind == trace::event_kind::allocate) {
            if (e.bytes == 0) fail("an allocation of 0 bytes");
            if (e.bytes > options.max_request) {
                fail("an allocation of " + std::to_string(e.bytes) + " bytes, larger than any device (" +
                     std::to_string(options.max_request) + " bytes)");
            }
            if (e.bytes > UINT64_MAX - d.live_bytes) {
                fail("live bytes on device " + std::to_string(e.device) + " would be more than 2^64-1 bytes (" +
                     std::to_string(d.live_bytes) + " and " + std::to_string(e.bytes) + " more)");
            }
            if (d.free_slots.empty() && d.p.slots == UINT32_MAX) fail("more than 2^32-1 blocks live at once");
            std::uint32_t slot = 0;
            if (!d.free_slots.empty()) {
                slot = d.free_slots.back();
                d.free_slots.pop_back();
            } else {
                slot = d.p.slots++;
            }
            const auto [it, fresh] = d.live.try_emplace(e.address, detail::device_builder::block{slot, stream, align_log2, e.bytes, e.sequence});
            if (!fresh) {
                fail("allocation of " + custody::detail::to_hex(e.address) + " on device " + std::to_string(e.device) +
                     ", which is live since event " + std::to_string(it->second.sequence) + " and was never freed");
            }
            d.p.ops.push_back({e.bytes, slot, stream, op_kind::allocate, align_log2});
            d.p.sequence.push_back(e.sequence);
            ++d.p.allocations;
            if ((e.flags & trace::flag_pre_trace) != 0) {
                ++d.p.pre_trace;
                if (d.p.first_trace_op + 1 == d.p.ops.size()) d.p.first_trace_op = d.p.ops.size();
            }
            d.p.largest_request = std::max(d.p.largest_request, e.bytes);
            d.live_bytes += e.bytes;
            if (d.live_bytes > d.p.peak_live) {
                d.p.peak_live = d.live_bytes;
                d.p.peak_live_op = d.p.ops.size() - 1;
            }
        } else {
            const auto it = d.live.find(e.address);
            if (it == d.live.end()) {
                fail("free of " + custody::detail::to_hex(e.address) + " on device " + std::to_string(e.device) +
                     ", which is not live (never allocated in the trace, or freed already)");
            }
            const auto& b = it->second;
            if (b.bytes != e.bytes || b.alignment_log2 != align_log2) {
                fail("free of " + custody::detail::to_hex(e.address) + " with " + std::to_string(e.bytes) +
                     " bytes (alignment " + std::to_string(e.alignment) + "); event " + std::to_string(b.sequence) +
                     " allocated it with " + std::to_string(b.bytes) + " bytes (alignment " +
                     std::to_string(std::uint64_t{1} << b.alignment_log2) + ")");
            }
            d.p.ops.push_back({e.bytes, b.slot, stream, op_kind::deallocate, align_log2});
            d.p.sequence.push_back(e.sequence);
            ++d.p.deallocations;
            d.free_slots.push_back(b.slot);
            d.live_bytes -= e.bytes;
            d.live.erase(it);
        }
    }
    out.header = in.header();
    out.events = in.events_read();
    for (auto& [device, d] : devices) {
        for (const auto& [address, b] : d.live) d.p.live_at_end.push_back({b.slot, b.stream, b.alignment_log2, b.bytes});
        std::sort(d.p.live_at_end.begin(), d.p.live_at_end.end(),
                  [](const live_block& a, const live_block& b) { return a.slot < b.slot; });
        if (d.p.reference) d.p.reference->name = out.header.get("reference", "reference");
        if (!d.p.ops.empty() || d.p.reference) out.devices.push_back(std::move(d.p));
    }
    return out;
}

} // namespace custody::replay
