/// @file
/// A memory snapshot in the format of PyTorch's torch.cuda.memory._dump_snapshot(), made from what
/// custody knows, so that PyTorch's memory viewer (pytorch.org/memory_viz, torch.cuda._memory_viz)
/// shows custody's memory: `make_pytorch_snapshot` lays one rank's devices out, `to_pickle` and
/// `write_pytorch_snapshot` write it as the pickle the viewer reads.
///
/// The format (PyTorch's memory_snapshot.cpp, and what its viewer reads):
///   {"segments": [segment...], "device_traces": [[trace entry...] per device], "allocator_settings": {...}}
///   segment: device, address, total_size, allocated_size, active_size, requested_size, stream,
///            segment_type, segment_pool_id, is_expandable, frames, blocks
///   block:   address, size, requested_size, state ("active_allocated", "active_pending_free",
///            "inactive"), frames; a segment's blocks tile it in address order
///   trace entry: action, addr (device_free for "oom"), size, stream, time_us, frames, user_metadata
///   frame:   filename, line, name (innermost first)
/// From custody: segments are the chunks a segment_journal saw the pool take; blocks are the
/// tracker's live blocks (pending free: held by recorded_streams for another stream's work) and the
/// gaps between them. A block starts at the address its user holds, the one its trace entries
/// name (so that the viewer draws each live block once): a tracker's front guard lies in the gap
/// before it, its back guard inside it; traces are an allocation_history's events. Each block's and entry's frames are
/// its allocation's call stack with its owner last (outermost), as a frame of its own
/// {filename: "<custody owner>", line: 0, name: OWNER}, so that the viewer's stacks and
/// flamegraphs group by owner; trace entries carry the owner in user_metadata too (the format's
/// room for it). A live block in no known segment gets a segment of its own.
#pragma once

#include <custody/core/detail/output_file.hpp>
#include <custody/debug/detail/call_stack.hpp>
#include <custody/debug/detail/frame_text.hpp>
#include <custody/debug/detail/pickle_writer.hpp>
#include <custody/debug/history.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/segment_journal.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::debug {

/// What one device holds, as the layers that know it tell it: the pool's segments (its
/// segment_journal), the tracker's live blocks, the blocks recorded_streams holds for other
/// streams (user pointers, live in the tracker), and the device's history (may be empty).
struct device_memory_state {
    int device = 0;
    std::vector<memory_segment> segments;
    std::vector<live_block> blocks;
    std::vector<std::uintptr_t> pending_free;
    std::vector<history_event> history;
};

/// The highest device number a snapshot takes: device_traces holds a list for every device up to
/// the highest, so a number beyond any machine's devices is refused rather than made a list of
/// billions (or, at INT_MAX, overflowed). PyTorch numbers devices with a small integer
/// (c10::DeviceIndex); 1023 leaves room for any machine and keeps the lists a reader walks few.
inline constexpr int max_snapshot_device = 1023;

/// A frame of PyTorch's format.
struct snapshot_frame {
    std::string filename;
    std::int64_t line = 0;
    std::string name;
    friend bool operator==(const snapshot_frame&, const snapshot_frame&) = default;
};

/// A block of a segment. `state`: "active_allocated", "active_pending_free" or "inactive".
struct snapshot_block {
    std::uintptr_t address = 0;
    std::size_t size = 0;
    std::size_t requested_size = 0;
    std::string_view state = "inactive";
    std::vector<snapshot_frame> frames;
};

struct snapshot_segment {
    int device = 0;
    std::uintptr_t address = 0;
    std::size_t total_size = 0;
    std::uintptr_t stream = 0;
    std::vector<snapshot_block> blocks; ///< tiling [address, address + total_size) in address order

    [[nodiscard]] std::size_t sum(std::string_view state, bool requested) const noexcept {
        std::size_t n = 0;
        for (const snapshot_block& b : blocks) {
            if (b.state == state) n += requested ? b.requested_size : b.size;
        }
        return n;
    }
};

