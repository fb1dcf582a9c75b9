/// @file
/// `seam`: what moves between a pool's streams and between them and its back end when a request
/// misses its stream's own cache: the slow path's ladder, other streams' covered blocks as the
/// reuse policy allows, each stream's working set, the bound that waits rather than grow, the
/// device-wide reclaim, and idle granules unmapped before new ones are mapped. With covering.hpp
/// (when a stream's blocks become others'), the one owner of those rules.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/platform/capture.hpp>
#include <custody/pool/detail/covering.hpp>
#include <custody/pool/detail/other_streams.hpp>
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
#include <optional>
#include <vector>

namespace custody::pool::detail {

/// The seam of a pool over `Upstream`, on the taking side: every rule by which free memory leaves
/// a stream for another or for the back end, and the order in which a miss tries them (take).
///
/// Stream semantics and working sets: other_streams.hpp's, whose rules the ladder applies.
/// Thread safety: thread-safe: each step takes the shards' locks one at a time, then the store's;
/// never two at once. Ownership: refers to the pool's front, covering, back end and counters.
template <stream_ordered_resource Upstream>
class seam {
public:
    using caches_type = stream_caches<Upstream>;
    using covering_type = covering<Upstream>;
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using shard = typename caches_type::shard;

    seam(const pool_options& options, caches_type& front, covering_type& covering, shared_store<Upstream>& store,
         activity_counters& activity)
        : others_(options, front, covering, store, activity), front_(front), cover_(covering), store_(store),
          activity_(activity) {}
    seam(const seam&) = delete;
    seam& operator=(const seam&) = delete;

    /// A block for `r` on `stream`, the careful way: the stream's own cache, then the ladder, then
    /// the last resort (take_after_reclaim); counted. nullptr when none serves (`why` may say why).
    /// With `capture_open`, the potentially unsafe calls (growth, event queries) run in a relaxed
    /// capture mode: they touch nothing a capture holds.
    void* take(stream_type stream, request r, bool capture_open, const char*& why) {
        const std::uintptr_t key = caches_type::key_of(stream);
        shard* sh = cover_.shard_for(stream, key);
        if (sh != nullptr) {
            if (void* p = front_.take_own(*sh, key, r)) return p;
        }
        const typename caches_type::pinned pin(sh, key); // nullptr: no longer the stream's
        sh = pin.get();
        std::optional<basic_capture_mode_guard<platform_type>> relaxed;
        if (capture_open) relaxed.emplace(capture_mode::relaxed);
        void* p = ladder(stream, sh, r);
        if (p == nullptr) p = take_after_reclaim(stream, sh, r, capture_open, why);
        if (p == nullptr) return nullptr;
        front_.count_taken(sh, r);
        if (sh != nullptr && r.small() && r.alignment <= granule) refill(*sh, r);
        return p;
    }

    /// The ladder for `r` on `stream` (its shard `sh`, held against retirement, or nullptr), each
    /// step costlier or more disruptive than the last; nullptr when none serves.
    void* ladder(stream_type stream, shard* sh, request r) {
        if (void* p = others_.take_class(stream, sh, r, false)) return p;
        if (void* p = take_cached(sh, r)) return p;
        if (void* p = take_consolidated(stream, sh, r, store_.reserved() / 128, store_.within_initial())) return p;
        if (void* p = take_from_other_streams(stream, sh, r, true)) return p;
        if (void* p = grow_and_take(stream, sh, r)) return p;
        if (void* p = take_from_other_streams(stream, sh, r, false)) return p; // the working sets too
        return kept(sh, store_.grow_and_take(r.kind, r.size, r.alignment, sh != nullptr));
    }

    /// The tighter of two fits, this stream's spans of the request's kind and the shared set:
    /// searched in a fixed order, a loose fit in the first place would cut up a block that a later
    /// request needed whole while an exact one waited in the second. The spans win a tie.
    void* take_cached(shard* sh, request r) {
        std::size_t own = 0;
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            if (!sh->spans[r.kind].empty()) own = sh->spans[r.kind].fit(r.size, r.alignment);
        }
        if (own != r.size) { // an exact fit cannot be beaten
            const std::size_t shared = store_.fit(r.kind, r.size, r.alignment);
            if (shared != 0 && (own == 0 || shared < own)) {
                if (void* p = kept(sh, store_.take(r.kind, r.size, r.alignment, sh != nullptr))) return p;
            }
        }
        if (sh != nullptr) {
            if (const std::uintptr_t a = front_.take_span(*sh, r.kind, r)) return reinterpret_cast<void*>(a);
        }
        return kept(sh, store_.take(r.kind, r.size, r.alignment, sh != nullptr));
    }

