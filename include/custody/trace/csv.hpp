/// @file
/// The lossless CSV form of a trace, for people and spreadsheets: `write_csv` exports a binary
/// trace, `csv_reader` reads the CSV back into events (docs/trace-format.md, "CSV").
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/detail/format.hpp>
#include <custody/core/error.hpp>
#include <custody/trace/event.hpp>
#include <custody/trace/reader.hpp>

#include <algorithm>
#include <charconv>
#include <concepts>
#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::trace {

/// A CSV trace that cannot be read; the message names the input and the line.
class csv_error final : public custody::error {
public:
    csv_error(const std::string& name, std::uint64_t line, const std::string& what)
        : custody::error("CSV trace" + (name.empty() ? std::string() : " '" + name + "'") + ": line " +
                         std::to_string(line) + ": " + what),
          line_(line) {}
    [[nodiscard]] std::uint64_t line() const noexcept { return line_; }

private:
    std::uint64_t line_;
};

/// The column header of the CSV form.
inline constexpr std::string_view csv_columns =
    "sequence,time_ns,action,thread,stream,device,bytes,alignment,address,owner,flags";

namespace detail {

/// `s` as one CSV field: quoted (with doubled quotes) when it holds a comma, a quote or a line break.
inline std::string csv_field(std::string_view s) {
    if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
    std::string q = "\"";
    for (const char c : s) {
        if (c == '"') q += '"';
        q += c;
    }
    q += '"';
    return q;
}

/// Splits one CSV record into fields; false when a quoted field is not closed on this line.
inline bool csv_split(std::string_view line, std::vector<std::string>& fields) {
    fields.clear();
    std::string f;
    std::size_t i = 0;
    for (;;) {
        f.clear();
        if (i < line.size() && line[i] == '"') {
            ++i;
            for (;;) {
                if (i >= line.size()) return false;
                if (line[i] == '"') {
                    if (i + 1 < line.size() && line[i + 1] == '"') {
                        f += '"';
                        i += 2;
                        continue;
                    }
                    ++i;
                    break;
                }
                f += line[i++];
            }
            if (i < line.size() && line[i] != ',') return false;
        } else {
            while (i < line.size() && line[i] != ',') f += line[i++];
        }
        fields.push_back(f);
        if (i >= line.size()) return true;
        ++i; // the comma
    }
}

} // namespace detail

/// Writes the trace at `trace_path` as CSV through `sink` (called with pieces of text of at most
/// about 64 KiB): comment lines with the metadata (`# metadata,key,value`), the threads
/// (`# thread,index,os_id,name`) and the owners (`# owner,index,name`), the column header, then one
/// row per event. Reads the trace twice (the tables first, so they precede the rows), with bounded
/// memory. Throws trace_error as the reader does, and what `sink` throws.
template <class Sink>
    requires std::invocable<Sink&, std::string_view>
void write_csv(const std::string& trace_path, Sink&& sink) {
    trace_header tables;
    {
        reader r(trace_path);
        event e;
        while (r.next(e)) {
        }
        tables = r.header();
    }
    std::string out = "# custody trace, format version 1\n";
    for (const auto& [k, v] : tables.metadata) out += "# metadata," + detail::csv_field(k) + ',' + detail::csv_field(v) + '\n';
    for (const auto& t : tables.threads) {
        out += "# thread," + std::to_string(t.index) + ',' + std::to_string(t.os_id) + ',' + detail::csv_field(t.name) + '\n';
    }
    for (std::size_t i = 0; i < tables.owners.size(); ++i) {
        out += "# owner," + std::to_string(i + 1) + ',' + detail::csv_field(tables.owners[i]) + '\n';
    }
    out += csv_columns;
    out += '\n';
    reader r(trace_path);
    event e;
    while (r.next(e)) {
        out += std::to_string(e.sequence);
        out += ',';
        out += std::to_string(e.time_ns);
        out += ',';
        out += to_string(e.kind);
        out += ',';
        out += std::to_string(e.thread);
        out += ',';
        out += custody::detail::to_hex(static_cast<std::uintptr_t>(e.stream));
        out += ',';
        out += std::to_string(e.device);
        out += ',';
        out += std::to_string(e.bytes);
        out += ',';
        out += std::to_string(e.alignment);
        out += ',';
        out += custody::detail::to_hex(static_cast<std::uintptr_t>(e.address));
        out += ',';
        if (e.owner != 0) out += detail::csv_field(tables.owners[e.owner - 1]);
        out += ',';
        if ((e.flags & flag_pre_trace) != 0) out += "pre_trace";
        out += '\n';
        if (out.size() >= 64 * 1024) {
            sink(std::string_view(out));
            out.clear();
        }
    }
    sink(std::string_view(out));
}

/// write_csv to a stream. Throws custody::error when the stream fails.
inline void write_csv(const std::string& trace_path, std::ostream& out) {
    write_csv(trace_path, [&out](std::string_view text) { out.write(text.data(), static_cast<std::streamsize>(text.size())); });
    if (!out) throw custody::error("custody trace: writing the CSV failed");
}

/// Reads the CSV form back: header() once constructed (every comment line before the column
/// header), then next() event by event. Every field is checked; a problem throws csv_error naming
/// the line. The events come back exactly as write_csv wrote them (sequence, time, kind, thread,
/// stream, device, bytes, alignment, address, owner index, flags).
/// Thread safety: none. Memory: the tables and one line.
class csv_reader {
public:
    csv_reader(std::istream& in, std::string name) : in_(in), name_(std::move(name)) {
        std::string line;
        for (;;) {
            if (!next_line(line)) fail("the input ends before the column header '" + std::string(csv_columns) + "'");
            if (line.starts_with("#")) {
                comment(line);
                continue;
            }
            if (line != csv_columns) fail("expected the column header '" + std::string(csv_columns) + "'");
            break;
        }
    }

