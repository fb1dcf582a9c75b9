/// @file
/// `block_guards`: the tracking resource's guards: canary bytes around each block, checked when
/// the block is freed (at once, or once the freeing stream gets there), and poison written over
/// freed memory. Every byte goes through the platform's asynchronous copies, so device memory is
/// guarded as host memory is.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/tracking_options.hpp>
#include <custody/platform/platform.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace custody::debug::detail {

/// Where the user block sits in the upstream block: [front guard][user bytes][back guard].
/// Invariants (when valid): total = front + bytes + back; front % alignment == 0, so the user
/// pointer outer + front keeps the requested alignment.
struct guard_layout {
    std::size_t front = 0;
    std::size_t back = 0;
    std::size_t total = 0;
    bool valid = true; ///< false: bytes plus the guards overflow
};

/// An overwritten guard: after the block (overflow) or before it (underflow), and the damaged byte
/// nearest the block, counted from the block's edge (0: the byte right after or right before it).
struct guard_damage {
    violation_kind kind = violation_kind::buffer_overflow;
    std::size_t byte = 0;

    /// "guard byte 3 after the block (offset 131) was overwritten", for a block of `block_bytes`.
    [[nodiscard]] std::string describe(std::size_t block_bytes) const {
        if (kind == violation_kind::buffer_overflow) {
            return "guard byte " + std::to_string(byte) + " after the block (offset " +
                   std::to_string(block_bytes + byte) + ") was overwritten";
        }
        return "guard byte " + std::to_string(byte + 1) + " before the block was overwritten";
    }
};

/// The canaries and the poison of one tracker, over `Platform`. `Block` is the tracker's record of a
/// block (trivially copyable, with `bytes`), kept with a check that waits on a stream so that what
/// it finds can name the block.
///
/// Canaries: guard_bytes of canary_byte on each side, written on the allocating stream. At free,
/// both guards are read back on the freeing stream before the poison and the upstream free. On the
/// default stream (and for a synchronous free) they are compared at once; on another stream an event
/// is recorded after the read-back and the comparison runs once it is ready (drain), so a free never
/// waits for its stream. Poison: poison_byte over the whole upstream block, on the freeing stream.
/// Thread safety: thread-safe; the pending checks have their own mutex (never held while calling
/// back). Complexity: O(guard_bytes) per block, O(pending checks) per drain.
template <class Platform, class Block>
class block_guards {
public:
    using stream_type = typename Platform::stream_view;

    /// Throws std::invalid_argument for guard_bytes outside 1..max_guard_bytes with canaries on.
    explicit block_guards(const tracking_options& o)
        : canaries_(o.canaries), poison_(o.poison), canary_byte_(o.canary_byte), poison_byte_(o.poison_byte),
          guard_bytes_(o.guard_bytes) {
        if (canaries_ && (guard_bytes_ == 0 || guard_bytes_ > max_guard_bytes)) {
            throw std::invalid_argument("custody: guard_bytes must be within 1..256");
        }
        pattern_.fill(canary_byte_);
    }

    block_guards(const block_guards&) = delete;
    block_guards& operator=(const block_guards&) = delete;

    [[nodiscard]] bool canaries() const noexcept { return canaries_; }

    /// The bytes a free reads back of the block at `inner` (of `bytes`): the guard before it and
    /// the guard after it; none without canaries. What an upstream that discards contents is asked
    /// to keep (core/discarding.hpp).
    struct checked_span {
        const void* ptr;
        std::size_t bytes;
    };
    [[nodiscard]] std::array<checked_span, 2> checked_spans(const void* inner, std::size_t bytes) const noexcept {
        const auto* b = static_cast<const unsigned char*>(inner);
        const std::size_t g = canaries_ ? guard_bytes_ : 0;
        return {checked_span{b - g, g}, checked_span{b + bytes, g}};
    }

    [[nodiscard]] guard_layout layout_for(std::size_t bytes, std::size_t alignment) const noexcept {
        guard_layout l;
        if (canaries_) {
            l.front = align_up(guard_bytes_, alignment);
            l.back = guard_bytes_;
        }
        if (bytes > SIZE_MAX - l.front - l.back) {
            l.valid = false;
            return l;
        }
        l.total = l.front + bytes + l.back;
        return l;
    }

    /// Writes both guards of a new block on `s` (and waits for them when `synchronous`). Throws
    /// what the platform throws.
    void write(void* outer, const guard_layout& l, std::size_t bytes, stream_type s, bool synchronous) const {
        if (!canaries_) return;
        auto* inner = static_cast<unsigned char*>(outer) + l.front;
        Platform::memset_async(outer, canary_byte_, l.front, s);
        Platform::memset_async(inner + bytes, canary_byte_, l.back, s);
        if (synchronous) Platform::synchronize(s);
    }

    /// Reads both guards of `inner` (of `bytes`) back on `s`, waits, compares. A failed read-back
    /// finds nothing (and is reported, see run_exit_tolerant).
    [[nodiscard]] std::optional<guard_damage> check_now(const void* inner, std::size_t bytes, stream_type s) noexcept {
        std::array<unsigned char, 2 * max_guard_bytes> seen; // filled by the copies below
        if (!run_exit_tolerant<Platform>("custody: reading a block's guards back", [&] {
                read_back(seen.data(), inner, bytes, s);
                Platform::synchronize(s);
            })) {
            return std::nullopt;
        }
        return compare(seen.data());
    }

