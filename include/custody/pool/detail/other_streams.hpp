/// @file
/// `other_streams`: how a stream's miss reaches other streams' free memory, as the reuse policy
/// allows: a batch of their covered blocks of its size class onto its hot stack, their covered
/// blocks moved to the shared set once idle, adopted behind a stream wait, or taken after a host
/// wait (the bound); their working sets; their idle granules unmapped; the device-wide reclaim.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/pool/detail/covering.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/shared_store.hpp>
#include <custody/pool/detail/stream_caches.hpp>
#include <custody/pool/pool_options.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

namespace custody::pool::detail {

/// Other streams' caches, seen from a stream's miss in a pool over `Upstream` (the seam's; see
/// seam.hpp for the order in which a miss tries them).
///
/// Stream semantics: a block leaves its stream only covered (covering.hpp) and once its event has
/// completed, behind a stream wait on the event (follow_dependencies), or after a host wait on it
/// (the bound, the reclaim); blocks not yet covered leave only after the device is synchronized
/// (reclaim). Working sets: a stream that gives back what it allocates keeps up to
/// stream_working_set of its cache, working_set_total over all such streams, from the others while
/// the pool may grow.
/// Thread safety: thread-safe: the shards' locks one at a time, then the store's, never two at once.
/// Ownership: refers to the pool's front, covering, back end and counters, which outlive it.
template <stream_ordered_resource Upstream>
class other_streams {
public:
    using caches_type = stream_caches<Upstream>;
    using covering_type = covering<Upstream>;
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using shard = typename caches_type::shard;

    other_streams(const pool_options& options, caches_type& front, covering_type& covering, shared_store<Upstream>& store,
                  activity_counters& activity)
        : policy_(options.reuse), working_set_(options.stream_working_set), working_set_total_(options.working_set_total),
          front_(front), cover_(covering), store_(store), activity_(activity) {}
    other_streams(const other_streams&) = delete;
    other_streams& operator=(const other_streams&) = delete;

    [[nodiscard]] reuse_policy policy() const noexcept { return policy_; }

    /// Other streams' covered blocks of the request's size class (a consumer's blocks, given back
    /// to the stream that allocates them), moved in a batch onto this stream's hot stack in O(1)
    /// each: those whose event has completed (unless same_stream), and with `may_wait` under
    /// follow_dependencies those behind a stream wait on the event.
    void* take_class(stream_type stream, shard* sh, request r, bool may_wait) {
        if (sh == nullptr || !r.small() || r.alignment > granule || policy_ == reuse_policy::same_stream) return nullptr;
        std::array<std::uintptr_t, 64> got;
        std::size_t want = 0, n = 0;
        {
            std::lock_guard lock(sh->mutex);
            want = std::clamp<std::size_t>(sh->classes.hot_room(r.size_class) + 1, 1, got.size());
        }
        working_sets kept(*this, true);
        front_.for_each([&](shard& other) {
            if (n == want || &other == sh) return;
            std::lock_guard lock(other.mutex);
            if (other.classes.cold_count(r.size_class) == 0 || kept.keeps(other)) return;
            if (!covering_type::idle(other.event)) {
                if (!may_wait || policy_ != reuse_policy::follow_dependencies || !covering_type::usable(other.event)) return;
                wait_for(stream, other.event);
                activity_counters::count(activity_.dependency_waits);
            } else {
                activity_counters::count(activity_.opportunistic_reuses);
            }
            other.classes.take_cold(r.size_class, want - n, [&](std::uintptr_t a) { got[n++] = a; });
        });
        if (n == 0) return nullptr;
        std::lock_guard lock(sh->mutex);
        for (std::size_t i = 1; i < n; ++i) {
            if (!sh->classes.push_beyond_cap(r.size_class, got[i])) store_.lose(r.size); // theirs now: uncovered here
        }
        return reinterpret_cast<void*>(got[0]);
    }

    /// Moves every stream's cache to the shared set once its blocks are idle: a stream whose
    /// blocks are all covered is waited for through its event, the others through one
    /// synchronization of the device (their streams may be gone; the device has their work).
    /// Throws what the platform's waits throw (the blocks taken are then quarantined).
    void reclaim() {
        std::vector<std::vector<free_block>> taken;
        taken.reserve(front_.made()); // no allocation once blocks are out
        bool uncovered = false;
        front_.for_each([&](shard& sh) {
            if (taken.size() == taken.capacity()) return; // a shard created during the reclaim
            std::lock_guard lock(sh.mutex);
            // An event recorded in a capture custody was not told of cannot be waited for: the
            // device's synchronization covers its blocks instead.
            if (sh.dirty() || !covering_type::usable(sh.event)) {
                uncovered = true;
            } else {
                sh.event.synchronize();
            }
            taken.push_back(sh.take_blocks(which_blocks::all));
        });
        if (uncovered) {
            try {
                cover_.synchronize_devices();
            } catch (...) { // their work may still be running: they are never reused
                for (const auto& blocks : taken) {
                    for (const auto& b : blocks) store_.quarantine(b.size);
                }
                throw;
            }
        }
        for (auto& blocks : taken) store_.insert_runs(blocks);
    }