    /// This stream's own cache consolidated, before the pool grows: for a small request its cold
    /// size-class blocks (its hot ones are its working set) merged into its spans when they hold
    /// at least `class_threshold` bytes
    /// (searched in its small spans only: its large spans hold the rests of its large blocks'
    /// chunks, which a long-lived small block would pin); for a large one its recent blocks merged;
    /// then the shared set's free blocks beside its spans joined to them (free space cut in two by
    /// the stream/shared boundary); with `either_kind` (the pool's initial size still holds
    /// everything), its spans of the other kind too. nullptr when none fits.
    void* take_consolidated(stream_type stream, shard* sh, request r, std::size_t class_threshold, bool either_kind) {
        if (sh == nullptr) return nullptr;
        std::vector<free_block> own;
        {
            std::lock_guard lock(sh->mutex);
            if (r.small() && sh->classes.cold_bytes() >= std::max(r.size, class_threshold)) {
                std::vector<free_block> scratch;
                scratch.reserve(sh->classes.count(which_blocks::covered)); // may throw: nothing has moved yet
                sh->merge_classes(scratch, store_.chunks(), [&](std::size_t size) { store_.lose(size); });
            }
            if (!r.small()) merge_recent(*sh, stream);
            if (const std::uintptr_t a = sh->take_span(r.kind, r.size, r.alignment)) return reinterpret_cast<void*>(a);
            own.reserve(sh->spans[r.kind].count()); // may throw: nothing has moved yet
            sh->spans[r.kind].for_each([&](free_block b) {
                b.kind = r.kind;
                own.push_back(b);
            });
        }
        std::vector<free_block> taken;
        if (!own.empty()) store_.take_neighbours(r.kind, own, taken);
        std::lock_guard lock(sh->mutex);
        for (std::size_t i = 0; i < taken.size(); ++i) {
            try {
                sh->spans[r.kind].insert(taken[i]);
            } catch (const std::bad_alloc&) {
                store_.lose(taken[i].size);
            }
        }
        if (const std::uintptr_t a = sh->take_span(r.kind, r.size, r.alignment)) return reinterpret_cast<void*>(a);
        if (!either_kind) return nullptr;
        merge_recent(*sh, stream);
        return reinterpret_cast<void*>(sh->take_span(other(r.kind), r.size, r.alignment));
    }

    /// Other streams' free memory, as the reuse policy allows, before the pool grows (the table in
    /// docs/pool.md): the covered blocks of streams whose event has completed move to the shared set
    /// (opportunistic, follow_dependencies); under follow_dependencies this stream then takes the
    /// others' covered blocks behind a stream wait; under the other two, when the others hold at
    /// least max(the request, reserve / 8) in covered blocks, the pool waits on the host for the
    /// one holding the most rather than grow, so that it stays bounded whatever the streams do.
    /// Working sets (pool_options::stream_working_set) are left alone while `keep_working_sets`.
    void* take_from_other_streams(stream_type stream, shard* sh, request r, bool keep_working_sets) {
        const reuse_policy policy = others_.policy();
        if (policy != reuse_policy::same_stream && others_.drain(sh, keep_working_sets, false)) {
            if (void* p = kept(sh, store_.take(r.kind, r.size, r.alignment, sh != nullptr))) return p;
        }
        if (policy == reuse_policy::follow_dependencies && sh != nullptr) {
            if (void* p = others_.take_class(stream, sh, r, true)) return p;
            if (!others_.adopt_covered(stream, *sh, keep_working_sets)) return nullptr;
            return reinterpret_cast<void*>(front_.take_span(*sh, r.kind, r));
        }
        const std::size_t need = keep_working_sets ? std::max(r.size, store_.reserved() / 8) : r.size;
        if (!others_.drain(sh, keep_working_sets, true, need)) return nullptr;
        return kept(sh, store_.take(r.kind, r.size, r.alignment, sh != nullptr));
    }

    /// New memory of the request's kind (see shared_store::grow_and_take). Over an upstream that
    /// maps, this stream's idle spans join the shared set first (the new granules go beside them)
    /// and other streams' idle granules are unmapped as many as the new ones need.
    void* grow_and_take(stream_type stream, shard* sh, request r) {
        if constexpr (shared_store<Upstream>::maps) {
            if (sh != nullptr) release_own_idle(stream, *sh);
            others_.unmap_idle(sh, store_.shortfall(r.kind, r.size, r.alignment));
        }
        return kept(sh, store_.grow_and_take(r.kind, r.size, r.alignment, sh != nullptr));
    }

