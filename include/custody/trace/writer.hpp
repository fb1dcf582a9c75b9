/// @file
/// `trace::writer`: encodes a trace (metadata, thread and owner tables, events, the end record)
/// into bytes, in the binary format of docs/trace-format.md, a record at a time.
#pragma once

#include <custody/core/align.hpp>
#include <custody/trace/detail/codec.hpp>
#include <custody/trace/event.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace custody::trace {

/// Encodes a trace into an in-memory buffer that the caller empties as it goes (`take()`), so a
/// trace of any length is written with memory bounded by what the caller lets accumulate.
///
/// Order: metadata first (before any event); a thread or owner is declared (thread(), owner())
/// before the first event that names it; finish() last. Sequence numbers are implicit: the n-th
/// event written is event n, whatever `e.sequence` holds.
/// Errors: a call that would produce a trace the reader rejects (metadata after an event, an
/// undeclared thread or owner, an alignment that is not a power of two, an unknown kind or flag,
/// an oversized string, anything after finish()) throws std::invalid_argument and writes nothing.
/// Thread safety: none (one writer per thread). Complexity: O(size of the record) per call.
class writer {
public:
    writer() {
        out_.append(detail::magic);
        detail::put_varint(out_, detail::format_version);
    }

    void metadata(std::string_view key, std::string_view value) {
        check_open();
        if (events_ != 0) throw std::invalid_argument("custody trace: metadata after the first event");
        check_string(key);
        check_string(value);
        detail::put_u8(out_, detail::tag_metadata);
        detail::put_string(out_, key);
        detail::put_string(out_, value);
    }

    /// Declares thread `t.index`, which must be the number of threads declared so far plus one.
    void thread(const thread_info& t) {
        check_open();
        if (t.index != threads_ + 1) {
            throw std::invalid_argument("custody trace: thread " + std::to_string(t.index) + " declared where " +
                                        std::to_string(threads_ + 1) + " comes next");
        }
        check_string(t.name);
        detail::put_u8(out_, detail::tag_thread);
        detail::put_varint(out_, t.index);
        detail::put_varint(out_, t.os_id);
        detail::put_string(out_, t.name);
        ++threads_;
    }

    /// Declares the next owner and returns its index (1, 2, ...).
    std::uint32_t owner(std::string_view name) {
        check_open();
        check_string(name);
        detail::put_u8(out_, detail::tag_owner);
        detail::put_varint(out_, owners_ + 1);
        detail::put_string(out_, name);
        return ++owners_;
    }

    /// Appends `e` as the next event; returns its sequence number.
    std::uint64_t write(const event& e) {
        if (finished_) throw std::invalid_argument("custody trace: record after the end record");
        if (static_cast<unsigned>(e.kind) >= static_cast<unsigned>(event_kind_count)) {
            throw std::invalid_argument("custody trace: unknown event kind " + std::to_string(static_cast<int>(e.kind)));
        }
        if (!is_pow2(e.alignment) || detail::log2_of(e.alignment) > detail::max_alignment_log2) {
            throw std::invalid_argument("custody trace: alignment " + std::to_string(e.alignment) +
                                        " is not a power of two up to 2^40");
        }
        if (e.thread > threads_) {
            throw std::invalid_argument("custody trace: event names thread " + std::to_string(e.thread) +
                                        ", which is not declared");
        }
        if (e.owner > owners_) {
            throw std::invalid_argument("custody trace: event names owner " + std::to_string(e.owner) +
                                        ", which is not declared");
        }
        if ((e.flags & ~known_flags) != 0) throw std::invalid_argument("custody trace: unknown event flags");
        if (staged_ + detail::max_event_record > staging_.size()) unstage();
        staged_ = static_cast<std::size_t>(detail::encode_event(staging_.data() + staged_, e, state_) - staging_.data());
        return ++events_;
    }

    /// Appends the end record. The trace is complete once the bytes so far are written.
    void finish() {
        check_open();
        detail::put_u8(out_, detail::tag_end);
        detail::put_varint(out_, events_);
        finished_ = true;
    }

    /// The bytes encoded since the last take(), handed over.
    [[nodiscard]] std::string take() {
        unstage();
        return std::exchange(out_, std::string());
    }
    /// The bytes encoded since the last take(), in place (for a caller that writes and clears them).
    [[nodiscard]] std::string& buffer() {
        unstage();
        return out_;
    }
    /// How many bytes buffer() would hold, without moving anything.
    [[nodiscard]] std::size_t buffered() const noexcept { return out_.size() + staged_; }

    [[nodiscard]] std::uint64_t events() const noexcept { return events_; }
    [[nodiscard]] std::uint32_t threads() const noexcept { return threads_; }
    [[nodiscard]] std::uint32_t owners() const noexcept { return owners_; }
    [[nodiscard]] bool finished() const noexcept { return finished_; }

private:
    void check_open() {
        if (finished_) throw std::invalid_argument("custody trace: record after the end record");
        unstage(); // records other than events go to out_ directly, after what is staged
    }
    /// Moves the staged event records to out_.
    void unstage() {
        out_.append(staging_.data(), staged_);
        staged_ = 0;
    }
    static void check_string(std::string_view s) {
        if (s.size() > detail::max_string) {
            throw std::invalid_argument("custody trace: a string of " + std::to_string(s.size()) +
                                        " bytes is over the format's limit of 1 MiB");
        }
    }

    std::string out_;
    /// Event records are encoded here and appended to out_ a few kilobytes at a time: one append
    /// per event would cost more than the encoding.
    std::array<char, 4096> staging_{};
    std::size_t staged_ = 0; // staged_ <= staging_.size()
    detail::event_state state_;
    std::uint64_t events_ = 0;  // events_ = sequence number of the last event written
    std::uint32_t threads_ = 0; // threads declared, indices 1..threads_
    std::uint32_t owners_ = 0;  // owners declared, indices 1..owners_
    bool finished_ = false;
};

} // namespace custody::trace
