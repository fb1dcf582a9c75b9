/// @file
/// `stream_caches`: the pool's per-stream side: a shard per stream, the events that say when a
/// stream's blocks are idle, and the rules by which blocks leave one stream for the others.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/platform/capture.hpp>
#include <custody/platform/platform.hpp>
#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/event_pool.hpp>
#include <custody/pool/detail/peak_counter.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/shard.hpp>
#include <custody/pool/detail/shared_store.hpp>
#include <custody/pool/detail/stream_table.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/pool_statistics.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace custody::pool::detail {

template <stream_ordered_resource Upstream>
class seam;

/// The streams' caches of a pool over `Upstream` (the pool's front): a shard per stream, found
/// without a lock, and each stream's own reuse; what moves between streams is seam.hpp's.
///
/// Stream semantics: a block given back on stream s is reusable at once on s. It is covered once
/// s's event is recorded after it (every record_interval frees or record_bytes bytes given back on
/// s, and before s's blocks move into its spans); only covered blocks leave s for another stream,
/// as the seam decides (seam.hpp), unless the device was synchronized. Only s's own calls record on
/// s, so a destroyed stream never sees a record.
/// Thread safety: thread-safe; each shard's lock guards it; no shard's lock is held while the
/// store's is taken. Ownership: owns the shards and their events; refers to the store and the
/// activity counters of its pool, which outlive it.
template <stream_ordered_resource Upstream>
class stream_caches {
public:
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using shard = detail::shard<typename platform_type::event>;

    template <stream_ordered_resource>
    friend class seam; // the rules that move blocks between streams use the shards and covering

    /// For a pool of `device` (-1: none) with validated `options`. Creates options.initial_events
    /// events (on `device`, or the current one), and throws what creating them throws.
    stream_caches(const pool_options& options, int device, shared_store<Upstream>& store, activity_counters& activity,
                  peak_counter& peak)
        : record_interval_(options.record_interval), record_bytes_(options.record_bytes),
          record_share_(options.record_share),
          release_threshold_(store.map_granule() == 0 ? SIZE_MAX : options.release_threshold),
          device_(device),
          events_(device >= 0 ? device : platform_type::current_device(), options.initial_events, options.event_batch),
          table_(options.max_streams), store_(store), activity_(activity), peak_(peak) {}
    stream_caches(const stream_caches&) = delete;
    stream_caches& operator=(const stream_caches&) = delete;

    /// Waits until every cached block is idle: each stream's event, and the device when some
    /// blocks are not covered. Reports failures, unless the process is exiting (for the pool's
    /// destructor; see run_exit_tolerant).
    void wait_all() noexcept {
        bool uncovered = false;
        table_.for_each([&](shard& sh) {
            uncovered = uncovered || sh.dirty(record_interval_);
            run_exit_tolerant<platform_type>("stream_ordered_pool: waiting for a stream's event at destruction",
                                             [&] { sh.event.synchronize(); });
        });
        if (!uncovered) return;
        run_exit_tolerant<platform_type>("stream_ordered_pool: synchronizing the device at destruction",
                                         [&] { synchronize_devices(); });
    }

    // ---- finding a stream's shard ----

    /// The key a stream's shard is found by (Platform::stream_key).
    [[nodiscard]] static std::uintptr_t key_of(stream_type stream) { return platform_type::stream_key(stream); }

    /// The shard of the stream whose key is `key`, made at its first use (given a retired shard's
    /// place when max_streams shards exist); nullptr when every shard serves a stream that is
    /// still active. Lock-free when the shard exists. Throws std::invalid_argument for a stream of
    /// another device, and what making an event throws. The caller checks shard::serves(key) under
    /// the shard's lock before using it (it may have been retired since).
    shard* shard_for(stream_type stream, std::uintptr_t key) {
        if (shard* sh = table_.find(key)) [[likely]] return sh;
        return make_shard(stream, key);
    }

    /// The shard found under `key` without creating one (the fast path's lookup: no lock, no
    /// write); nullptr otherwise. The caller checks shard::serves(key) under the shard's lock.
    [[nodiscard, gnu::always_inline]] shard* find(std::uintptr_t key) const noexcept { return table_.find(key); }

