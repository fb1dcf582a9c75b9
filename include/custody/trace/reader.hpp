/// @file
/// `trace::reader`: reads a trace in the binary format of docs/trace-format.md as a stream of
/// events, a buffer at a time, checking every record; malformed input is a typed trace_error.
#pragma once

#include <custody/trace/detail/codec.hpp>
#include <custody/trace/event.hpp>
#include <custody/trace/trace_error.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <istream>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace custody::trace {

/// Reads a trace from a file or any std::istream, one event at a time: memory stays bounded by a
/// 64 KiB buffer and the trace's tables, whatever the trace's length.
///
/// Construction reads the magic, the version and every record up to the first event (the
/// metadata, which the format puts first, is complete then); next() reads on, record by record, and
/// returns the events in order, false once the end record is read and checked. A trace still being
/// written (or cut short) gives every complete event before the truncated error. Thread and owner tables grow as declarations
/// are met, always before the events that name them.
///
/// Errors: every problem throws trace_error naming the file, the byte offset of the record, the
/// event and the reason (cannot_open, not_a_trace, unsupported_version, truncated, malformed).
/// Input is untrusted: no value read from it sizes an allocation beyond the format's limits (a
/// string is at most 1 MiB), every varint is bounded, every index is checked against its table.
/// After an error the reader stays failed (every later call throws the same error).
/// Thread safety: none. Complexity: O(1) per event, amortized.
class reader {
public:
    /// Opens the trace at `path`.
    explicit reader(const std::string& path) : reader(open(path), path) {}

    /// Reads the trace from `in`; `name` only names it in errors.
    reader(std::unique_ptr<std::istream> in, std::string name) : in_(std::move(in)), name_(std::move(name)) {
        if (!in_ || !*in_) fail(trace_error::reason::cannot_open, "cannot open the file for reading");
        read_preamble();
        has_pending_ = read_record(pending_);
    }

    reader(const reader&) = delete;
    reader& operator=(const reader&) = delete;

    /// The metadata (complete) and the threads and owners declared so far.
    [[nodiscard]] const trace_header& header() const noexcept { return header_; }

    /// Reads the next event into `e`; false at the end of the trace (the end record checked).
    bool next(event& e) {
        if (has_pending_) {
            e = pending_;
            has_pending_ = false;
            return true;
        }
        return !finished_ && read_record(e);
    }

