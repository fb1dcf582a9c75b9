/// @file
/// `seam`: what moves between a pool's streams and between them and its back end: the slow path's
/// ladder, other streams' caches as the reuse policy allows, each stream's working set, the bound
/// that waits rather than grow, the device-wide reclaim, and idle granules unmapped before new ones
/// are mapped. The one owner of those rules, between the per-stream front (stream_caches) and the
/// back end (shared_store).
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/pool/detail/block_kind.hpp>
#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/mapped_space.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/shared_store.hpp>
#include <custody/pool/detail/size_classes.hpp>
#include <custody/pool/detail/stream_caches.hpp>
#include <custody/pool/pool_options.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

namespace custody::pool::detail {

/// The seam of a pool over `Upstream`: every rule by which free memory leaves a stream for another
/// or for the back end, and the order in which the slow path tries them (take, then
/// take_after_reclaim).
///
/// Stream semantics: a block leaves its stream only covered (given back before the stream's last
/// record) and once its event has completed (drain_completed), behind a stream wait on the event
/// (adopt_covered), or after a host wait on it (release_largest, reclaim); blocks not yet covered
/// leave only after the device is synchronized (reclaim). Working sets: a stream that gives back
/// what it allocates keeps up to stream_working_set of its cache, working_set_total over all such
/// streams, from the others while the pool may grow.
/// Thread safety: thread-safe: each step takes the shards' locks one at a time, then the store's;
/// never both. Ownership: refers to the pool's front, back end and counters, which outlive it.
template <stream_ordered_resource Upstream>
class seam {
public:
    using caches_type = stream_caches<Upstream>;
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using shard = typename caches_type::shard;

    seam(const pool_options& options, caches_type& caches, shared_store<Upstream>& store, activity_counters& activity)
        : policy_(options.reuse), working_set_(options.stream_working_set), working_set_total_(options.working_set_total),
          c_(caches), store_(store), activity_(activity) {}
    seam(const seam&) = delete;
    seam& operator=(const seam&) = delete;

    /// The slow path's ladder for `r` on `stream` (its shard `sh`, held against retirement, or
    /// nullptr), each step costlier or more disruptive than the last, but the last resort; nullptr
    /// when none serves.
    void* take(stream_type stream, shard* sh, request r) {
        if (void* p = take_cached(sh, r)) return p;
        if (void* p = take_consolidated(stream, sh, r)) return p;
        if (void* p = take_from_other_streams(stream, sh, r, true)) return p;
        if (void* p = grow_and_take(stream, sh, r)) return p;
        return take_from_working_sets(stream, sh, r);
    }

    /// The tighter of two fits, this stream's spans of the request's kind and the shared set (its
    /// recent large blocks were tried first): searched in a fixed order, a loose fit in the first
    /// place would cut up a block that a later request needed whole while an exact one waited in
    /// the second. The spans win a tie (their memory is this stream's already).
    void* take_cached(shard* sh, request r) {
        std::size_t own = 0;
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            if (!sh->spans[r.kind].empty()) own = sh->spans[r.kind].fit(r.size, r.alignment);
        }
        if (own != r.size) { // an exact fit cannot be beaten
            const std::size_t shared = store_.fit(r.kind, r.size, r.alignment);
            if (shared != 0 && (own == 0 || shared < own)) {
                if (void* p = take_shared(sh, r)) return p;
            }
        }
        if (sh != nullptr) {
            if (const std::uintptr_t a = c_.take_span(*sh, r.kind, r)) return reinterpret_cast<void*>(a);
        }
        return take_shared(sh, r);
    }

    /// The shared set; a large block brings the small rest of its chunk to the stream's spans.
    void* take_shared(shard* sh, request r) {
        return c_.kept(sh, store_.take(r.kind, r.size, r.alignment, sh != nullptr));
    }

    /// This stream's own cache consolidated (see stream_caches::take_consolidated): merging its
    /// size-class lists when they hold more than 1/128 of the reserve (a quarter of a growth chunk).
    void* take_consolidated(stream_type stream, shard* sh, request r) {
        if (sh == nullptr) return nullptr;
        const std::size_t threshold = std::max(r.size, store_.reserved() / 128);
        return reinterpret_cast<void*>(c_.take_consolidated(*sh, stream, r, threshold, store_.within_initial()));
    }