    /// Enqueues the read-back of `block`'s guards on `s` and keeps the check until drain() finds it
    /// done; `freed_site()` names the free for the report. A check that cannot be enqueued (no
    /// memory, a platform failure) is reported (see run_exit_tolerant), and the block goes unchecked.
    template <class FreedSite>
    void check_later(const Block& block, const void* inner, stream_type s, const FreedSite& freed_site) noexcept {
        std::optional<pending_check> c; // outlives the steps below: the copies may still be pending
        if (!run_exit_tolerant<Platform>("custody: making a guard check", [&] {
                c.emplace(pending_check{block, inner, std::make_unique<unsigned char[]>(2 * guard_bytes_),
                                        typename Platform::event(Platform::stream_device(s)), freed_site()});
            })) {
            return;
        }
        const bool kept = run_exit_tolerant<Platform>("custody: enqueueing a guard check", [&] {
            read_back(c->seen.get(), inner, block.bytes, s);
            c->done.record(s);
            std::lock_guard lock(mutex_);
            pending_.push_back(std::move(*c)); // strong guarantee: *c intact if it throws
            pending_count_.fetch_add(1, std::memory_order_relaxed);
        });
        if (!kept) { // a copy may be enqueued into c's buffer: wait for the stream before it goes
            run_exit_tolerant<Platform>("custody: waiting for a dropped guard check", [&] { Platform::synchronize(s); });
        }
    }

    /// Whether checks are waiting on streams (a relaxed read: a hint for the fast path).
    [[nodiscard]] bool has_pending() const noexcept { return pending_count_.load(std::memory_order_relaxed) != 0; }

    /// Finishes the checks whose read-back has completed (all of them, waiting, when `wait`) and
    /// calls on_damage(block, damage, freed site) for each overwritten guard found. Allocates
    /// nothing; a wait that fails drops its check (reported, see run_exit_tolerant). `on_damage`
    /// must not throw.
    template <class OnDamage>
    void drain(bool wait, OnDamage&& on_damage) noexcept {
        std::list<pending_check> done;
        {
            std::lock_guard lock(mutex_);
            for (auto it = pending_.begin(); it != pending_.end();) {
                const auto next = std::next(it);
                if (wait || ready(*it)) done.splice(done.end(), pending_, it);
                it = next;
            }
            pending_count_.fetch_sub(done.size(), std::memory_order_relaxed);
        }
        for (pending_check& c : done) {
            if (!run_exit_tolerant<Platform>("custody: waiting for a guard check", [&] { c.done.synchronize(); })) continue;
            if (auto damage = compare(c.seen.get())) on_damage(c.block, *damage, c.freed);
        }
    }

    /// Fills the freed upstream block with poison_byte on `s` (and waits when `synchronous`). A
    /// failure is reported (see run_exit_tolerant).
    void poison(void* outer, std::size_t total, stream_type s, bool synchronous) const noexcept {
        if (!poison_) return;
        run_exit_tolerant<Platform>("custody: poisoning a freed block", [&] {
            Platform::memset_async(outer, poison_byte_, total, s);
            if (synchronous) Platform::synchronize(s);
        });
    }

private:
    /// A guard read-back enqueued on a stream. Invariant: `seen` holds 2 * guard_bytes once `done`
    /// is ready (front guard, then back guard).
    struct pending_check {
        Block block;
        const void* inner = nullptr;
        std::unique_ptr<unsigned char[]> seen;
        typename Platform::event done;
        allocation_site freed;
    };

    /// Whether the read-back of `c` has completed; a failed query counts as done (drain's wait then
    /// reports it).
    [[nodiscard]] static bool ready(const pending_check& c) noexcept {
        try {
            return c.done.ready();
        } catch (...) {
            return true;
        }
    }

    void read_back(unsigned char* seen, const void* inner, std::size_t bytes, stream_type s) const {
        const auto* b = static_cast<const unsigned char*>(inner);
        Platform::memcpy_async(seen, b - guard_bytes_, guard_bytes_, s);
        Platform::memcpy_async(seen + guard_bytes_, b + bytes, guard_bytes_, s);
    }

    /// The damage `seen` (front guard, then back guard) shows, if any.
    [[nodiscard]] std::optional<guard_damage> compare(const unsigned char* seen) const noexcept {
        const std::size_t g = guard_bytes_;
        if (std::memcmp(seen, pattern_.data(), 2 * g) == 0) return std::nullopt; // the common case
        for (std::size_t i = 0; i < g; ++i) // the byte nearest the block first
            if (seen[g + i] != canary_byte_) return guard_damage{violation_kind::buffer_overflow, i};
        for (std::size_t i = 0; i < g; ++i)
            if (seen[g - 1 - i] != canary_byte_) return guard_damage{violation_kind::buffer_underflow, i};
        return std::nullopt;
    }

    bool canaries_;
    bool poison_;
    unsigned char canary_byte_;
    unsigned char poison_byte_;
    std::size_t guard_bytes_;                              // 1..max_guard_bytes when canaries_
    std::array<unsigned char, 2 * max_guard_bytes> pattern_; // both guards as written

    custody::detail::mutex mutex_; // guards pending_
    std::list<pending_check> pending_; // a list: drain() takes checks out without allocating
    std::atomic<std::size_t> pending_count_{0}; // == pending_.size()
};

} // namespace custody::debug::detail