    [[nodiscard]] std::uint64_t events_read() const noexcept { return events_; }
    /// Bytes consumed so far.
    [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

private:
    static std::unique_ptr<std::istream> open(const std::string& path) {
        std::error_code ec;
        if (std::filesystem::is_directory(path, ec)) return nullptr; // opens on Linux, then fails to read
        return std::make_unique<std::ifstream>(path, std::ios::binary);
    }

    [[noreturn]] void fail(trace_error::reason why, const std::string& what) const {
        throw trace_error(why, name_, record_start_, events_ + (in_event_ ? 1 : 0), what, !in_event_ && events_ != 0);
    }

    /// Refills the buffer; false at the end of the input.
    bool refill() {
        if (eof_) return false;
        in_->read(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
        const auto got = in_->gcount();
        if (in_->bad()) fail(trace_error::reason::cannot_open, "a read from the file failed");
        if (got <= 0) {
            eof_ = true;
            return false;
        }
        begin_ = 0;
        end_ = static_cast<std::size_t>(got);
        return true;
    }
    [[nodiscard]] bool at_end() { return begin_ == end_ && !refill(); }

    std::uint8_t get_u8() {
        if (begin_ == end_ && !refill()) fail(trace_error::reason::truncated, "the data ends inside a record");
        ++offset_;
        return static_cast<std::uint8_t>(buffer_[begin_++]);
    }
    std::uint64_t get_varint(const char* field) {
        std::uint64_t v = 0;
        for (int i = 0; i < detail::max_varint_bytes; ++i) {
            const std::uint8_t b = get_u8();
            const std::uint64_t bits = b & 0x7F;
            if (i == detail::max_varint_bytes - 1 && bits > 1) {
                fail(trace_error::reason::malformed, std::string("the varint of ") + field + " overflows 64 bits");
            }
            v |= bits << (7 * i);
            if ((b & 0x80) == 0) return v;
        }
        fail(trace_error::reason::malformed, std::string("the varint of ") + field + " is longer than 10 bytes");
    }
    std::string get_string(const char* field) {
        const std::uint64_t n = get_varint(field);
        if (n > detail::max_string) {
            fail(trace_error::reason::malformed, std::string("the ") + field + " is " + std::to_string(n) +
                                                     " bytes long, over the format's limit of 1 MiB");
        }
        std::string s;
        s.reserve(static_cast<std::size_t>(n));
        for (std::uint64_t i = 0; i < n; ++i) s += static_cast<char>(get_u8());
        return s;
    }

    void read_preamble() {
        std::string head;
        for (std::size_t i = 0; i < detail::magic.size(); ++i) {
            if (at_end()) {
                fail(trace_error::reason::not_a_trace,
                     i == 0 ? "the file is empty" : "the file is shorter than the format's magic");
            }
            head += static_cast<char>(get_u8());
        }
        if (head != detail::magic) fail(trace_error::reason::not_a_trace, "the file does not start with \"CUSTODYT\"");
        record_start_ = offset_;
        const std::uint64_t version = get_varint("the version");
        if (version != detail::format_version) {
            fail(trace_error::reason::unsupported_version,
                 "format version " + std::to_string(version) + "; this reader reads version 1");
        }
    }

    /// Reads records until an event (true, into `e`) or the end record (false).
    bool read_record(event& e) {
        for (;;) {
            record_start_ = offset_;
            if (ended_) {
                if (!at_end()) fail(trace_error::reason::malformed, "data after the end record");
                finished_ = true;
                return false;
            }
            if (at_end()) {
                fail(trace_error::reason::truncated, "the data ends before the end record, after " +
                                                         std::to_string(events_) + " events");
            }
            const std::uint8_t tag = get_u8();
            if (tag >= detail::tag_event_base && tag < detail::tag_event_base + event_kind_count) {
                read_event(static_cast<event_kind>(tag - detail::tag_event_base), e);
                return true;
            }
            switch (tag) {
            case detail::tag_metadata: {
                if (events_ != 0) fail(trace_error::reason::malformed, "a metadata record after the first event");
                std::string key = get_string("metadata key");
                std::string value = get_string("metadata value");
                header_.metadata.emplace_back(std::move(key), std::move(value));
                break;
            }
            case detail::tag_thread: {
                thread_info t;
                const std::uint64_t index = get_varint("thread index");
                if (index != header_.threads.size() + 1) {
                    fail(trace_error::reason::malformed, "thread " + std::to_string(index) + " declared where " +
                                                             std::to_string(header_.threads.size() + 1) +
                                                             " comes next");
                }
                t.index = static_cast<std::uint32_t>(index);
                t.os_id = get_varint("thread id");
                t.name = get_string("thread name");
                header_.threads.push_back(std::move(t));
                break;
            }
            case detail::tag_owner: {
                const std::uint64_t index = get_varint("owner index");
                if (index != header_.owners.size() + 1) {
                    fail(trace_error::reason::malformed, "owner " + std::to_string(index) + " declared where " +
                                                             std::to_string(header_.owners.size() + 1) +
                                                             " comes next");
                }
                header_.owners.push_back(get_string("owner name"));
                break;
            }
            case detail::tag_end: {
                const std::uint64_t count = get_varint("event count");
                if (count != events_) {
                    fail(trace_error::reason::malformed, "the end record counts " + std::to_string(count) +
                                                             " events; the trace holds " + std::to_string(events_));
                }
                ended_ = true;
                break;
            }
            default: {
                static constexpr char hex[] = "0123456789abcdef";
                fail(trace_error::reason::malformed,
                     std::string("unknown record tag 0x") + hex[tag >> 4] + hex[tag & 0xF]);
            }
            }
        }
    }

    void read_event(event_kind kind, event& e) {
        in_event_ = true;
        const std::uint8_t p = get_u8();
        if ((p & ~detail::known_presence) != 0) fail(trace_error::reason::malformed, "unknown field bits in an event");
        e = event{};
        e.kind = kind;
        e.sequence = events_ + 1;
        e.time_ns = static_cast<std::int64_t>(static_cast<std::uint64_t>(state_.time_ns) +
                                              static_cast<std::uint64_t>(detail::unzigzag(get_varint("time"))));
        e.thread = state_.thread;
        if ((p & detail::has_thread) != 0) {
            const std::uint64_t t = get_varint("thread");
            if (t > header_.threads.size()) {
                fail(trace_error::reason::malformed, "the event names thread " + std::to_string(t) +
                                                         ", which is not declared");
            }
            e.thread = static_cast<std::uint32_t>(t);
        }
        e.stream = (p & detail::has_stream) != 0 ? get_varint("stream") : state_.stream;
        e.device = state_.device;
        if ((p & detail::has_device) != 0) {
            const std::int64_t d = detail::unzigzag(get_varint("device"));
            if (d < -1 || d > INT32_MAX) fail(trace_error::reason::malformed, "device " + std::to_string(d) + " is out of range");
            e.device = static_cast<std::int32_t>(d);
        }
        e.bytes = get_varint("bytes");
        if ((p & detail::has_alignment) != 0) {
            const unsigned log2 = get_u8();
            if (log2 > detail::max_alignment_log2) {
                fail(trace_error::reason::malformed, "alignment 2^" + std::to_string(log2) + " is above 2^40");
            }
            e.alignment = std::uint64_t{1} << log2;
        }
        e.address = state_.address + static_cast<std::uint64_t>(detail::unzigzag(get_varint("address")));
        if ((p & detail::has_owner) != 0) {
            const std::uint64_t o = get_varint("owner");
            if (o == 0 || o > header_.owners.size()) {
                fail(trace_error::reason::malformed, "the event names owner " + std::to_string(o) +
                                                         ", which is not declared");
            }
            e.owner = static_cast<std::uint32_t>(o);
        }
        if ((p & detail::has_flags) != 0) {
            e.flags = get_u8();
            if ((e.flags & ~known_flags) != 0) fail(trace_error::reason::malformed, "unknown event flags");
        }
        state_.advance(e);
        ++events_;
        in_event_ = false;
    }

    std::unique_ptr<std::istream> in_;
    std::string name_;
    std::vector<char> buffer_ = std::vector<char>(64 * 1024);
    std::size_t begin_ = 0; // unread bytes: buffer_[begin_, end_)
    std::size_t end_ = 0;
    bool eof_ = false;
    std::uint64_t offset_ = 0;       // bytes consumed
    std::uint64_t record_start_ = 0; // offset of the record being read
    trace_header header_;
    detail::event_state state_;
    std::uint64_t events_ = 0; // events decoded, including pending_
    bool in_event_ = false;
    bool ended_ = false;
    event pending_;             // the first event, read by the constructor
    bool has_pending_ = false;
    bool finished_ = false;     // the end record and what follows it are checked
};

} // namespace custody::trace
