/// @file
/// The replay's report: what each allocator did with each device's program, as a table for
/// people, JSON for tools (custody-plot reads it) and a Chrome/Perfetto trace of the bytes over
/// the replay.
#pragma once

#include "allocator_spec.hpp"
#include "program.hpp"
#include "replay.hpp"

#include <custody/debug/detail/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace custody::replay {

/// One allocator's figures on one device.
struct allocator_result {
    std::string spec;             ///< as written on the command line
    std::vector<double> seconds;  ///< the loop's time in each timed repetition
    double ns_per_op = 0;         ///< median over the repetitions, per operation
    measurement m;
};

/// The reference allocator's figures (PyTorch's, from an imported snapshot), from its own
/// reserved bytes over the same requests.
struct reference_result {
    std::string name;
    std::uint64_t peak_reserved = 0;
    /// The peak from the first op that is not a block live before the trace began: what the
    /// reference allocator held at the start counts only while it lasted into the trace.
    std::uint64_t peak_reserved_in_trace = 0;
    std::uint64_t reserved_at_peak = 0;
    /// Its reserved bytes averaged over the operations (as measurement::mean_reserved), from its
    /// segment events: what it held over the trace, beside its peak.
    double mean_reserved = 0;
    std::optional<std::size_t> first_over_capacity;
};

struct device_result {
    const device_program* program = nullptr;
    std::vector<allocator_result> allocators;
    std::optional<reference_result> reference;
};

struct report {
    const replay::program* trace = nullptr;
    std::uint64_t capacity = 0;
    int repetitions = 0;
    std::string machine;
    std::string date;
    std::vector<device_result> devices;
};

/// The mean of `s` over operations [0, n): its value at each operation (reference_series::at),
/// averaged. O(points + 1).
[[nodiscard]] inline double mean_over_ops(const reference_series& s, std::size_t n) {
    if (n == 0) return 0.0;
    long double sum = 0;
    std::size_t from = 0;
    std::uint64_t value = s.at(0);
    for (const auto& [k, v] : s.points) {
        if (k == 0) continue;
        if (k >= n) break;
        sum += static_cast<long double>(value) * static_cast<long double>(k - from);
        from = k;
        value = v;
    }
    sum += static_cast<long double>(value) * static_cast<long double>(n - from);
    return static_cast<double>(sum / static_cast<long double>(n));
}

/// The reference's figures for `p` at `capacity`.
[[nodiscard]] inline reference_result reference_figures(const device_program& p, std::uint64_t capacity) {
    reference_result r;
    r.name = p.reference->name;
    r.peak_reserved = p.reference->peak;
    r.peak_reserved_in_trace = p.reference->peak_from(p.first_trace_op);
    r.reserved_at_peak = p.reference->at(p.peak_live_op);
    r.mean_reserved = mean_over_ops(*p.reference, p.ops.size());
    for (const auto& [k, v] : p.reference->points) {
        if (v > capacity) {
            r.first_over_capacity = k;
            break;
        }
    }
    return r;
}

[[nodiscard]] inline double fragmentation(std::uint64_t peak_reserved, std::uint64_t peak_live) noexcept {
    return peak_live == 0 ? 0.0 : static_cast<double>(peak_reserved) / static_cast<double>(peak_live);
}

namespace detail {

inline std::string format_time(double ns) {
    char buf[32];
    if (ns >= 1e6) std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
    else if (ns >= 1e3) std::snprintf(buf, sizeof buf, "%.2f us", ns / 1e3);
    else std::snprintf(buf, sizeof buf, "%.1f ns", ns);
    return buf;
}

/// a / b with three decimals; "-" when b is 0.
inline std::string ratio(double a, double b) {
    if (b <= 0) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", a / b);
    return buf;
}

inline std::string format_op(const device_program& p, std::optional<std::size_t> op) {
    if (!op) return "-";
    if (*op >= p.ops.size()) return "after the last op";
    return "op " + std::to_string(*op) + " (event " + std::to_string(p.sequence[*op]) + ")";
}

/// Pads the columns of `rows` to their widest cell; the first column left-aligned, the others right.
inline std::string columns(const std::vector<std::vector<std::string>>& rows) {
    std::vector<std::size_t> width;
    for (const auto& r : rows) {
        width.resize(std::max(width.size(), r.size()));
        for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
    }
    std::string out;
    for (const auto& r : rows) {
        std::string line;
        for (std::size_t c = 0; c < r.size(); ++c) {
            const std::string pad(width[c] - r[c].size(), ' ');
            line += c == 0 ? r[c] + pad : "  " + pad + r[c];
        }
        while (!line.empty() && line.back() == ' ') line.pop_back();
        out += line + '\n';
    }
    return out;
}

} // namespace detail