    /// shard_for for deallocate: nullptr for a stream of another device (served without a
    /// shard, as documented), and when no shard can be made (reported).
    shard* shard_for_free(stream_type stream, std::uintptr_t key) noexcept {
        if (shard* sh = table_.find(key)) [[likely]] return sh;
        return make_shard_for_free(stream, key);
    }

    /// Holds a shard against retirement for a slow path: `get()` is the shard (nullptr when it no
    /// longer serves the stream: the call is then served without one).
    class pinned {
    public:
        pinned(shard* sh, std::uintptr_t key) noexcept : sh_(sh) {
            if (sh_ == nullptr) return;
            std::lock_guard lock(sh_->mutex);
            if (sh_->serves(key)) {
                ++sh_->slow_users;
            } else {
                sh_ = nullptr;
            }
        }
        ~pinned() {
            if (sh_ == nullptr) return;
            std::lock_guard lock(sh_->mutex);
            --sh_->slow_users;
        }
        pinned(const pinned&) = delete;
        pinned& operator=(const pinned&) = delete;
        [[nodiscard]] shard* get() const noexcept { return sh_; }

    private:
        shard* sh_;
    };

private:
    [[gnu::noinline]] shard* make_shard_for_free(stream_type stream, std::uintptr_t key) noexcept {
        try {
            return make_shard(stream, key);
        } catch (const std::invalid_argument&) {
            return nullptr;
        } catch (...) {
            report_failure("stream_ordered_pool: no shard could be made for a stream; its block is given back "
                           "after the stream finishes");
            return nullptr;
        }
    }

    /// The slow half of shard_for, out of line so that the lookup stays small enough to inline.
    /// When every shard serves a stream, those whose blocks are all idle are retired first.
    [[gnu::noinline]] shard* make_shard(stream_type stream, std::uintptr_t key) {
        if (device_ >= 0 && !(stream == stream_type{}) && platform_type::stream_device(stream) != device_) {
            throw std::invalid_argument("custody: stream of device " + std::to_string(platform_type::stream_device(stream)) +
                                        " used with a pool of device " + std::to_string(device_));
        }
        const auto make = [&](shard* reuse) {
            if (reuse == nullptr) {
                auto made = std::make_unique<shard>(key, events_.acquire(), record_interval_);
                made->record_limit = record_threshold();
                for (auto& set : made->spans) set.count_whole(store_.map_granule()); // what release_granules reads
                return made.release();
            }
            std::lock_guard lock(reuse->mutex);
            reuse->serve(key, record_interval_);
            reuse->record_limit = record_threshold();
            return reuse;
        };
        if (shard* sh = table_.find_or_create(key, make)) return sh;
        if (retire_idle(false) == 0 && retire_idle(true) == 0) return nullptr;
        return table_.find_or_create(key, make);
    }

public:
    // ---- streams that went away ----