    /// Moves other streams' covered blocks to the shared set. Without `waiting`: those of every
    /// stream whose event has completed. With it: when the others hold at least `need` covered
    /// bytes, those of the stream holding the most, after a host wait on its event when it has not
    /// completed (counted); the wait's failure is thrown (the blocks quarantined). True when any
    /// moved.
    bool drain(const shard* self, bool keep_working_sets, bool waiting, std::size_t need = 0) {
        working_sets kept(*this, keep_working_sets);
        shard* largest = nullptr;
        std::size_t most = 0;
        bool moved = false;
        front_.for_each([&](shard& other) {
            if (&other == self) return;
            std::vector<free_block> blocks;
            {
                std::lock_guard lock(other.mutex);
                const std::size_t covered = other.covered_bytes();
                if (covered == 0 || kept.keeps(other)) return;
                if (waiting) {
                    if (covered > most && covering_type::usable(other.event)) most = covered, largest = &other;
                    return;
                }
                if (!covering_type::idle(other.event)) return;
                blocks = other.take_blocks(which_blocks::covered);
            }
            if (blocks.empty()) return;
            moved = true;
            store_.insert_runs(blocks);
            activity_counters::count(activity_.opportunistic_reuses);
        });
        if (!waiting || largest == nullptr || most < need) return moved;
        std::vector<free_block> blocks;
        {
            std::lock_guard lock(largest->mutex);
            blocks = largest->take_blocks(which_blocks::covered);
            if (blocks.empty()) return false;
            if (!largest->event.ready()) {
                try {
                    largest->event.synchronize();
                } catch (...) {
                    for (const auto& b : blocks) store_.quarantine(b.size);
                    throw;
                }
                activity_counters::count(activity_.host_waits);
            }
        }
        store_.insert_runs(blocks);
        activity_counters::count(activity_.opportunistic_reuses);
        return true;
    }

    /// Moves every covered block of other streams into this stream's spans behind a stream wait on
    /// each one's event (a host wait for the default stream, see wait_for), then records this
    /// stream's event so that they are covered here too. True when any moved.
    bool adopt_covered(stream_type stream, shard& self, bool keep_working_sets) {
        std::vector<free_block> adopted;
        working_sets kept(*this, keep_working_sets);
        front_.for_each([&](shard& other) {
            if (&other == &self) return;
            std::vector<free_block> blocks;
            {
                std::lock_guard lock(other.mutex);
                if (other.covered_bytes() == 0 || kept.keeps(other) || !covering_type::usable(other.event)) return;
                blocks = other.take_blocks(which_blocks::covered); // may throw: nothing taken
                try {
                    wait_for(stream, other.event);
                } catch (...) {
                    for (const auto& b : blocks) store_.quarantine(b.size); // their work may still run
                    throw;
                }
            }
            activity_counters::count(activity_.dependency_waits);
            try {
                adopted.insert(adopted.end(), blocks.begin(), blocks.end());
            } catch (const std::bad_alloc&) {
                for (const auto& b : blocks) store_.lose(b.size);
            }
        });
        if (adopted.empty()) return false;
        std::lock_guard lock(self.mutex);
        store_.chunks().insert_runs(adopted, self.spans, [&](std::size_t size) { store_.lose(size); });
        cover_.cover(self, stream); // the spans hold covered blocks only
        return true;
    }

    /// Unmaps up to `want` bytes (rounded up to granules) of whole granules that other streams'
    /// caches hold idle (covered, their event completed): unmapping is not reuse, it gives memory
    /// no work uses back to the device, under every reuse policy.
    void unmap_idle(const shard* self, std::size_t want) {
        if (want == 0) return;
        std::vector<address_run> runs;
        std::size_t done = 0;
        front_.for_each([&](shard& sh) {
            if (done >= want || &sh == self) return;
            std::lock_guard lock(sh.mutex);
            if (sh.covered_bytes() < store_.map_granule() || !covering_type::idle(sh.event)) return;
            sh.merge_recent(sh.recent.covered(), store_.chunks());
            done += cover_.take_granules(sh, want - done, runs);
        });
        store_.unmap_idle(runs);
    }


private:
    /// One pass over the shards deciding which streams keep their free memory as their own working
    /// set (pool_options::stream_working_set): a stream that gives back what it allocates (its live
    /// bytes are not negative: not a consumer of another stream's blocks) and caches at most
    /// stream_working_set bytes, while the streams so kept cache at most working_set_total in all.
    class working_sets {
    public:
        working_sets(const other_streams& s, bool keep) noexcept
            : per_stream_(keep ? s.working_set_ : 0), total_(keep ? s.working_set_total_ : 0) {}
        /// Whether `sh` (its lock held) keeps its cache; counts it when it does.
        [[nodiscard]] bool keeps(const shard& sh) noexcept {
            if (per_stream_ == 0 || sh.credit.live() < 0) return false;
            const std::size_t cached = sh.cached();
            if (cached > per_stream_ || cached > total_ - kept_) return false;
            kept_ += cached;
            return true;
        }

    private:
        std::size_t per_stream_;
        std::size_t total_;
        std::size_t kept_ = 0; ///< <= total_
    };

    /// Makes `stream` wait for `e`: a stream wait, or a host wait for the default stream, whose
    /// memory (the synchronous pair's) is usable at once by the host and by every stream.
    static void wait_for(stream_type stream, const typename platform_type::event& e) {
        if (stream == stream_type{}) {
            e.synchronize();
        } else {
            platform_type::wait(stream, e);
        }
    }

    reuse_policy policy_;
    std::size_t working_set_;       ///< pool_options::stream_working_set
    std::size_t working_set_total_; ///< pool_options::working_set_total
    caches_type& front_;
    covering_type& cover_;
    shared_store<Upstream>& store_;
    activity_counters& activity_;
};

} // namespace custody::pool::detail