/// For the allocators that grow by mapping: the peak of mapped bytes (their peak reserved) beside
/// the address space reserved and the most of it in use, the granule, map and unmap calls per
/// thousand operations, and what trim() left mapped after the trace beside the live blocks then.
[[nodiscard]] inline std::string mapping_table(const device_program& p, const device_result& d) {
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"mapping", "peak mapped", "address space", "peak span", "granule", "maps/kop", "unmaps/kop",
                    "mapped after trim", "live blocks at end"});
    char maps[32], unmaps[32];
    const double kops = static_cast<double>(std::max<std::size_t>(p.ops.size(), 1)) / 1000.0;
    for (const auto& a : d.allocators) {
        if (!a.m.mapping) continue;
        const mapping_figures& f = *a.m.mapping;
        std::snprintf(maps, sizeof maps, "%.2f", static_cast<double>(f.map_calls) / kops);
        std::snprintf(unmaps, sizeof unmaps, "%.2f", static_cast<double>(f.unmap_calls) / kops);
        rows.push_back({a.spec, format_bytes(a.m.peak_reserved), format_bytes(f.address_space), format_bytes(f.peak_span),
                        format_bytes(f.granule), maps, unmaps, format_bytes(f.mapped_after_trim),
                        format_bytes(f.live_at_end)});
    }
    return rows.size() == 1 ? std::string() : detail::columns(rows);
}

/// The report as a table per device: time per operation (median) and its ratio to the first
/// allocator's, peak reserved, fragmentation (peak reserved / peak live), reserved and largest
/// free block where the trace's live bytes peak, the first operation over the capacity, failures.
[[nodiscard]] inline std::string format_table(const report& r) {
    const program& t = *r.trace;
    std::string out = "trace " + t.name + " (" + t.header.get("source", "unknown source") + "): " +
                      std::to_string(t.events) + " events\n";
    out += "capacity " + format_bytes(r.capacity) + ", time per op: median of " + std::to_string(r.repetitions) +
           " timed replays" + (r.machine.empty() ? "" : ", " + r.machine) + (r.date.empty() ? "" : ", " + r.date) + "\n";
    for (const auto& d : r.devices) {
        const device_program& p = *d.program;
        out += "\ndevice " + std::to_string(p.device) + ": " + std::to_string(p.ops.size()) + " ops (" +
               std::to_string(p.allocations) + " allocations, " + std::to_string(p.pre_trace) +
               " of them live before the trace began), " + std::to_string(p.streams.size()) + " stream" +
               (p.streams.size() == 1 ? "" : "s") + ", peak live " + format_bytes(p.peak_live) + " at " +
               detail::format_op(p, p.ops.empty() ? std::nullopt : std::optional<std::size_t>(p.peak_live_op)) + "\n";
        std::vector<std::vector<std::string>> rows;
        const std::string first = d.allocators.empty() ? "" : d.allocators.front().spec;
        rows.push_back({"allocator", "time/op", "vs " + first, "peak reserved", "fragmentation", "mean reserved",
                        "mean reserved / live", "reserved at peak", "largest free at peak", "first op over capacity",
                        "failed"});
        const double base = d.allocators.empty() ? 0.0 : d.allocators.front().ns_per_op;
        char buf[64];
        for (const auto& a : d.allocators) {
            std::snprintf(buf, sizeof buf, "%.3f", fragmentation(a.m.peak_reserved, p.peak_live));
            const std::string frag = buf;
            std::snprintf(buf, sizeof buf, "%.2f", base > 0 ? a.ns_per_op / base : 0.0);
            rows.push_back({a.spec, detail::format_time(a.ns_per_op), buf, format_bytes(a.m.peak_reserved), frag,
                            format_bytes(static_cast<std::uint64_t>(a.m.mean_reserved)),
                            detail::ratio(a.m.mean_reserved, a.m.mean_live), format_bytes(a.m.reserved_at_peak),
                            a.m.largest_free_at_peak ? format_bytes(*a.m.largest_free_at_peak) : "-",
                            detail::format_op(p, a.m.first_over_capacity),
                            a.m.failed_allocations == 0 ? "-" : std::to_string(a.m.failed_allocations) + " from " +
                                                                    detail::format_op(p, a.m.first_failure)});
        }
        if (d.reference) {
            const auto& ref = *d.reference;
            std::snprintf(buf, sizeof buf, "%.3f", fragmentation(ref.peak_reserved, p.peak_live));
            const double mean_live = d.allocators.empty() ? 0.0 : d.allocators.front().m.mean_live;
            rows.push_back({ref.name + " (recorded)", "-", "-", format_bytes(ref.peak_reserved), buf,
                            format_bytes(static_cast<std::uint64_t>(ref.mean_reserved)),
                            detail::ratio(ref.mean_reserved, mean_live), format_bytes(ref.reserved_at_peak), "-",
                            detail::format_op(p, ref.first_over_capacity), "-"});
            if (ref.peak_reserved_in_trace != ref.peak_reserved) {
                std::snprintf(buf, sizeof buf, "%.3f", fragmentation(ref.peak_reserved_in_trace, p.peak_live));
                rows.push_back({ref.name + " (recorded, from op " + std::to_string(p.first_trace_op) + ")", "-", "-",
                                format_bytes(ref.peak_reserved_in_trace), buf, "-", "-",
                                format_bytes(ref.reserved_at_peak), "-", "-", "-"});
            }
        }
        out += detail::columns(rows);
        if (d.reference && d.reference->peak_reserved_in_trace != d.reference->peak_reserved) {
            out += d.reference->name + " held " + format_bytes(d.reference->peak_reserved) +
                   " when the trace began (its cache before recording); from op " + std::to_string(p.first_trace_op) +
                   " on (the blocks live before the trace are ops 0.." +
                   std::to_string(p.first_trace_op == 0 ? 0 : p.first_trace_op - 1) + "), its peak is " +
                   format_bytes(d.reference->peak_reserved_in_trace) + "\n";
        }
        out += mapping_table(p, d);
        for (const auto& a : d.allocators) {
            if (a.m.failed_allocations != 0) out += a.spec + ": first failure: " + a.m.failure_message + "\n";
        }
    }
    return out;
}