    /// Retires the shards whose blocks are all idle: covered, and their event completed (a
    /// destroyed stream's, once its last event completed; a live stream's that has nothing pending):
    /// their blocks go to the shared set, their counts to the pool's totals, their credit back to
    /// the peak counter, and the shard serves the next new stream (a live stream whose shard went
    /// gets another at its next call). Runs when every shard serves a stream, so that streams
    /// created and destroyed without end keep shards. With `synchronizing` (when none was idle so:
    /// their streams gave blocks back since they last recorded, and only a stream's own calls
    /// record on it, for it may be gone), it synchronizes the device first and retires the shards
    /// that were given nothing back meanwhile: a host wait, only when max_streams streams hold
    /// blocks their events do not cover. Returns the shards retired.
    std::size_t retire_idle(bool synchronizing) {
        std::lock_guard sweep(sweep_mutex_);
        // An event query must not break a capture another thread has open (it touches nothing of it).
        const basic_capture_mode_guard<platform_type> relaxed(capture_mode::relaxed);
        std::vector<std::uint64_t> frees; // with `synchronizing`: each shard's frees before the wait
        if (synchronizing) {
            frees.reserve(table_.size());
            table_.for_each([&](shard& sh) {
                std::lock_guard lock(sh.mutex);
                if (frees.size() < frees.capacity()) frees.push_back(sh.counts.deallocations);
            });
            try {
                synchronize_devices();
            } catch (...) {
                report_failure("stream_ordered_pool: synchronizing the device to retire a stream's shard failed");
                return 0;
            }
        }
        std::size_t retired = 0;
        std::size_t index = 0;
        table_.for_each([&](shard& sh) {
            const std::size_t i = index++;
            std::vector<free_block> blocks;
            std::uintptr_t key = shard::no_stream;
            {
                std::lock_guard lock(sh.mutex);
                key = sh.key.load(std::memory_order_relaxed);
                const bool all_idle = synchronizing ? i < frees.size() && frees[i] == sh.counts.deallocations
                                                    : !sh.dirty(record_interval_) && sh.recent.all_covered() && idle(sh.event);
                if (key == shard::no_stream || sh.slow_users != 0 || !all_idle) return;
                blocks = sh.take_blocks(which_blocks::all, record_interval_); // may throw: nothing taken
                retired_ += sh.totals();
                peak_.release(sh.credit.take_all()); // its live bytes stay counted, in retired_
                sh.counts = {};
                sh.credit = {};
                sh.key.store(shard::no_stream, std::memory_order_release);
            }
            store_.insert_runs(blocks);
            table_.retire(&sh, key);
            ++retired;
        });
        activity_.retired.fetch_add(retired, std::memory_order_relaxed);
        return retired;
    }

    /// Adds the counts of the shards retired so far to `c`.
    void add_retired(counters& c) const {
        std::lock_guard sweep(sweep_mutex_);
        c += retired_;
    }

    // ---- giving back ----

    /// Keeps a block given back on the shard's stream (whose key is `key`); counts it lost when
    /// there is no host memory to hold it. False, changing nothing, when the shard no longer serves
    /// the stream (the caller looks it up again). A stream that gives back the last of what it
    /// holds records its event, so that a stream destroyed after its last free leaves nothing
    /// uncovered.
    [[gnu::always_inline]] bool give_back(shard& sh, stream_type stream, std::uintptr_t key, std::uintptr_t address,
                                          request r) noexcept {
        bool stored = false;
        {
            std::lock_guard lock(sh.mutex);
            if (!sh.serves(key)) [[unlikely]] return false;
            stored = store_in(sh, stream, address, r);
            if (stored && sh.stored(r.size)) [[unlikely]] cover(sh, stream);
            sh.on_deallocated(r);
        }
        if (!stored) store_.lose(r.size);
        if (release_threshold_ != SIZE_MAX && !r.small()) [[unlikely]] release_granules(sh, stream, key);
        return true;
    }

    /// For a pool that maps with a release threshold (pool_options::release_threshold): the wholly
    /// free granules the stream holds beyond the threshold go back to the device as its large blocks
    /// come back, once its event says that no work uses them. The event the stream recorded last
    /// is asked first (its covered blocks go if it has completed), then recorded again when blocks
    /// came back since, so that a busy stream's memory goes at its next large free after the work.
    [[gnu::noinline]] void release_granules(shard& sh, stream_type stream, std::uintptr_t key) noexcept {
        const std::size_t unit = store_.map_granule();
        std::vector<address_run> runs;
        {
            std::lock_guard lock(sh.mutex);
            if (!sh.serves(key)) return;
            if (idle(sh.event)) {
                sh.merge_recent(sh.recent.covered(), store_.chunks());
                const std::size_t whole = sh.spans[block_kind::small].whole_bytes() + sh.spans[block_kind::large].whole_bytes();
                if (whole > release_threshold_) take_granules(sh, unit, whole - release_threshold_, runs);
            }
            if (sh.dirty(record_interval_) || !sh.recent.all_covered()) static_cast<void>(cover(sh, stream));
        }
        store_.unmap_idle(runs);
    }

