/// @file
/// `trace::event`: one allocation event of a trace (what the recorder writes, the importers produce
/// and the replayer reads), and the tables a trace carries beside its events.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace custody::trace {

/// What an event says happened.
enum class event_kind : std::uint8_t {
    allocate = 0,           ///< `bytes` at `address` handed out on `stream`
    deallocate = 1,         ///< the block at `address` (`bytes`, `alignment` as allocated) given back on `stream`
    allocation_failure = 2, ///< a request of `bytes` the resource could not satisfy (address 0)
    reference_reserve = 3,  ///< a reference allocator (PyTorch's, in an imported snapshot) took `bytes` from the device
    reference_release = 4,  ///< ... and gave `bytes` back to the device
};
inline constexpr int event_kind_count = 5;

/// The name of a kind, as the CSV export writes it ("allocate", ...).
[[nodiscard]] constexpr std::string_view to_string(event_kind k) noexcept {
    constexpr std::string_view names[] = {"allocate", "deallocate", "allocation_failure", "reference_reserve",
                                          "reference_release"};
    return names[static_cast<unsigned>(k) < event_kind_count ? static_cast<unsigned>(k) : 0];
}

/// Event flags (a bit set).
enum event_flags : std::uint8_t {
    /// An allocation that happened before recording began, added by an importer at the start of the
    /// trace because the trace frees it or the snapshot shows it live; or, on a reference_reserve,
    /// what the reference allocator held when recording began.
    flag_pre_trace = 1,
};
inline constexpr std::uint8_t known_flags = flag_pre_trace;

/// One event. A plain value.
///
/// Invariants in a trace: sequence = 1, 2, 3, ... in file order; time_ns is nanoseconds since the
/// trace's start (metadata `started_unix_ns` gives the wall clock of 0) and may step back by a
/// little between threads; thread = 0 (unknown) or a declared thread index; owner = 0 (none) or a
/// declared owner index; alignment is a power of two.
struct event {
    std::uint64_t sequence = 0;
    std::int64_t time_ns = 0;
    event_kind kind = event_kind::allocate;
    std::uint8_t flags = 0;
    std::uint32_t thread = 0;
    std::uint64_t stream = 0; ///< the platform's stream key; 0 is the default stream
    std::int32_t device = 0;  ///< -1 for memory that belongs to no device
    std::uint64_t bytes = 0;
    std::uint64_t alignment = 256;
    std::uint64_t address = 0;
    std::uint32_t owner = 0;

    friend bool operator==(const event&, const event&) = default;
};

/// A thread that recorded events: its index in the trace (1, 2, ...), the operating system's id
/// for it and a name (may be empty).
struct thread_info {
    std::uint32_t index = 0;
    std::uint64_t os_id = 0;
    std::string name;
    friend bool operator==(const thread_info&, const thread_info&) = default;
};

/// What a trace says about itself: ordered key/value pairs (docs/trace-format.md lists the keys
/// custody writes; readers keep unknown keys), and the thread and owner tables its events refer to.
struct trace_header {
    std::vector<std::pair<std::string, std::string>> metadata;
    std::vector<thread_info> threads; ///< threads[i].index == i + 1
    std::vector<std::string> owners;  ///< owner index i + 1 is owners[i]

    /// The value of `key`, or `fallback` when the trace does not say.
    [[nodiscard]] std::string get(std::string_view key, std::string_view fallback = {}) const {
        for (const auto& [k, v] : metadata)
            if (k == key) return v;
        return std::string(fallback);
    }
    friend bool operator==(const trace_header&, const trace_header&) = default;
};

} // namespace custody::trace
