/// @file
/// `peak_counter` and `peak_credit`: the pool's exact peak of live bytes, kept without a pool-wide
/// write on the common path.
#pragma once

#include <custody/core/detail/atomic_peak.hpp>
#include <custody/pool/detail/spin_mutex.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

namespace custody::pool::detail {

/// One stream's live bytes and its credit: the bytes given back on it that stay counted in the
/// pool's committed total (see peak_counter). Kept as the credit and what the peak counter counts
/// for the stream (held), so that a free is one addition and an allocation one subtraction and a
/// sign test.
///
/// Invariant: credit_ < 2^63 between calls (try_spend wraps it only until overdrawn); the stream's live bytes are held_ - credit_ (negative
/// when the stream gave back more than it allocated: blocks of other streams).
/// Thread safety: none; the stream's shard lock guards it.
class peak_credit {
public:
    /// Adds `bytes` of a new allocation on this stream to its live bytes, covered by the credit as
    /// far as it goes; returns what the credit did not cover (bytes to commit).
    [[nodiscard]] std::size_t charge(std::size_t bytes) noexcept {
        if (try_spend(bytes)) [[likely]] return 0;
        return overdrawn(bytes);
    }
    /// The common path's charge: spends `bytes` of credit, one subtraction; false when the credit
    /// did not cover them, and then overdrawn(bytes) must follow under the same lock.
    [[nodiscard, gnu::always_inline]] bool try_spend(std::size_t bytes) noexcept {
        return !__builtin_sub_overflow(credit_, bytes, &credit_);
    }
    /// After try_spend(bytes) failed: the bytes the credit did not cover (to commit), now counted
    /// live; the credit is then 0.
    [[nodiscard]] std::size_t overdrawn(std::size_t bytes) noexcept {
        const std::size_t owed = bytes - (credit_ + bytes); // the credit before the subtraction wrapped
        held_ += static_cast<std::int64_t>(owed);
        credit_ = 0;
        return owed;
    }
    /// `bytes` given back on this stream: they leave its live bytes and stay as credit.
    [[gnu::always_inline]] void add(std::size_t bytes) noexcept { credit_ += bytes; }
    /// `bytes` newly committed for this stream beyond its live bytes (peak_counter::try_commit's
    /// slack): credit for its next allocations.
    void grant(std::size_t bytes) noexcept {
        credit_ += bytes;
        held_ += static_cast<std::int64_t>(bytes);
    }
    /// Gives up to `want` bytes of credit to another stream, whose live bytes they then cover (the
    /// committed total is unchanged); returns how many.
    [[nodiscard]] std::size_t give(std::size_t want) noexcept {
        const std::size_t given = std::min<std::size_t>(want, credit_);
        credit_ -= given;
        held_ -= static_cast<std::int64_t>(given);
        return given;
    }
    /// Takes the whole credit back (the peak counter then uncounts it).
    [[nodiscard]] std::size_t take_all() noexcept {
        const std::size_t b = bytes();
        held_ -= static_cast<std::int64_t>(credit_);
        credit_ = 0;
        return b;
    }
    /// The credit.
    [[nodiscard]] std::size_t bytes() const noexcept { return static_cast<std::size_t>(credit_); }
    /// The stream's live bytes (requested bytes allocated on it minus those given back on it).
    [[nodiscard]] std::int64_t live() const noexcept { return held_ - static_cast<std::int64_t>(credit_); }

private:
    std::uint64_t credit_ = 0; ///< unsigned: the common path's charge is one subtraction and its borrow
    std::int64_t held_ = 0;
};

/// Live bytes and their exact peak.
///
/// Each stream counts its own live bytes and holds a credit: bytes given back on it that stay
/// counted in committed_. An allocation that its stream's credit covers cannot make a new peak: it
/// only moves bytes from credit to live, under the lock the stream already holds. One that is not
/// covered adds the rest to committed_ (commit), and while the sum stays at or below the peak
/// nothing else is needed. Only above the peak are the other streams' credits taken back (each
/// under its lock), which makes committed_ the live bytes exactly, and the peak is raised to it.
/// In a steady state (a decode loop) live memory stays below the peak reached in the first steps,
/// so threads on different streams share no cache line; as the pool warms up, each new peak costs
/// a pass over the streams.
///
/// Invariants (live: the pool's live bytes, summed over the streams and the calls without one):
///   committed_ = live + sum of the streams' credits
///   committed_ <= peak_ whenever no commit is in flight; peak_ only grows
/// Thread safety: thread-safe. mutex_ is taken before any stream's lock, never while one is held.
class peak_counter {
public:
    /// What commit() hands to the caller's pass over the streams: take() a stream's credit back
    /// while wanted().
    class reclaimer {
    public:
        /// The committed bytes are still above the peak: another credit must be taken back.
        [[nodiscard]] bool wanted() const noexcept { return now_ > counter_.peak(); }
        /// Takes `credit` back (the stream's lock held).
        void take(peak_credit& credit) noexcept {
            const std::size_t taken = credit.take_all();
            now_ = counter_.committed_.fetch_sub(taken, std::memory_order_relaxed) - taken;
        }