    /// The fast path's free: a block of size class `c` given back for `bytes` on the stream whose
    /// key is `key`, kept in its class list when the shard still serves the stream and the list
    /// has room without allocating. False (nothing changed) otherwise: then give_back.
    [[nodiscard, gnu::always_inline]] bool give_back_class(shard& sh, stream_type stream, std::uintptr_t key,
                                                           std::uintptr_t address, std::size_t c, std::size_t bytes) noexcept {
        sh.mutex.lock(); // by hand: nothing in between throws, and a lock_guard is not always inlined
        if (!sh.serves(key) || !sh.classes.push_within_capacity(c, address)) [[unlikely]] {
            sh.mutex.unlock();
            return false;
        }
        if (sh.on_pushed(class_size(c), bytes)) [[unlikely]] cover(sh, stream);
        sh.mutex.unlock();
        return true;
    }

    /// For a stream without a shard: waits for the stream, then the block is idle and goes to the
    /// shared set (quarantined, and reported, when the wait fails).
    [[gnu::noinline]] void give_back_synchronously(stream_type stream, std::uintptr_t address, std::size_t size) noexcept {
        try {
            platform_type::synchronize(stream);
        } catch (...) {
            report_failure("stream_ordered_pool: synchronizing a stream to give a block back failed; the block is "
                           "quarantined");
            store_.quarantine(size);
            return;
        }
        store_.insert({address, size, 0});
    }

    // ---- a stream's own cache ----

    /// Moves a shard's size-class blocks into its spans, coalescing them, when they hold at least
    /// `threshold` bytes; records the event first when some are not covered (the spans hold only
    /// covered blocks). True when any moved.
    bool merge_classes(shard& sh, stream_type stream, std::size_t threshold) {
        std::lock_guard lock(sh.mutex);
        if (sh.class_bytes() < threshold) return false;
        const std::size_t count = sh.classes.count(which_blocks::all);
        if (count == 0) return false;
        // Sorted by address, blocks cut one after another from a span (a request's KV pages)
        // form runs that go into the tree as one block: one insert per run, not per block.
        std::vector<free_block> blocks;
        blocks.reserve(count); // may throw: nothing has moved yet
        if (sh.dirty(record_interval_) && !cover(sh, stream)) return false;
        sh.merge_classes(blocks, store_.chunks(), [&](std::size_t size) { store_.lose(size); });
        return true;
    }

    /// Merges every recent large block of `sh` into its spans, recording first when some are not
    /// covered (its lock held).
    void merge_recent(shard& sh, stream_type stream) noexcept {
        if (sh.recent.empty()) return;
        if (!sh.recent.all_covered() && !cover(sh, stream)) return;
        sh.merge_recent(sh.recent.size(), store_.chunks());
    }

    /// A block for `r` from this stream's own cache consolidated, before the pool grows:
    /// - for a small request, its size-class lists merged into its spans when they hold at least
    ///   `class_threshold` bytes (memory cached for other sizes then serves this one, and the lists
    ///   refill by that much between two merges), searched in its small spans only (its large spans
    ///   hold the rests of its large blocks' chunks, which a long-lived small block would pin);
    /// - for a large request, its recent large blocks merged into its spans;
    /// - then the shared set's free blocks beside its spans of the request's kind joined to them:
    ///   free space cut in two by the stream/shared boundary serves a request neither half can
    ///   (shared blocks are idle, so any stream may keep them);
    /// - when `either_kind` (the pool's initial size still holds everything), its spans of the other
    ///   kind too.
    /// 0 when none fits.
    std::uintptr_t take_consolidated(shard& sh, stream_type stream, request r, std::size_t class_threshold, bool either_kind) {
        if (r.small()) {
            merge_classes(sh, stream, class_threshold);
        } else {
            std::lock_guard lock(sh.mutex);
            merge_recent(sh, stream);
        }
        if (const std::uintptr_t a = take_span(sh, r.kind, r)) return a;
        if (adopt_shared_neighbours(sh, r.kind)) {
            if (const std::uintptr_t a = take_span(sh, r.kind, r)) return a;
        }
        if (!either_kind) return 0;
        std::lock_guard lock(sh.mutex);
        merge_recent(sh, stream);
        return sh.take_span(other(r.kind), r.size, r.alignment);
    }