    /// Other streams' free memory, as the reuse policy allows, before the pool grows (the table in
    /// docs/pool.md): the covered blocks of streams whose event has completed move to the shared set
    /// (opportunistic, follow_dependencies); under follow_dependencies this stream then adopts the
    /// others' covered blocks behind a stream wait; under the other two, when the others hold at
    /// least max(the request, reserve / 8) in covered blocks, the pool waits on the host for the
    /// one holding the most rather than grow, so that it stays bounded whatever the streams do. Each
    /// stream's working set (pool_options::stream_working_set) is left alone while
    /// `keep_working_sets`: the pool grows first, and takes them only when it cannot.
    void* take_from_other_streams(stream_type stream, shard* sh, request r, bool keep_working_sets) {
        const reuse_policy policy = policy_;
        if (policy != reuse_policy::same_stream && drain_completed(sh, which_blocks::covered, keep_working_sets)) {
            if (void* p = take_shared(sh, r)) return p;
        }
        if (policy == reuse_policy::follow_dependencies && sh != nullptr) {
            if (!adopt_covered(stream, *sh, keep_working_sets)) return nullptr;
            return reinterpret_cast<void*>(c_.take_span(*sh, r.kind, r));
        }
        const std::size_t need = keep_working_sets ? std::max(r.size, store_.reserved() / 8) : r.size;
        if (!release_largest(sh, need, keep_working_sets)) return nullptr;
        return take_shared(sh, r);
    }

    /// When the pool may not grow: other streams' working sets too, then free memory of either kind
    /// (what they gave up may be of the other kind), rather than the last resort.
    void* take_from_working_sets(stream_type stream, shard* sh, request r) {
        if (void* p = take_from_other_streams(stream, sh, r, false)) return p;
        return c_.kept(sh, store_.grow_and_take(r.kind, r.size, r.alignment, sh != nullptr));
    }

    /// New memory of the request's kind (see shared_store::grow_and_take). Over an upstream that
    /// maps, this stream's idle spans join the shared set first (the new granules go beside them)
    /// and other streams' idle granules are unmapped as many as the new ones need.
    void* grow_and_take(stream_type stream, shard* sh, request r) {
        if constexpr (shared_store<Upstream>::maps) {
            if (sh != nullptr) release_own_idle(stream, *sh);
            unmap_idle(sh, store_.shortfall(r.kind, r.size, r.alignment));
        }
        return c_.kept(sh, store_.grow_and_take(r.kind, r.size, r.alignment, sh != nullptr));
    }

    /// The last resort: this stream's memory of the other kind, without waiting; then (unless
    /// `capture_open`: waiting would break the capture, and `why` says so) waits for every stream,
    /// coalesces everything, gives free chunks back and retries once. nullptr when nothing serves
    /// even then.
    void* take_after_reclaim(stream_type stream, shard* sh, request r, bool capture_open, const char*& why) {
        if (sh != nullptr) {
            if (void* p = reinterpret_cast<void*>(c_.take_consolidated(*sh, stream, r, SIZE_MAX, true))) return p;
        }
        if (capture_open) {
            why = "a graph capture is open in the pool, which does not wait for streams then";
            return nullptr;
        }
        activity_counters::count(activity_.reclaims);
        reclaim();
        const free_block b = store_.take_or_regrow(r.kind, r.size, r.alignment);
        return b.size != 0 ? reinterpret_cast<void*>(b.address) : nullptr;
    }

    /// A stream that went the slow way for a size asks for it again soon (a decode step's
    /// activations, a request's KV pages): a few more blocks of that size go to its class list at
    /// once, cut from free memory as one run (one tree operation), from its own spans or else the
    /// shared set, so that its next allocations take the fast path. Up to refill_bytes of them
    /// (halving while no run fits); never by growing the pool. They count as given back now (not
    /// covered until the stream records again). Nothing happens on a bad_alloc. The caller holds
    /// the shard against retirement.
    [[gnu::noinline]] void refill(shard& sh, request r) noexcept {
        constexpr std::size_t refill_bytes = std::size_t{1} << 20;
        const std::size_t most = std::min<std::size_t>(32, refill_bytes / r.size);
        if (most == 0) return;
        {
            std::lock_guard lock(sh.mutex);
            if (!reserve_class(sh, r, most)) return;
            for (std::size_t n = most; n != 0; n /= 2) {
                if (const std::uintptr_t run = sh.take_span(block_kind::small, n * r.size, granule)) {
                    return keep_run(sh, r, run, n);
                }
            }
        }
        for (std::size_t n = most; n != 0; n /= 2) {
            const std::uintptr_t run = store_.take(block_kind::small, n * r.size, granule, false).block.address;
            if (run == 0) continue;
            {
                std::lock_guard lock(sh.mutex);
                if (reserve_class(sh, r, n)) return keep_run(sh, r, run, n); // room, unless another thread took it
            }
            store_.insert({run, n * r.size, 0});
            return;
        }
    }
    /// Room for `n` more blocks in the class list of `r` (the shard's lock held); false on a bad_alloc.
    static bool reserve_class(shard& sh, request r, std::size_t n) noexcept {
        try {
            sh.classes.reserve(r.size_class, n);
            return true;
        } catch (const std::bad_alloc&) {
            return false;
        }
    }
    /// The `n` blocks of `r`'s size in the run at `run` into the stream's class list (its lock
    /// held, room made), lowest address on top.
    static void keep_run(shard& sh, request r, std::uintptr_t run, std::size_t n) noexcept {
        for (std::size_t i = n; i-- > 0;) static_cast<void>(sh.classes.push_within_capacity(r.size_class, run + i * r.size));
        sh.cached += n * r.size;
    }

