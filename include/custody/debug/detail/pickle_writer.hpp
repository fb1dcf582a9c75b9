/// @file
/// `pickle_writer`: Python's pickle format (protocol 2), written as a stream of plain values: the
/// dicts, lists, strings, integers, pairs, booleans and None that PyTorch's memory snapshot is made
/// of (debug/pytorch_snapshot.hpp). Nothing that names a Python type is written, so a reader that
/// refuses every class (custody-import's) reads it. An internal of the debug layer.
#pragma once

#include <custody/debug/detail/json_utf8.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace custody::debug::detail {

/// Appends pickle opcodes to a string. A dict is begin_dict(), then key and value alternately,
/// then end_dict(); a list is begin_list(), its items, end_list(). The caller keeps them balanced:
/// begin() once, one value, end() once.
/// Thread safety: none. Complexity: O(1) per value, O(n) per string of n bytes.
class pickle_writer {
public:
    explicit pickle_writer(std::string& out) noexcept : out_(out) {}

    /// The protocol header (PROTO 2).
    void begin() { out_ += "\x80\x02"; }
    /// The end of the pickle (STOP).
    void end() { out_ += '.'; }

    void none() { out_ += 'N'; }
    void boolean(bool v) { out_ += v ? '\x88' : '\x89'; }

    /// An integer: BININT1, BININT (signed 32 bits) or LONG1 (two's complement, little-endian).
    void integer(std::int64_t v) {
        if (v >= 0 && v < 256) {
            out_ += 'K';
            out_ += static_cast<char>(v);
        } else if (v >= INT32_MIN && v <= INT32_MAX) {
            out_ += 'J';
            append_little_endian(static_cast<std::uint64_t>(v), 4);
        } else {
            out_ += '\x8a';
            out_ += '\x08';
            append_little_endian(static_cast<std::uint64_t>(v), 8);
        }
    }
    /// An unsigned integer (an address): LONG1 with a ninth, zero byte when the top bit is set.
    void integer(std::uint64_t v) {
        if (v <= static_cast<std::uint64_t>(INT64_MAX)) {
            integer(static_cast<std::int64_t>(v));
            return;
        }
        out_ += '\x8a';
        out_ += '\x09';
        append_little_endian(v, 8);
        out_ += '\0';
    }

    /// A str (BINUNICODE): `s` as UTF-8, each invalid sequence replaced by U+FFFD.
    void text(std::string_view s) {
        if (!json::is_valid_utf8(s)) {
            text_valid(json::to_valid_utf8(s));
        } else {
            text_valid(s);
        }
    }

    /// A tuple of two integers (TUPLE2).
    void pair(std::int64_t first, std::int64_t second) {
        integer(first);
        integer(second);
        out_ += '\x86';
    }

    void begin_dict() { out_ += "}("; }  // EMPTY_DICT, MARK
    void end_dict() { out_ += 'u'; }     // SETITEMS
    void begin_list() { out_ += "]("; }  // EMPTY_LIST, MARK
    void end_list() { out_ += 'e'; }     // APPENDS

    /// key, then a value of the caller's: the common case of a dict's string key.
    void key(std::string_view k) { text_valid(k); }

private:
    void text_valid(std::string_view s) {
        out_ += 'X';
        append_little_endian(s.size(), 4);
        out_.append(s);
    }
    void append_little_endian(std::uint64_t v, int bytes) {
        for (int i = 0; i < bytes; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xFFU);
    }

    std::string& out_;
};

} // namespace custody::debug::detail