    /// A block for `r` from this stream's spans of `kind`; 0 when none fits.
    std::uintptr_t take_span(shard& sh, block_kind kind, request r) {
        std::lock_guard lock(sh.mutex);
        return sh.take_span(kind, r.size, r.alignment);
    }

private:
    /// Moves the shared set's free blocks that touch the stream's own spans of `kind` into those
    /// spans, where they coalesce. True when any moved.
    bool adopt_shared_neighbours(shard& sh, block_kind kind) {
        std::vector<free_block> own;
        {
            std::lock_guard lock(sh.mutex);
            if (sh.spans[kind].empty()) return false;
            own.reserve(sh.spans[kind].count()); // may throw: nothing has moved yet
            sh.spans[kind].for_each([&](free_block b) {
                b.kind = kind;
                own.push_back(b);
            });
        }
        std::vector<free_block> taken;
        store_.take_neighbours(kind, own, taken);
        if (taken.empty()) return false;
        std::size_t kept = 0;
        {
            std::lock_guard lock(sh.mutex);
            for (; kept < taken.size(); ++kept) {
                try {
                    sh.spans[kind].insert(taken[kept]);
                } catch (const std::bad_alloc&) {
                    break;
                }
                sh.cached += taken[kept].size;
            }
        }
        for (std::size_t i = kept; i < taken.size(); ++i) store_.insert(taken[i]);
        return true;
    }

public:
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
                    sh->cached += t.tail.size;
                    in_spans = true;
                } catch (const std::bad_alloc&) {
                }
            }
            if (!in_spans) store_.insert(t.tail);
        }
        return reinterpret_cast<void*>(t.block.address);
    }

private:
    /// Takes up to `want` bytes (rounded up to granules of `unit`) of whole granules out of the
    /// spans of `sh` (its lock held; its event completed) into `runs`; returns the bytes. Stops
    /// early when there is no host memory for `runs`.
    std::size_t take_granules(shard& sh, std::size_t unit, std::size_t want, std::vector<address_run>& runs) noexcept {
        std::size_t done = 0;
        for (auto& set : sh.spans) {
            if (done >= want) break;
            try {
                runs.reserve(runs.size() + set.count()); // at most a run per block
            } catch (const std::bad_alloc&) {
                break;
            }
            const std::size_t n = set.take_whole(unit, want - done, [](const free_block&) { return false; },
                                                 [&](std::uintptr_t a, std::size_t bytes) { runs.push_back({a, bytes}); });
            sh.cached -= n;
            done += n;
        }
        return done;
    }

public:

    // ---- every stream ----

    /// Calls `f(shard&)` for every shard, in the order their streams were met.
    template <class F>
    void for_each(F&& f) const {
        table_.for_each(f);
    }
    /// The shards serving a stream now.
    [[nodiscard]] std::size_t size() const { return table_.serving(); }

    /// Adds every shard's call counts to `c`, and its cache to `p` (each shard's lock taken briefly).
    void add_to(pool_statistics& p, counters& c) const {
        table_.for_each([&](shard& sh) {
            std::lock_guard lock(sh.mutex);
            c += sh.totals();
            if (sh.key.load(std::memory_order_relaxed) == shard::no_stream) return; // retired
            p.per_stream.push_back({sh.key.load(std::memory_order_relaxed), sh.cached});
            p.stream_cached_bytes += sh.cached;
            p.largest_free_block = std::max(p.largest_free_block, sh.largest());
        });
    }