/// The report as JSON (schema "custody.replay.report", version 1; docs/replay.md lists the fields).
[[nodiscard]] inline std::string to_json(const report& r) {
    namespace json = debug::detail::json;
    const program& t = *r.trace;
    json::writer w;
    w.begin_object();
    w.field("schema", "custody.replay.report");
    w.field("version", 1);
    w.key("trace");
    w.begin_object();
    w.field("file", t.name);
    w.field("events", static_cast<std::uint64_t>(t.events));
    w.key("metadata");
    w.begin_object();
    for (const auto& [k, v] : t.header.metadata) w.field(k, v);
    w.end_object();
    w.end_object();
    w.field("capacity_bytes", static_cast<std::uint64_t>(r.capacity));
    w.field("repetitions", r.repetitions);
    w.field("machine", r.machine);
    w.field("date", r.date);
    const auto optional_number = [&w](const char* key, std::optional<std::uint64_t> v) {
        w.key(key);
        if (v) w.number(*v);
        else w.null();
    };
    const auto series = [&w](const char* key, const std::vector<std::uint64_t>& v) {
        w.key(key);
        w.begin_array();
        for (const auto x : v) w.number(x);
        w.end_array();
    };
    w.key("devices");
    w.begin_array();
    for (const auto& d : r.devices) {
        const device_program& p = *d.program;
        w.begin_object();
        w.field("device", p.device);
        w.field("ops", static_cast<std::uint64_t>(p.ops.size()));
        w.field("allocations", p.allocations);
        w.field("deallocations", p.deallocations);
        w.field("pre_trace_allocations", p.pre_trace);
        w.field("first_trace_op", static_cast<std::uint64_t>(p.first_trace_op));
        w.field("failures_in_trace", p.failures_in_trace);
        w.field("streams", static_cast<std::uint64_t>(p.streams.size()));
        w.field("peak_live_bytes", p.peak_live);
        w.field("peak_live_op", static_cast<std::uint64_t>(p.peak_live_op));
        w.field("largest_request_bytes", p.largest_request);
        w.field("live_at_end_bytes", p.live_at_end_bytes());
        w.key("allocators");
        w.begin_array();
        for (const auto& a : d.allocators) {
            w.begin_object();
            w.field("allocator", a.spec);
            w.field("ns_per_op", a.ns_per_op);
            w.key("seconds");
            w.begin_array();
            for (const double s : a.seconds) w.number(s);
            w.end_array();
            w.field("peak_reserved_bytes", a.m.peak_reserved);
            w.field("fragmentation", fragmentation(a.m.peak_reserved, p.peak_live));
            w.field("mean_reserved_bytes", a.m.mean_reserved);
            w.field("mean_live_bytes", a.m.mean_live);
            w.field("reserved_at_peak_bytes", a.m.reserved_at_peak);
            optional_number("largest_free_at_peak_bytes", a.m.largest_free_at_peak);
            optional_number("observed_peak_live_bytes", a.m.observed_peak_live);
            optional_number("first_op_over_capacity", a.m.first_over_capacity);
            w.field("failed_allocations", a.m.failed_allocations);
            optional_number("first_failed_op", a.m.first_failure);
            w.field("failure", a.m.failure_message);
            w.key("mapping");
            if (a.m.mapping) {
                const mapping_figures& f = *a.m.mapping;
                w.begin_object();
                w.field("peak_mapped_bytes", a.m.peak_reserved);
                w.field("address_space_bytes", f.address_space);
                w.field("peak_address_span_bytes", f.peak_span);
                w.field("granule_bytes", f.granule);
                w.field("map_calls", f.map_calls);
                w.field("unmap_calls", f.unmap_calls);
                w.field("live_block_bytes_at_end", f.live_at_end);
                w.field("mapped_after_trim_bytes", f.mapped_after_trim);
                w.end_object();
            } else {
                w.null();
            }
            w.key("timeline");
            w.begin_object();
            series("op", a.m.timeline.op);
            series("live", a.m.timeline.live);
            series("reserved", a.m.timeline.reserved);
            w.end_object();
            w.end_object();
        }
        w.end_array();
        w.key("reference");
        if (d.reference) {
            const auto& ref = *d.reference;
            w.begin_object();
            w.field("name", ref.name);
            w.field("peak_reserved_bytes", ref.peak_reserved);
            w.field("fragmentation", fragmentation(ref.peak_reserved, p.peak_live));
            w.field("peak_reserved_in_trace_bytes", ref.peak_reserved_in_trace);
            w.field("fragmentation_in_trace", fragmentation(ref.peak_reserved_in_trace, p.peak_live));
            w.field("reserved_at_peak_bytes", ref.reserved_at_peak);
            w.field("mean_reserved_bytes", ref.mean_reserved);
            optional_number("first_op_over_capacity", ref.first_over_capacity);
            w.key("timeline");
            w.begin_object();
            std::vector<std::uint64_t> op, reserved;
            for (const auto& [k, v] : p.reference->points) {
                op.push_back(k);
                reserved.push_back(v);
            }
            series("op", op);
            series("reserved", reserved);
            w.end_object();
            w.end_object();
        } else {
            w.null();
        }
        w.end_object();
    }
    w.end_array();
    w.end_object();
    std::string text = w.take();
    text += '\n';
    return text;
}