    // ---- other streams' caches ----

    /// Moves the blocks `which` means (covered, or idle: see class_lists) of other streams whose
    /// event has completed to the shared set. True when anything moved. Never waits.
    bool drain_completed(const shard* self, which_blocks which, bool keep_working_sets) {
        bool moved = false;
        working_sets kept(*this, keep_working_sets);
        c_.table_.for_each([&](shard& other) {
            if (&other == self) return;
            std::vector<free_block> blocks;
            {
                std::lock_guard lock(other.mutex);
                if (other.cached == 0 || kept.keeps(other) || !caches_type::idle(other.event)) return;
                blocks = other.take_blocks(which, c_.record_interval_);
            }
            if (blocks.empty()) return;
            store_.insert_runs(blocks);
            activity_counters::count(activity_.opportunistic_reuses);
            moved = true;
        });
        return moved;
    }

    /// Moves every covered block of other streams into this stream's cache behind a stream wait on
    /// each one's event (no host synchronization but for the default stream, see wait_for), then
    /// records this stream's event so that they are covered here too: other streams' free memory
    /// becomes this stream's at once, whatever its sizes. True when any moved.
    bool adopt_covered(stream_type stream, shard& self, bool keep_working_sets) {
        std::vector<free_block> adopted;
        working_sets kept(*this, keep_working_sets);
        c_.table_.for_each([&](shard& other) {
            if (&other == &self) return;
            std::vector<free_block> blocks;
            {
                std::lock_guard lock(other.mutex);
                if (other.cached == 0 || other.cached == other.uncovered_bytes || kept.keeps(other) ||
                    !caches_type::usable(other.event)) {
                    return;
                }
                blocks = other.take_blocks(which_blocks::covered, c_.record_interval_); // may throw: nothing taken
                if (blocks.empty()) return;
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
        std::size_t bytes = 0;
        for (const auto& b : adopted) bytes += b.size;
        std::lock_guard lock(self.mutex);
        self.cached += bytes - store_.chunks().insert_runs(adopted, self.spans, [&](std::size_t size) { store_.lose(size); });
        c_.cover(self, stream); // the spans hold covered blocks only
        return true;
    }

    /// When other streams' caches hold at least `need` covered bytes, waits on the host for the
    /// event of the one holding the most (not at all when it has completed) and moves its covered
    /// blocks to the shared set: the pool does not grow while another stream's finished work holds
    /// the memory it needs (a host wait, counted, under the policies that make no stream wait).
    /// Throws what the wait throws (the blocks are then quarantined). True when any moved.
    bool release_largest(const shard* self, std::size_t need, bool keep_working_sets) {
        shard* largest = nullptr;
        std::size_t most = 0;
        working_sets kept(*this, keep_working_sets);
        c_.table_.for_each([&](shard& other) {
            if (&other == self) return;
            std::lock_guard lock(other.mutex);
            const std::size_t covered = other.cached - std::min(other.cached, other.uncovered_bytes);
            if (covered > most && !kept.keeps(other) && caches_type::usable(other.event)) {
                most = covered;
                largest = &other;
            }
        });
        if (largest == nullptr || most < need) return false;
        std::vector<free_block> blocks;
        {
            std::lock_guard lock(largest->mutex);
            blocks = largest->take_blocks(which_blocks::covered, c_.record_interval_);
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

    /// Moves every stream's cache to the shared set once its blocks are idle: a stream whose
    /// blocks are all covered is waited for through its event, the others through one
    /// synchronization of the device (their streams may be gone; the device has their work).
    /// Throws what the platform's waits throw (the blocks taken are then quarantined).
    void reclaim() {
        std::vector<std::vector<free_block>> taken;
        taken.reserve(c_.table_.size()); // no allocation once blocks are out
        bool uncovered = false;
        c_.table_.for_each([&](shard& sh) {
            if (taken.size() == taken.capacity()) return; // a shard created during the reclaim
            std::lock_guard lock(sh.mutex);
            if (sh.cached == 0) return;
            // An event recorded in a capture custody was not told of cannot be waited for: the
            // device's synchronization covers its blocks instead.
            if (sh.dirty(c_.record_interval_) || !caches_type::usable(sh.event)) {
                uncovered = true;
            } else {
                sh.event.synchronize();
            }
            taken.push_back(sh.take_blocks(which_blocks::all, c_.record_interval_));
        });
        if (uncovered) {
            try {
                c_.synchronize_devices();
            } catch (...) {
                // Their work may still be running: they are never reused.
                for (const auto& blocks : taken) {
                    for (const auto& b : blocks) store_.quarantine(b.size);
                }
                throw;
            }
        }
        for (auto& blocks : taken) store_.insert_runs(blocks);
    }

    // ---- idle memory, for a pool that maps ----

    /// Before the pool maps more for this stream: its own spans go to the shared set once idle (its
    /// event, recorded now when some blocks are not covered, has completed), where growth joins
    /// them to the granules it maps beside them and unmaps those it cannot use. Idle memory may go
    /// to any stream: no work uses it.
    void release_own_idle(stream_type stream, shard& self) {
        if (store_.map_granule() == 0) return;
        std::vector<free_block> blocks;
        {
            std::lock_guard lock(self.mutex);
            if (self.spans[block_kind::small].empty() && self.spans[block_kind::large].empty() && self.recent.empty()) return;
            if ((self.dirty(c_.record_interval_) || !self.recent.all_covered()) && !c_.cover(self, stream)) return;
            if (!caches_type::idle(self.event)) return;
            self.merge_recent(self.recent.size(), store_.chunks());
            blocks.reserve(self.spans[block_kind::small].count() + self.spans[block_kind::large].count()); // may throw
            for (block_kind kind : block_kinds) {
                self.spans[kind].drain([&](free_block b) {
                    b.kind = kind;
                    blocks.push_back(b);
                    self.cached -= b.size;
                });
            }
        }
        store_.insert_runs(blocks);
    }

    /// Unmaps up to `want` bytes (rounded up to granules) of whole granules that other streams'
    /// caches hold idle: the covered blocks of a stream whose event has completed. Unmapping is not
    /// reuse: it gives memory no work uses back to the device, under every reuse policy. Returns the
    /// bytes.
    std::size_t unmap_idle(const shard* self, std::size_t want) {
        const std::size_t unit = store_.map_granule();
        if (want == 0 || unit == 0) return 0;
        std::vector<address_run> runs;
        std::size_t done = 0;
        c_.table_.for_each([&](shard& sh) {
            if (done >= want || &sh == self) return;
            std::lock_guard lock(sh.mutex);
            if (sh.cached < unit || !caches_type::idle(sh.event)) return;
            sh.merge_recent(sh.recent.covered(), store_.chunks());
            done += c_.take_granules(sh, unit, want - done, runs);
        });
        store_.unmap_idle(runs);
        return done;
    }

private:
    /// One pass over the shards deciding which streams keep their free memory as their own working
    /// set (pool_options::stream_working_set): a stream that gives back what it allocates (its live
    /// bytes are not negative: not a consumer of another stream's blocks) and caches at most
    /// stream_working_set bytes, while the streams so kept cache at most working_set_total in all.
    /// Other streams' allocations leave those alone (they grow instead), so that streams taking
    /// turns in one thread do not hand each other their blocks at every call.
    class working_sets {
    public:
        /// The working sets of `c`; none when not `keep`.
        working_sets(const seam& c, bool keep) noexcept
            : per_stream_(keep ? c.working_set_ : 0), total_(keep ? c.working_set_total_ : 0) {}
        /// Whether `sh` (its lock held) keeps its cache; counts it when it does.
        [[nodiscard]] bool keeps(const shard& sh) noexcept {
            if (sh.credit.live() < 0 || sh.cached > per_stream_ || sh.cached > total_ - kept_) return false;
            kept_ += sh.cached;
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
    caches_type& c_;
    shared_store<Upstream>& store_;
    activity_counters& activity_;
};

} // namespace custody::pool::detail
