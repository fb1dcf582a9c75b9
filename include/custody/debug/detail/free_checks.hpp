/// @file
/// The classification of a free: the free as it was asked for (`free_call`), what the ledger makes
/// of it (`free_verdict`, `free_outcome`), the checks a free of a live block must pass (size,
/// alignment, device, stream ordering) and what a failed one says.
#pragma once

#include <custody/core/detail/format.hpp>
#include <custody/debug/detail/ledger.hpp>
#include <custody/debug/report.hpp>

#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <string>

namespace custody::debug::detail {

/// A free as it was asked for; `site` is the free's side of a report (numbered under the lock).
template <class Stream>
struct free_call {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    std::size_t alignment = 0;
    Stream stream{}; ///< the default stream for a synchronous free
    site_record site;
    bool device_known = true; ///< false: the platform could not tell site.device (-1 then)
};

/// What the tracker's state makes of a free: good (the block was taken out of the ledger), a misuse of a
/// live block (a check of misuse_of failed), a block it remembers as freed already, or a pointer it
/// does not know (a foreign, interior or unknown pointer: told apart by the tracker).
enum class free_verdict { good, misuse, freed_before, unknown };

/// What classify() hands back besides the verdict: for a good free, what the upstream needs back;
/// for a misuse, the check that failed; and, when asked for, a copy of the block's record, in raw
/// storage so that a free that needs none zero-fills nothing (std::optional would, on every call).
template <class Record>
struct free_outcome {
    void* outer;
    std::size_t total;
    std::size_t alignment;
    violation_kind misuse;
    const Record* block = nullptr; ///< the copy, or nullptr
    alignas(Record) unsigned char storage[sizeof(Record)];

    void keep(const Record& r) noexcept { block = ::new (static_cast<void*>(storage)) Record(r); }
};

/// Which check a free `call` of the live block `r` fails, if any, in this order: size, alignment,
/// device (when `check_device` and the free's device is known), stream ordering (when `check_streams`; a synchronous free counts
/// as ordered after everything).
template <class Stream>
[[nodiscard]] std::optional<violation_kind> misuse_of(const block_record<Stream>& r, const free_call<Stream>& call,
                                                      bool check_device, bool check_streams) noexcept {
    if (r.bytes != call.bytes) return violation_kind::wrong_size;
    if (r.alignment != call.alignment) return violation_kind::wrong_alignment;
    if (check_device && call.device_known && call.site.device != r.allocated.device) return violation_kind::wrong_device;
    if (check_streams && !call.site.synchronous && r.uses.unordered_before(call.stream, call.site.stream) != nullptr) {
        return violation_kind::stream_hazard;
    }
    return std::nullopt;
}

/// What exactly differed, for the `kind` misuse_of found ("freed with 64 B, allocated with 128 B").
template <class Platform, class Stream>
[[nodiscard]] std::string misuse_detail(violation_kind kind, const block_record<Stream>& r, const free_call<Stream>& call) {
    const auto stream_name = [](Stream s) {
        return custody::detail::to_hex(reinterpret_cast<const void*>(Platform::stream_key(s)));
    };
    switch (kind) {
    case violation_kind::wrong_size:
        return "freed with " + std::to_string(call.bytes) + " B, allocated with " + std::to_string(r.bytes) + " B";
    case violation_kind::wrong_alignment:
        return "freed with alignment " + std::to_string(call.alignment) + ", allocated with " +
               std::to_string(r.alignment);
    case violation_kind::wrong_device:
        return "freed on device " + std::to_string(call.site.device) + ", allocated on device " +
               std::to_string(r.allocated.device);
    default:
        return "freed on stream " + stream_name(call.stream) + " with no ordering after its use on stream " +
               stream_name(*r.uses.unordered_before(call.stream, call.site.stream));
    }
}

} // namespace custody::debug::detail
