/// @file
/// The byte-level pieces of the trace format (docs/trace-format.md), shared by the writer and the
/// reader: the magic, the record tags, LEB128 varints, zigzag for signed values, and the state that
/// event records are encoded against.
#pragma once

#include <custody/trace/event.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace custody::trace::detail {

/// The first 8 bytes of every trace file.
inline constexpr std::string_view magic = "CUSTODYT";
/// The format version this code writes and reads.
inline constexpr std::uint64_t format_version = 1;

/// Record tags. An event's tag is event_base + its kind.
enum record_tag : std::uint8_t {
    tag_metadata = 0x01,
    tag_thread = 0x02,
    tag_owner = 0x03,
    tag_event_base = 0x10,
    tag_end = 0x7F,
};

/// Which optional fields an event record carries (its second byte). A field that is absent keeps
/// the previous event's value (thread, stream, device) or its default (alignment 256, owner 0,
/// flags 0).
enum presence : std::uint8_t {
    has_thread = 0x01,
    has_stream = 0x02,
    has_device = 0x04,
    has_alignment = 0x08,
    has_owner = 0x10,
    has_flags = 0x20,
};
inline constexpr std::uint8_t known_presence = 0x3F;

inline constexpr std::uint64_t default_alignment = 256;
/// The longest string (a metadata value, an owner or thread name) a trace may hold.
inline constexpr std::uint64_t max_string = std::uint64_t{1} << 20;
/// The largest alignment an event may carry: 2^40.
inline constexpr unsigned max_alignment_log2 = 40;
/// The longest varint: ten bytes hold 64 bits.
inline constexpr int max_varint_bytes = 10;

[[nodiscard]] constexpr std::uint64_t zigzag(std::int64_t v) noexcept {
    return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}
[[nodiscard]] constexpr std::int64_t unzigzag(std::uint64_t v) noexcept {
    return static_cast<std::int64_t>(v >> 1) ^ -static_cast<std::int64_t>(v & 1);
}

inline void put_u8(std::string& out, std::uint8_t v) { out += static_cast<char>(v); }

inline void put_varint(std::string& out, std::uint64_t v) {
    char buffer[max_varint_bytes];
    char* end = buffer;
    while (v >= 0x80) {
        *end++ = static_cast<char>(static_cast<std::uint8_t>(v) | 0x80);
        v >>= 7;
    }
    *end++ = static_cast<char>(v);
    out.append(buffer, static_cast<std::size_t>(end - buffer));
}

inline void put_svarint(std::string& out, std::int64_t v) { put_varint(out, zigzag(v)); }

inline void put_string(std::string& out, std::string_view s) {
    put_varint(out, s.size());
    out.append(s);
}

/// What an event record is encoded against: the previous event's fields (all zero before the
/// first). Deltas are taken modulo 2^64, so any pair of values round-trips.
struct event_state {
    std::int64_t time_ns = 0;
    std::uint32_t thread = 0;
    std::uint64_t stream = 0;
    std::int32_t device = 0;
    std::uint64_t address = 0;

    void advance(const event& e) noexcept {
        time_ns = e.time_ns;
        thread = e.thread;
        stream = e.stream;
        device = e.device;
        address = e.address;
    }
};

/// log2 of a power of two.
[[nodiscard]] constexpr unsigned log2_of(std::uint64_t pow2) noexcept {
    return pow2 == 0 ? 0U : static_cast<unsigned>(std::countr_zero(pow2));
}

/// The longest event record: tag, presence, six varints of at most ten bytes, the alignment and
/// flags bytes, and the owner's varint (at most five).
inline constexpr std::size_t max_event_record = 2 + 6 * max_varint_bytes + 2 + 5;

/// Writes the varint of `v` at `p`; returns the end.
inline char* write_varint(char* p, std::uint64_t v) noexcept {
    while (v >= 0x80) {
        *p++ = static_cast<char>(static_cast<std::uint8_t>(v) | 0x80);
        v >>= 7;
    }
    *p++ = static_cast<char>(v);
    return p;
}

/// Writes the record of `e` (its sequence is implicit) at `at`, encoded against `state`, advances
/// the state and returns the end. `at` must have room for max_event_record bytes.
inline char* encode_event(char* at, const event& e, event_state& state) noexcept {
    std::uint8_t p = 0;
    if (e.thread != state.thread) p |= has_thread;
    if (e.stream != state.stream) p |= has_stream;
    if (e.device != state.device) p |= has_device;
    if (e.alignment != default_alignment) p |= has_alignment;
    if (e.owner != 0) p |= has_owner;
    if (e.flags != 0) p |= has_flags;
    *at++ = static_cast<char>(tag_event_base + static_cast<std::uint8_t>(e.kind));
    *at++ = static_cast<char>(p);
    at = write_varint(at, zigzag(static_cast<std::int64_t>(static_cast<std::uint64_t>(e.time_ns) -
                                                          static_cast<std::uint64_t>(state.time_ns))));
    if ((p & has_thread) != 0) at = write_varint(at, e.thread);
    if ((p & has_stream) != 0) at = write_varint(at, e.stream);
    if ((p & has_device) != 0) at = write_varint(at, zigzag(e.device));
    at = write_varint(at, e.bytes);
    if ((p & has_alignment) != 0) *at++ = static_cast<char>(log2_of(e.alignment));
    at = write_varint(at, zigzag(static_cast<std::int64_t>(e.address - state.address)));
    if ((p & has_owner) != 0) at = write_varint(at, e.owner);
    if ((p & has_flags) != 0) *at++ = static_cast<char>(e.flags);
    state.advance(e);
    return at;
}

} // namespace custody::trace::detail