struct snapshot_trace_entry {
    history_action action = history_action::alloc;
    std::uintptr_t address = 0;
    std::size_t size = 0;
    std::uintptr_t stream = 0;
    std::int64_t time_us = 0;
    std::string owner;
    std::vector<snapshot_frame> frames;
};

/// One rank's snapshot: PyTorch's segments and device_traces (one list per device, 0..max device).
struct pytorch_snapshot {
    std::vector<snapshot_segment> segments;
    std::vector<std::vector<snapshot_trace_entry>> device_traces;
};

namespace detail {

/// The frame of custody's frame text (frame_text.hpp): "FILE:LINE in FUNCTION [MODULE+0xOFFSET]" is
/// {FILE, LINE, FUNCTION}; a frame without a source line is {MODULE+0xOFFSET, 0, FUNCTION or the
/// text}.
[[nodiscard]] inline snapshot_frame parse_frame(std::string_view text) {
    snapshot_frame f;
    std::string_view rest = text;
    if (const auto at = frame_location(text)) {
        f.filename = (at->module.empty() ? std::string("?") : at->module) + "+" + custody::detail::to_hex(at->offset);
        rest = text.substr(0, text.rfind(" ["));
    }
    if (const auto in = rest.find(" in "); in != std::string_view::npos) {
        const std::string_view where = rest.substr(0, in);
        const auto colon = where.rfind(':');
        if (colon != std::string_view::npos && colon + 1 < where.size() &&
            std::all_of(where.begin() + static_cast<std::ptrdiff_t>(colon) + 1, where.end(),
                        [](char c) { return c >= '0' && c <= '9'; }) &&
            where.size() - colon - 1 <= 9) {
            f.filename = std::string(where.substr(0, colon));
            f.line = std::stoll(std::string(where.substr(colon + 1)));
            f.name = std::string(rest.substr(in + 4));
            return f;
        }
    }
    f.name = std::string(rest);
    if (f.filename.empty()) f.filename = "?";
    return f;
}

/// Frames of (stack, owner), symbolized once per distinct stack.
class frame_cache {
public:
    const std::vector<snapshot_frame>& frames(const call_stack& stack, owner_id owner) {
        auto found = by_stack_.find(stack);
        if (found == by_stack_.end()) {
            std::vector<snapshot_frame> frames;
            for (const std::string& text : stack.symbolize()) frames.push_back(parse_frame(text));
            found = by_stack_.emplace(stack, std::move(frames)).first;
        }
        scratch_ = found->second;
        scratch_.push_back(snapshot_frame{"<custody owner>", 0, std::string(owner_name(owner))});
        return scratch_;
    }

private:
    std::unordered_map<call_stack, std::vector<snapshot_frame>, call_stack_hash> by_stack_;
    std::vector<snapshot_frame> scratch_;
};

/// The block extent a live block fills in its segment: from its upstream block, its bytes rounded
/// up to 256 (every pool block is a multiple of it, so the extent never reaches the next block).
[[nodiscard]] inline std::size_t extent(const live_block& b) noexcept { return (b.total + 255) / 256 * 256; }

/// Lays `blocks` (sorted by outer address, all within `s`) out in segment `s`, each at its user's
/// address (b.address, within [b.outer, b.outer + extent(b))), with the gaps between them (and
/// the guards before them) as inactive blocks.
inline void lay_out(snapshot_segment& s, const std::vector<const live_block*>& blocks,
                    const std::vector<std::uintptr_t>& pending, frame_cache& cache) {
    const std::uintptr_t end = s.address + s.total_size;
    std::uintptr_t at = s.address;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
        const live_block& b = *blocks[i];
        const std::uintptr_t next = std::max(at, i + 1 < blocks.size() ? blocks[i + 1]->outer : end);
        const std::uintptr_t start = std::clamp(b.address, at, next); // b.address but for overlapping input
        const std::uintptr_t stop = std::clamp<std::uintptr_t>(b.outer + extent(b), start, next);
        if (start > at) s.blocks.push_back(snapshot_block{at, start - at, 0, "inactive", {}});
        const std::size_t size = stop - start;
        const bool held = std::binary_search(pending.begin(), pending.end(), b.address);
        s.blocks.push_back(snapshot_block{start, size, std::min(b.bytes, size),
                                          held ? "active_pending_free" : "active_allocated", cache.frames(b.stack, b.owner)});
        at = stop;
    }
    if (at < end) s.blocks.push_back(snapshot_block{at, end - at, 0, "inactive", {}});
}