/// A Chrome/Perfetto trace (the JSON object format the merge tool also writes): one process per
/// device and allocator, with counter tracks "live" and "reserved" (bytes) over the replay; the
/// time axis is the operation index, one op per microsecond. The reference allocator, when there
/// is one, has a process of its own. Opens in ui.perfetto.dev.
[[nodiscard]] inline std::string to_perfetto(const report& r) {
    namespace json = debug::detail::json;
    json::writer w;
    w.begin_object();
    w.field("displayTimeUnit", "ns");
    w.key("traceEvents");
    w.begin_array();
    int pid = 0;
    const auto process = [&w](int id, const std::string& name) {
        w.begin_object();
        w.field("name", "process_name");
        w.field("ph", "M");
        w.field("pid", id);
        w.key("args");
        w.begin_object();
        w.field("name", name);
        w.end_object();
        w.end_object();
    };
    const auto counter = [&w](int id, std::uint64_t op, const char* track, std::uint64_t bytes) {
        w.begin_object();
        w.field("name", track);
        w.field("ph", "C");
        w.field("pid", id);
        w.field("ts", op);
        w.key("args");
        w.begin_object();
        w.field("bytes", bytes);
        w.end_object();
        w.end_object();
    };
    for (const auto& d : r.devices) {
        const device_program& p = *d.program;
        for (const auto& a : d.allocators) {
            process(++pid, "device " + std::to_string(p.device) + ": " + a.spec);
            for (std::size_t i = 0; i < a.m.timeline.op.size(); ++i) {
                counter(pid, a.m.timeline.op[i], "live", a.m.timeline.live[i]);
                counter(pid, a.m.timeline.op[i], "reserved", a.m.timeline.reserved[i]);
            }
        }
        if (p.reference) {
            process(++pid, "device " + std::to_string(p.device) + ": " + p.reference->name + " (recorded)");
            for (const auto& [k, v] : p.reference->points) counter(pid, k, "reserved", v);
        }
    }
    w.end_array();
    w.end_object();
    std::string text = w.take();
    text += '\n';
    return text;
}

} // namespace custody::replay