    [[nodiscard]] const trace_header& header() const noexcept { return header_; }

    bool next(event& e) {
        std::string line;
        if (!next_line(line)) return false;
        if (!detail::csv_split(line, fields_)) fail("a quoted field is not closed");
        if (fields_.size() != 11) fail("expected 11 fields, found " + std::to_string(fields_.size()));
        e = event{};
        e.sequence = number<std::uint64_t>(fields_[0], "sequence");
        if (e.sequence != sequence_ + 1) {
            fail("sequence " + fields_[0] + " where " + std::to_string(sequence_ + 1) + " comes next");
        }
        e.time_ns = number<std::int64_t>(fields_[1], "time_ns");
        e.kind = kind(fields_[2]);
        e.thread = number<std::uint32_t>(fields_[3], "thread");
        if (e.thread > header_.threads.size()) fail("thread " + fields_[3] + " is not declared");
        e.stream = hex(fields_[4], "stream");
        e.device = number<std::int32_t>(fields_[5], "device");
        if (e.device < -1) fail("device " + fields_[5] + " is below -1");
        e.bytes = number<std::uint64_t>(fields_[6], "bytes");
        e.alignment = number<std::uint64_t>(fields_[7], "alignment");
        if (!is_pow2(e.alignment) || e.alignment > (std::uint64_t{1} << 40)) {
            fail("alignment " + fields_[7] + " is not a power of two up to 2^40");
        }
        e.address = hex(fields_[8], "address");
        if (!fields_[9].empty()) {
            const auto it = owner_index_.find(fields_[9]);
            if (it == owner_index_.end()) fail("owner '" + fields_[9] + "' is not declared");
            e.owner = it->second;
        }
        if (fields_[10] == "pre_trace") {
            e.flags = flag_pre_trace;
        } else if (!fields_[10].empty()) {
            fail("unknown flags '" + fields_[10] + "'");
        }
        ++sequence_;
        return true;
    }

    [[nodiscard]] std::uint64_t line() const noexcept { return line_; }

private:
    [[noreturn]] void fail(const std::string& what) const { throw csv_error(name_, line_, what); }

    /// Reads one record: a line, joined with the next ones while a quoted field is open (a value
    /// that holds a line break). False at the end of the input.
    bool next_line(std::string& line) {
        if (!physical_line(line)) return false;
        std::string more;
        while (std::count(line.begin(), line.end(), '"') % 2 != 0) {
            if (!physical_line(more)) fail("a quoted field is not closed before the end of the input");
            line += '\n';
            line += more;
        }
        return true;
    }
    bool physical_line(std::string& line) {
        if (!std::getline(in_, line)) {
            if (in_.bad()) fail("a read failed");
            return false;
        }
        ++line_;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return true;
    }

    void comment(const std::string& line) {
        if (line_ == 1 && line.starts_with("# custody trace")) return;
        if (!line.starts_with("# ")) fail("unknown comment line");
        if (!detail::csv_split(std::string_view(line).substr(2), fields_)) fail("a quoted field is not closed");
        const std::string& what = fields_[0];
        if (what == "metadata" && fields_.size() == 3) {
            header_.metadata.emplace_back(fields_[1], fields_[2]);
        } else if (what == "thread" && fields_.size() == 4) {
            thread_info t;
            t.index = number<std::uint32_t>(fields_[1], "thread index");
            if (t.index != header_.threads.size() + 1) fail("thread " + fields_[1] + " out of order");
            t.os_id = number<std::uint64_t>(fields_[2], "thread id");
            t.name = fields_[3];
            header_.threads.push_back(std::move(t));
        } else if (what == "owner" && fields_.size() == 3) {
            const auto index = number<std::uint32_t>(fields_[1], "owner index");
            if (index != header_.owners.size() + 1) fail("owner " + fields_[1] + " out of order");
            header_.owners.push_back(fields_[2]);
            owner_index_.try_emplace(fields_[2], index);
        } else {
            fail("unknown comment line (expected '# metadata,KEY,VALUE', '# thread,INDEX,ID,NAME' or "
                 "'# owner,INDEX,NAME')");
        }
    }

    template <class T>
    T number(const std::string& s, const char* field) const {
        T v{};
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) {
            fail(std::string(field) + " '" + s + "' is not a number in range");
        }
        return v;
    }
    std::uint64_t hex(const std::string& s, const char* field) const {
        std::uint64_t v = 0;
        const bool prefixed = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
        const char* first = s.data() + (prefixed ? 2 : 0);
        const auto [end, ec] = std::from_chars(first, s.data() + s.size(), v, 16);
        if (!prefixed || ec != std::errc{} || end != s.data() + s.size()) {
            fail(std::string(field) + " '" + s + "' is not a 0x hexadecimal number in range");
        }
        return v;
    }
    event_kind kind(const std::string& s) const {
        for (int k = 0; k < event_kind_count; ++k)
            if (s == to_string(static_cast<event_kind>(k))) return static_cast<event_kind>(k);
        fail("unknown action '" + s + "'");
    }

    std::istream& in_;
    std::string name_;
    std::uint64_t line_ = 0;     // lines read so far
    std::uint64_t sequence_ = 0; // sequence of the last event read
    trace_header header_;
    std::unordered_map<std::string, std::uint32_t> owner_index_; // first index of each owner name
    std::vector<std::string> fields_;
};

} // namespace custody::trace