/// One device's segments, each with its live blocks laid out; blocks in no segment get their own.
inline void add_segments(pytorch_snapshot& out, device_memory_state& d, frame_cache& cache) {
    std::sort(d.segments.begin(), d.segments.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
    std::sort(d.blocks.begin(), d.blocks.end(), [](const auto& a, const auto& b) { return a.outer < b.outer; });
    std::sort(d.pending_free.begin(), d.pending_free.end());
    std::vector<std::vector<const live_block*>> inside(d.segments.size());
    for (const live_block& b : d.blocks) {
        auto seg = std::upper_bound(d.segments.begin(), d.segments.end(), b.outer,
                                    [](std::uintptr_t a, const memory_segment& s) { return a < s.address; });
        if (seg != d.segments.begin() && b.outer < std::prev(seg)->address + std::prev(seg)->bytes) {
            inside[static_cast<std::size_t>(std::prev(seg) - d.segments.begin())].push_back(&b);
        } else {
            snapshot_segment s{d.device, b.outer, extent(b), b.stream, {}};
            lay_out(s, {&b}, d.pending_free, cache);
            out.segments.push_back(std::move(s));
        }
    }
    for (std::size_t i = 0; i < d.segments.size(); ++i) {
        snapshot_segment s{d.device, d.segments[i].address, d.segments[i].bytes, d.segments[i].stream, {}};
        lay_out(s, inside[i], d.pending_free, cache);
        out.segments.push_back(std::move(s));
    }
}

/// A device's trace from its history, in the order of the events. Times never go back (the
/// tracker's clock is coarse, the journal's is not): a reader that orders by time keeps the order.
inline std::vector<snapshot_trace_entry> trace_of(const std::vector<history_event>& history, frame_cache& cache) {
    std::vector<snapshot_trace_entry> trace;
    trace.reserve(history.size());
    std::int64_t last_us = INT64_MIN;
    for (const history_event& e : history) {
        const bool segment_event = e.action == history_action::segment_alloc || e.action == history_action::segment_free ||
                                   e.action == history_action::segment_map || e.action == history_action::segment_unmap;
        last_us = std::max(last_us, e.unix_ns / 1000);
        snapshot_trace_entry t{e.action, e.address, e.bytes, e.stream, last_us,
                               segment_event ? std::string() : std::string(owner_name(e.owner)), {}};
        if (!segment_event && e.action != history_action::oom) t.frames = cache.frames(e.stack, e.owner);
        trace.push_back(std::move(t));
    }
    return trace;
}

inline void write_frames(pickle_writer& w, const std::vector<snapshot_frame>& frames) {
    w.begin_list();
    for (const snapshot_frame& f : frames) {
        w.begin_dict();
        w.key("filename");
        w.text(f.filename);
        w.key("line");
        w.integer(f.line);
        w.key("name");
        w.text(f.name);
        w.end_dict();
    }
    w.end_list();
}

inline void write_block(pickle_writer& w, const snapshot_block& b) {
    w.begin_dict();
    w.key("address");
    w.integer(static_cast<std::uint64_t>(b.address));
    w.key("size");
    w.integer(static_cast<std::uint64_t>(b.size));
    w.key("requested_size");
    w.integer(static_cast<std::uint64_t>(b.requested_size));
    w.key("state");
    w.text(b.state);
    w.key("frames");
    write_frames(w, b.frames);
    w.end_dict();
}

inline void write_segment(pickle_writer& w, const snapshot_segment& s) {
    w.begin_dict();
    w.key("device");
    w.integer(std::int64_t{s.device});
    w.key("address");
    w.integer(static_cast<std::uint64_t>(s.address));
    w.key("total_size");
    w.integer(static_cast<std::uint64_t>(s.total_size));
    w.key("allocated_size");
    w.integer(static_cast<std::uint64_t>(s.sum("active_allocated", false)));
    w.key("active_size");
    w.integer(static_cast<std::uint64_t>(s.sum("active_allocated", false) + s.sum("active_pending_free", false)));
    w.key("requested_size");
    w.integer(static_cast<std::uint64_t>(s.sum("active_allocated", true) + s.sum("active_pending_free", true)));
    w.key("stream");
    w.integer(static_cast<std::uint64_t>(s.stream));
    w.key("segment_type");
    w.text("large");
    w.key("segment_pool_id");
    w.pair(0, 0);
    w.key("is_expandable");
    w.boolean(false);
    w.key("frames");
    write_frames(w, {});
    w.key("blocks");
    w.begin_list();
    for (const snapshot_block& b : s.blocks) write_block(w, b);
    w.end_list();
    w.end_dict();
}

inline void write_entry(pickle_writer& w, const snapshot_trace_entry& t) {
    w.begin_dict();
    w.key("action");
    w.text(to_string(t.action));
    w.key(t.action == history_action::oom ? "device_free" : "addr");
    w.integer(static_cast<std::uint64_t>(t.address));
    w.key("size");
    w.integer(static_cast<std::uint64_t>(t.size));
    w.key("stream");
    w.integer(static_cast<std::uint64_t>(t.stream));
    w.key("time_us");
    w.integer(t.time_us);
    w.key("frames");
    write_frames(w, t.frames);
    w.key("user_metadata");
    w.text(t.owner);
    w.end_dict();
}

} // namespace detail