    /// The last resort: this stream's memory of either kind, without waiting; then (unless
    /// `capture_open`: waiting would break the capture, and `why` says so) waits for every stream,
    /// coalesces everything, gives free chunks back and retries once.
    void* take_after_reclaim(stream_type stream, shard* sh, request r, bool capture_open, const char*& why) {
        if (void* p = take_consolidated(stream, sh, r, 0, true)) return p;
        if (capture_open) {
            why = "a graph capture is open in the pool, which does not wait for streams then";
            return nullptr;
        }
        activity_counters::count(activity_.reclaims);
        others_.reclaim();
        const free_block b = store_.take_or_regrow(r.kind, r.size, r.alignment);
        return b.size != 0 ? reinterpret_cast<void*>(b.address) : nullptr;
    }

    /// A stream that went the slow way for a size asks for it again soon (a decode step's
    /// activations, a request's KV pages): as many more blocks of that size as its hot stack has
    /// room for (at most 32 and 1 MiB) go there at once, cut from free memory as one run (one tree
    /// operation), from its own spans or else the shared set, never by growing. The caller holds
    /// the shard against retirement. Nothing happens on a bad_alloc.
    [[gnu::noinline]] void refill(shard& sh, request r) noexcept {
        const auto most = [&] {
            return std::min<std::size_t>({32, (std::size_t{1} << 20) / r.size, sh.classes.hot_room(r.size_class)});
        };
        std::size_t n = 0;
        {
            std::lock_guard lock(sh.mutex);
            for (n = most(); n != 0; n /= 2) {
                if (const std::uintptr_t run = sh.take_span(block_kind::small, n * r.size, granule)) {
                    return sh.classes.push_run(r.size_class, run, n);
                }
            }
            n = most();
        }
        for (; n != 0; n /= 2) {
            const std::uintptr_t run = store_.take(block_kind::small, n * r.size, granule, false).block.address;
            if (run == 0) continue;
            {
                std::lock_guard lock(sh.mutex);
                if (most() >= n) return sh.classes.push_run(r.size_class, run, n); // room, unless another thread took it
            }
            return store_.insert({run, n * r.size, 0});
        }
    }

    /// Moves every stream's cache to the shared set once idle (see other_streams::reclaim).
    void reclaim() { others_.reclaim(); }

private:
    /// The stream's recent blocks merged into its spans (its lock held), recording first when some
    /// are not covered.
    void merge_recent(shard& sh, stream_type stream) noexcept {
        if (sh.recent.empty()) return;
        if (!sh.recent.all_covered() && !cover_.cover(sh, stream)) return;
        sh.merge_recent(sh.recent.size(), store_.chunks());
    }

    /// The block of `t` (taken for the stream of `sh`; nullptr: a stream without a shard, whose
    /// `t` has no tail), its tail kept in the stream's large spans (in the shared set again when
    /// there is no host memory for it).
    void* kept(shard* sh, const taken_block& t) noexcept {
        if (t.tail.size != 0) {
            bool in_spans = false;
            {
                std::lock_guard lock(sh->mutex);
                try {
                    sh->spans[block_kind::large].insert(t.tail);
                    in_spans = true;
                } catch (const std::bad_alloc&) {
                }
            }
            if (!in_spans) store_.insert(t.tail);
        }
        return reinterpret_cast<void*>(t.block.address);
    }

    /// Before the pool maps more for this stream: its own spans go to the shared set once idle (its
    /// event, recorded now when some recent blocks are not covered, has completed), where growth
    /// joins them to the granules it maps beside them and unmaps those it cannot use.
    void release_own_idle(stream_type stream, shard& self) {
        std::vector<free_block> blocks;
        {
            std::lock_guard lock(self.mutex);
            if (self.spans[block_kind::small].empty() && self.spans[block_kind::large].empty() && self.recent.empty()) return;
            if (!self.recent.all_covered() && !cover_.cover(self, stream)) return;
            if (!covering_type::idle(self.event)) return;
            self.merge_recent(self.recent.size(), store_.chunks());
            blocks.reserve(self.spans[block_kind::small].count() + self.spans[block_kind::large].count()); // may throw
            for (block_kind kind : block_kinds) {
                self.spans[kind].drain([&](free_block b) {
                    b.kind = kind;
                    blocks.push_back(b);
                });
            }
        }
        store_.insert_runs(blocks);
    }

    other_streams<Upstream> others_;
    caches_type& front_;
    covering_type& cover_;
    shared_store<Upstream>& store_;
    activity_counters& activity_;
};

} // namespace custody::pool::detail