private:
    /// Records the shard's event on its stream (its lock held), so that it covers every block the
    /// shard holds; true when it does. If the record fails, the stream is synchronized instead (the
    /// blocks are then idle), and the failure reported. On a stream being captured (a capture the
    /// pool was not told of: it asks the platform, once per record) nothing is recorded and false is
    /// returned: an event recorded inside a capture cannot be queried nor waited for by other streams
    /// until it is recorded again, and the blocks stay with their stream meanwhile.
    [[gnu::noinline]] bool cover(shard& sh, stream_type stream) noexcept {
        if (capturing(stream)) [[unlikely]] {
            if (sh.to_record == 0) sh.to_record = 1; // counts on from the next free
            return false;
        }
        try {
            sh.event.record(stream);
        } catch (...) {
            try {
                platform_type::synchronize(stream);
                report_failure("stream_ordered_pool: recording a stream's event failed; synchronized the stream instead");
            } catch (...) {
                report_failure("stream_ordered_pool: recording a stream's event and synchronizing the stream failed");
            }
        }
        sh.on_recorded(record_interval_, record_threshold());
        return true;
    }

    /// Whether `stream` is being captured into a graph; true when the platform cannot tell (a
    /// legacy stream while a blocking stream captures answers with an error).
    static bool capturing(stream_type stream) noexcept {
        try {
            return platform_type::is_capturing(stream);
        } catch (...) {
            return true;
        }
    }

    /// Puts a block into its class list, or among the recent large blocks (its lock held). False
    /// when there is no host memory to hold it.
    [[gnu::always_inline]] bool store_in(shard& sh, stream_type stream, std::uintptr_t address, request r) noexcept {
        if (!r.small()) return store_large(sh, stream, address, r.size);
        try {
            sh.classes.push(r.size_class, address);
            return true;
        } catch (const std::bad_alloc&) {
            return false;
        }
    }
    /// store_in for a large block: among the recent ones (out of line: a tree insert may follow).
    [[gnu::noinline]] bool store_large(shard& sh, stream_type stream, std::uintptr_t address, std::size_t size) noexcept {
        try {
            // The spans hold covered blocks only.
            if (sh.recent.full() && sh.recent.covered() == 0 && !cover(sh, stream)) return false;
            sh.keep_recent({address, size, 0}, store_.chunks()); // its chunk is looked up when it leaves recent
            return true;
        } catch (const std::bad_alloc&) {
            return false;
        }
    }

    /// Whether `e` has completed; false when it cannot be asked.
    static bool idle(const typename platform_type::event& e) noexcept {
        try {
            return e.ready();
        } catch (...) {
            return false;
        }
    }
    /// Whether `e` can be queried and waited for: not last recorded inside a capture the pool was
    /// not told of (which would throw out of another stream's allocation).
    static bool usable(const typename platform_type::event& e) noexcept {
        try {
            static_cast<void>(e.ready());
            return true;
        } catch (...) {
            return false;
        }
    }

    /// The bytes given back since a stream's last record that make it record again:
    /// min(record_bytes, reserve / record_share), so that a stream that gives back another's
    /// blocks (a consumer) covers them before that stream (the producer) must grow the pool.
    [[nodiscard]] std::size_t record_threshold() const noexcept {
        return record_share_ == 0 ? record_bytes_ : std::min(record_bytes_, store_.reserved() / record_share_);
    }

    /// Waits for all work on the pool's device (every device, for a pool of no device). Blocks
    /// taken from a shard before this call are idle after it.
    void synchronize_devices() const {
        if (device_ >= 0) {
            platform_type::synchronize_device(device_);
        } else {
            for (int d = 0; d < platform_type::device_count(); ++d) platform_type::synchronize_device(d);
        }
    }

    std::size_t record_interval_; ///< >= 1
    std::size_t record_bytes_;
    std::size_t record_share_; ///< 0: record_bytes alone
    std::size_t release_threshold_; ///< pool_options::release_threshold for a pool that maps; SIZE_MAX otherwise
    int device_;
    event_pool<platform_type> events_;
    stream_table<shard> table_;
    shared_store<Upstream>& store_;
    activity_counters& activity_;
    peak_counter& peak_;
    mutable std::mutex sweep_mutex_; ///< serializes retire_idle; guards retired_
    counters retired_;               ///< the counts of retired shards
};

} // namespace custody::pool::detail