/// One rank's snapshot from the state of its devices (stacks are symbolized here, once each); a
/// device below 0 is left out. Throws std::invalid_argument for a device above max_snapshot_device.
/// O(n log n) in the blocks and segments, plus the symbolizing.
[[nodiscard]] inline pytorch_snapshot make_pytorch_snapshot(std::vector<device_memory_state> devices) {
    pytorch_snapshot out;
    detail::frame_cache cache;
    int last_device = -1;
    for (const device_memory_state& d : devices) {
        if (d.device > max_snapshot_device) {
            throw std::invalid_argument("custody: a snapshot of device " + std::to_string(d.device) +
                                        ", above the highest it takes (" + std::to_string(max_snapshot_device) + ")");
        }
        last_device = std::max(last_device, d.device);
    }
    out.device_traces.resize(static_cast<std::size_t>(last_device + 1));
    for (device_memory_state& d : devices) {
        if (d.device < 0) continue;
        detail::add_segments(out, d, cache);
        auto& trace = out.device_traces[static_cast<std::size_t>(d.device)];
        trace = detail::trace_of(d.history, cache);
    }
    return out;
}

/// The snapshot as the pickle torch.cuda.memory._dump_snapshot() writes (protocol 2, plain values).
[[nodiscard]] inline std::string to_pickle(const pytorch_snapshot& s) {
    std::string out;
    detail::pickle_writer w(out);
    w.begin();
    w.begin_dict();
    w.key("segments");
    w.begin_list();
    for (const snapshot_segment& seg : s.segments) detail::write_segment(w, seg);
    w.end_list();
    w.key("device_traces");
    w.begin_list();
    for (const auto& trace : s.device_traces) {
        w.begin_list();
        for (const snapshot_trace_entry& t : trace) detail::write_entry(w, t);
        w.end_list();
    }
    w.end_list();
    w.key("allocator_settings");
    w.begin_dict();
    w.key("allocator");
    w.text("custody");
    w.end_dict();
    w.end_dict();
    w.end();
    return out;
}

/// Writes the snapshot's pickle to `path` as every custody writer writes a file
/// (core/detail/output_file.hpp): a new file under an unpredictable name beside it, renamed into
/// place once complete, so that a reader never sees half a file, nothing linked in place is written
/// through, and threads or processes writing one path each succeed; a character device or a pipe is
/// written in place. Throws custody::error naming the file.
inline void write_pytorch_snapshot(const pytorch_snapshot& s, const std::string& path) {
    custody::detail::write_file(path, to_pickle(s));
}

} // namespace custody::debug