    private:
        friend class peak_counter;
        reclaimer(peak_counter& counter, std::size_t now) noexcept : counter_(counter), now_(now) {}
        peak_counter& counter_;
        std::size_t now_;
    };

    /// Adds `bytes` live bytes that no credit covered, and up to `slack_share` of the headroom below
    /// the peak more (at least `bytes`) for the caller to keep as credit, while that stays at or
    /// below the peak: one compare-and-swap, no lock. Returns the slack added, or nothing (nothing
    /// added) past the peak (then commit). May be called with the caller's stream lock held: its
    /// credit must take the slack before any pass can visit it (a pass runs only while committed_
    /// is above the peak, when this refuses).
    [[nodiscard, gnu::always_inline]] std::optional<std::size_t> try_commit(std::size_t bytes) noexcept {
        std::size_t seen = committed_.load(std::memory_order_relaxed);
        const std::size_t peak = this->peak();
        while (seen <= peak && bytes <= peak - seen) {
            const std::size_t extra = std::min(std::max(bytes, peak / 64), peak - seen - bytes);
            if (committed_.compare_exchange_weak(seen, seen + bytes + extra, std::memory_order_relaxed)) return extra;
        }
        return std::nullopt;
    }

    /// Whether `bytes` more committed bytes stay at or below the peak now (a hint: try_commit decides).
    [[nodiscard]] bool below(std::size_t bytes) const noexcept {
        const std::size_t seen = committed_.load(std::memory_order_relaxed);
        return seen <= peak() && bytes <= peak() - seen;
    }

    /// Adds live bytes that no credit covered, raising the peak exactly when they make one. Past the
    /// peak, calls `for_each_credit(reclaimer&)`, which visits the streams (each under its lock)
    /// while the reclaimer wants more. Call with no stream's lock held.
    template <class ForEachCredit>
    void commit(std::size_t bytes, ForEachCredit&& for_each_credit) noexcept {
        std::size_t seen = committed_.load(std::memory_order_relaxed);
        while (seen + bytes <= peak()) {
            if (committed_.compare_exchange_weak(seen, seen + bytes, std::memory_order_relaxed)) return;
        }
        std::lock_guard lock(mutex_);
        reclaimer r(*this, committed_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
        for_each_credit(r);
        custody::detail::raise_peak(peak_, r.now_);
    }

    /// Uncounts `bytes` given back without a stream's credit to keep them.
    void release(std::size_t bytes) noexcept { committed_.fetch_sub(bytes, std::memory_order_relaxed); }

    [[nodiscard]] std::size_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }

private:
    alignas(64) std::atomic<std::size_t> committed_{0};
    std::atomic<std::size_t> peak_{0};
    spin_mutex mutex_; ///< serializes raising the peak
};

} // namespace custody::pool::detail
