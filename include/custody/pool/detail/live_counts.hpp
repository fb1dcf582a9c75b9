/// @file
/// `live_counts`: a pool's live bytes and their exact peak across its streams' shards, and the calls
/// the slow path served: what a stream's shard could not keep to itself.
#pragma once

#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/peak_counter.hpp>
#include <custody/pool/detail/request.hpp>

#include <atomic>
#include <cstddef>
#include <mutex>

namespace custody::pool::detail {

/// The pool-wide part of the live counts over shards of type `Shard` (each with `mutex` and
/// `credit`; see peak_counter): the exact peak, the shard that committed to it last, and the counts
/// of the calls served without a shard's own lists.
///
/// Invariants: the pool's live bytes = the shards' credit.live() + slow().live_bytes;
///   peak() >= them whenever no call is in flight (peak_counter).
/// Thread safety: thread-safe. Each `ForEach` argument calls f(Shard&) for every shard of the pool.
template <class Shard>
class live_counts {
public:
    /// Commits `owed` live bytes of the stream of `sh` (its lock held; released here) that its
    /// credit did not cover. Below the peak, one compare-and-swap, with some slack kept as the
    /// stream's credit so that its next allocations need none (a stream that allocates what another
    /// gives back: a request's KV pages after another stream gave the last request's back). Past
    /// the peak, first the credit of the stream that committed last, when its lock is free (streams
    /// taking turns in one thread give back on one what the next allocates), then a pass over the
    /// streams.
    template <class ForEach>
    [[gnu::noinline]] void commit_and_unlock(Shard& sh, std::size_t owed, ForEach&& each) noexcept {
        Shard* last = last_committer_.load(std::memory_order_relaxed);
        if (last != &sh) {
            last_committer_.store(&sh, std::memory_order_relaxed);
            // At the peak: the last committer's credit first (never waiting with a shard lock held).
            if (last != nullptr && !peak_.below(owed) && last->mutex.try_lock()) {
                owed -= last->credit.give(owed);
                last->mutex.unlock();
                if (owed == 0) return sh.mutex.unlock();
            }
        }
        if (const auto extra = peak_.try_commit(owed)) {
            sh.credit.grant(*extra);
            return sh.mutex.unlock();
        }
        sh.mutex.unlock();
        commit(owed, each);
    }

    /// Adds live bytes no credit covered to the peak counter. Call with no shard lock held.
    template <class ForEach>
    [[gnu::noinline]] void commit(std::size_t bytes, ForEach&& each) noexcept {
        peak_.commit(bytes, [&](peak_counter::reclaimer& reclaim) {
            each([&](Shard& sh) {
                if (!reclaim.wanted()) return;
                std::lock_guard lock(sh.mutex);
                reclaim.take(sh.credit);
            });
        });
    }

    /// An allocation of `r` the slow path served, for the stream of `sh` (nullptr: none).
    template <class ForEach>
    [[gnu::noinline]] void allocated_slow(Shard* sh, request r, ForEach&& each) noexcept {
        std::size_t owed = r.bytes;
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            owed = sh->charge(r.bytes);
        }
        slow_.allocated(r.size, sh != nullptr ? 0 : r.bytes);
        if (owed != 0) commit(owed, each);
    }
    /// A block given back without a shard (a capturing stream, or one past max_streams).
    [[gnu::noinline]] void deallocated_slow(request r) noexcept {
        slow_.deallocated(r.size, r.bytes);
        peak_.release(r.bytes);
    }

    [[nodiscard]] peak_counter& counter() noexcept { return peak_; }
    [[nodiscard]] std::size_t peak() const noexcept { return peak_.peak(); }
    /// The slow path's allocations and the frees without a shard.
    [[nodiscard]] atomic_counters& slow() noexcept { return slow_; }
    [[nodiscard]] const atomic_counters& slow() const noexcept { return slow_; }

private:
    peak_counter peak_;
    std::atomic<Shard*> last_committer_{nullptr}; ///< a hint: see commit_and_unlock
    atomic_counters slow_;
};

} // namespace custody::pool::detail
