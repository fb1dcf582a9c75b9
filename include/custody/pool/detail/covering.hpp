/// @file
/// `covering`: the seam's half that decides when a stream's free blocks become other streams' to
/// take: the careful free (a stream's event is recorded when the hot stack of a block's class is
/// full, or large blocks given back reach the record limit, and the stack moves to the covered
/// side), the retirement of quiet streams' shards, and the release of a stream's idle granules.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/platform/capture.hpp>
#include <custody/platform/platform.hpp>
#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/shared_store.hpp>
#include <custody/pool/detail/stream_caches.hpp>
#include <custody/pool/pool_options.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

namespace custody::pool::detail {

/// Events and the covered rule for a pool over `Upstream`, between its front and its back end.
///
/// Stream semantics: a block given back on s is covered once s's event is recorded after it: when
/// the hot stack of its class is full (record_interval - 1 blocks), when the large bytes given back
/// since the last record reach min(record_bytes, reserve / record_share), when the recent large
/// blocks are all uncovered and one more comes, before a stream's blocks move to its spans, and
/// before its idle granules go. Only s's own calls record on s, so a destroyed stream never sees a
/// record; nothing is recorded on a stream being captured (a capture the pool was not told of).
/// Thread safety: thread-safe; a shard's lock, then (never both) the store's.
/// Ownership: refers to the pool's front, back end and counters, which outlive it.
template <stream_ordered_resource Upstream>
class covering {
public:
    using caches_type = stream_caches<Upstream>;
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using shard = typename caches_type::shard;

    covering(const pool_options& options, caches_type& front, shared_store<Upstream>& store, activity_counters& activity)
        : record_bytes_(options.record_bytes), record_share_(options.record_share),
          release_threshold_(store.map_granule() == 0 ? SIZE_MAX : options.release_threshold), front_(front),
          store_(store), activity_(activity) {}
    covering(const covering&) = delete;
    covering& operator=(const covering&) = delete;

    // ---- a stream's shard, made or retired ----

    /// The shard of `stream` (key `key`), made at its first use; when every shard serves a stream,
    /// the idle ones are retired first (retire_idle). nullptr when none can be had. Throws
    /// std::invalid_argument for a stream of another device, and what making an event throws.
    shard* shard_for(stream_type stream, std::uintptr_t key) {
        if (shard* sh = front_.shard_for(stream, key)) [[likely]] return sh;
        if (retire_idle(false) == 0 && retire_idle(true) == 0) return nullptr;
        return front_.shard_for(stream, key);
    }

    /// Retires the shards whose blocks are all idle: covered, and their event completed (a
    /// destroyed stream's, once its last event completed; a live stream's that has nothing
    /// pending): their blocks go to the shared set, and the shard serves the next new stream (a
    /// live stream whose shard went gets another at its next call). With `synchronizing` (when
    /// none was idle so), it synchronizes the device first and retires the shards that were given
    /// nothing back meanwhile. Runs when every shard serves a stream. Returns the shards retired.
    std::size_t retire_idle(bool synchronizing) {
        std::lock_guard sweep(sweep_mutex_);
        const basic_capture_mode_guard<platform_type> relaxed(capture_mode::relaxed); // an event query breaks no capture
        std::vector<std::uint64_t> frees; // with `synchronizing`: each shard's frees before the wait
        if (synchronizing) {
            frees.reserve(front_.made());
            front_.for_each([&](shard& sh) {
                std::lock_guard lock(sh.mutex);
                if (frees.size() < frees.capacity()) frees.push_back(sh.totals().deallocations);
            });
            try {
                synchronize_devices();
            } catch (...) {
                report_failure("stream_ordered_pool: synchronizing the device to retire a stream's shard failed");
                return 0;
            }
        }
        std::size_t retired = 0, index = 0;
        front_.for_each([&](shard& sh) {
            const std::size_t i = index++;
            std::vector<free_block> blocks;
            std::uintptr_t key = shard::no_stream;
            {
                std::lock_guard lock(sh.mutex);
                key = sh.key.load(std::memory_order_relaxed);
                const bool all_idle = synchronizing ? i < frees.size() && frees[i] == sh.totals().deallocations
                                                    : !sh.dirty() && idle(sh.event);
                if (key == shard::no_stream || sh.slow_users != 0 || !all_idle) return;
                blocks = sh.take_blocks(which_blocks::all); // may throw: nothing taken
                front_.retire_locked(sh);
            }
            store_.insert_runs(blocks);
            front_.retired(sh, key);
            ++retired;
        });
        activity_.retired.fetch_add(retired, std::memory_order_relaxed);
        return retired;
    }

    /// Waits until every cached block is idle: each stream's event, and the device when some
    /// blocks are not covered. Reports failures, unless the process is exiting (the pool's end).
    void wait_all() noexcept {
        bool uncovered = false;
        front_.for_each([&](shard& sh) {
            uncovered = uncovered || sh.dirty();
            run_exit_tolerant<platform_type>("stream_ordered_pool: waiting for a stream's event at destruction",
                                             [&] { sh.event.synchronize(); });
        });
        if (!uncovered) return;
        run_exit_tolerant<platform_type>("stream_ordered_pool: synchronizing the device at destruction",
                                         [&] { synchronize_devices(); });
    }

    // ---- giving back, the careful way ----

    /// Gives a block back on `stream` (key `key`): kept in its shard (see keep), or, for a stream
    /// without one (another device's, or past max_streams), in the shared set once the stream has
    /// finished its work. Counted.
    void give_back(stream_type stream, std::uintptr_t key, std::uintptr_t address, request r) noexcept {
        for (;;) {
            shard* sh = shard_for_free(stream, key);
            if (sh == nullptr) return give_back_synchronously(stream, address, r);
            if (keep(*sh, stream, key, address, r)) return;
        }
    }

    /// Keeps a block given back on the shard's stream: on its class's hot stack, or among the
    /// recent large blocks; counts it lost when there is no host memory to hold it. False,
    /// changing nothing, when the shard no longer serves the stream.
    bool keep(shard& sh, stream_type stream, std::uintptr_t key, std::uintptr_t address, request r) noexcept {
        bool stored = false;
        {
            std::lock_guard lock(sh.mutex);
            if (!sh.serves(key)) [[unlikely]] return false;
            stored = r.small() ? keep_class(sh, stream, address, r.size_class) : keep_large(sh, stream, address, r.size);
            sh.on_deallocated(r);
        }
        if (!stored) store_.lose(r.size);
        if (release_threshold_ != SIZE_MAX && !r.small()) release_granules(sh, stream, key);
        return true;
    }

    /// Records the shard's event on its stream (its lock held): the recent blocks and the spans are
    /// covered, and with `flush` every hot size-class block moves to the cold side, covered; true
    /// when recorded. If the record fails, the stream is synchronized instead (the blocks are then
    /// idle), and the failure reported. On a stream being captured (a capture the pool was not told
    /// of: asked once per record) nothing is recorded and false is returned: an event recorded in a
    /// capture cannot be queried nor waited for by other streams until it is recorded again.
    [[gnu::noinline]] bool cover(shard& sh, stream_type stream, bool flush = false) noexcept {
        if (capturing(stream)) [[unlikely]] return false;
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
        sh.on_recorded();
        if (flush) {
            try {
                sh.classes.flush();
            } catch (const std::bad_alloc&) { // those of the class it stopped at stay hot: covered later
            }
        }
        return true;
    }

    /// For a pool that maps with a release threshold (pool_options::release_threshold): the wholly
    /// free granules the stream holds beyond the threshold go back to the device as its large blocks
    /// come back, once its event says that no work uses them. The event the stream recorded last is
    /// asked first (its covered blocks go if it has completed), then recorded again when blocks
    /// came back since, so that a busy stream's memory goes at its next large free after the work.
    [[gnu::noinline]] void release_granules(shard& sh, stream_type stream, std::uintptr_t key) noexcept {
        std::vector<address_run> runs;
        {
            std::lock_guard lock(sh.mutex);
            if (!sh.serves(key)) return;
            if (idle(sh.event)) {
                sh.merge_recent(sh.recent.covered(), store_.chunks());
                const std::size_t whole = sh.spans[block_kind::small].whole_bytes() + sh.spans[block_kind::large].whole_bytes();
                if (whole > release_threshold_) take_granules(sh, whole - release_threshold_, runs);
            }
            if (sh.uncovered_bytes != 0 || !sh.recent.all_covered()) static_cast<void>(cover(sh, stream));
        }
        store_.unmap_idle(runs);
    }

    /// Takes up to `want` bytes (rounded up to granules) of whole granules out of the spans of `sh`
    /// (its lock held; its event completed) into `runs`; returns the bytes. Stops early when there
    /// is no host memory for `runs`.
    std::size_t take_granules(shard& sh, std::size_t want, std::vector<address_run>& runs) noexcept {
        std::size_t done = 0;
        for (auto& set : sh.spans) {
            if (done >= want) break;
            try {
                runs.reserve(runs.size() + set.count()); // at most a run per block
            } catch (const std::bad_alloc&) {
                break;
            }
            done += set.take_whole(store_.map_granule(), want - done, [](const free_block&) { return false; },
                                   [&](std::uintptr_t a, std::size_t bytes) { runs.push_back({a, bytes}); });
        }
        return done;
    }

    // ---- events ----

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
    /// Waits for all work on the pool's device (every device, for a pool of no device). Blocks
    /// taken from a shard before this call are idle after it.
    void synchronize_devices() const {
        if (front_.device() >= 0) {
            platform_type::synchronize_device(front_.device());
        } else {
            for (int d = 0; d < platform_type::device_count(); ++d) platform_type::synchronize_device(d);
        }
    }

private:
    /// shard_for for deallocate: nullptr for a stream of another device (served without a shard,
    /// as documented), and when no shard can be had (reported).
    shard* shard_for_free(stream_type stream, std::uintptr_t key) noexcept {
        try {
            return shard_for(stream, key);
        } catch (const std::invalid_argument&) {
            return nullptr;
        } catch (...) {
            report_failure("stream_ordered_pool: no shard could be made for a stream; its block is given back "
                           "after the stream finishes");
            return nullptr;
        }
    }

    /// For a stream without a shard: waits for the stream, then the block is idle and goes to the
    /// shared set (quarantined, and reported, when the wait fails).
    [[gnu::noinline]] void give_back_synchronously(stream_type stream, std::uintptr_t address, request r) noexcept {
        front_.count_given_without_shard(r);
        try {
            platform_type::synchronize(stream);
        } catch (...) {
            report_failure("stream_ordered_pool: synchronizing a stream to give a block back failed; the block is "
                           "quarantined");
            store_.quarantine(r.size);
            return;
        }
        store_.insert({address, r.size, 0});
    }

    /// A size-class block given back (the shard's lock held): on its hot stack while there is room;
    /// else the stream's event is recorded and the class's hot stack (a consumer's: every class's)
    /// and the block go to its cold stack, covered; on a capturing stream (no record) the hot stack
    /// holds it beyond its cap.
    /// False when there is no host memory to hold it.
    bool keep_class(shard& sh, stream_type stream, std::uintptr_t address, std::size_t c) noexcept {
        if (sh.classes.push(c, address)) [[likely]] return true;
        try {
            // A consumer (it gives back more than it allocates: another stream's blocks) keeps none
            // for itself: every class is covered at once.
            if (!cover(sh, stream, sh.credit.live() < 0)) return sh.classes.push_beyond_cap(c, address);
            sh.classes.flush(c);
            sh.classes.push_cold(c, &address, 1);
            return true;
        } catch (const std::bad_alloc&) {
            return sh.classes.push_beyond_cap(c, address);
        }
    }
    /// A large block given back (the shard's lock held): among the recent ones; the event is recorded
    /// when they are all uncovered and full (the spans hold covered blocks only) or the large bytes
    /// given back since the last record reach the record limit.
    [[gnu::noinline]] bool keep_large(shard& sh, stream_type stream, std::uintptr_t address, std::size_t size) noexcept {
        try {
            if (sh.recent.full() && sh.recent.covered() == 0 && !cover(sh, stream)) return false;
            sh.keep_recent({address, size, 0}, store_.chunks()); // its chunk is looked up when it leaves recent
        } catch (const std::bad_alloc&) {
            return false;
        }
        sh.uncovered_bytes += size;
        if (sh.uncovered_bytes >= record_threshold()) static_cast<void>(cover(sh, stream));
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

    /// The large bytes given back since a stream's last record that make it record again:
    /// min(record_bytes, reserve / record_share), so that a stream that gives back another's
    /// blocks (a consumer) covers them before that stream (the producer) must grow the pool.
    [[nodiscard]] std::size_t record_threshold() const noexcept {
        return record_share_ == 0 ? record_bytes_ : std::min(record_bytes_, store_.reserved() / record_share_);
    }

    std::size_t record_bytes_;
    std::size_t record_share_;      ///< 0: record_bytes alone
    std::size_t release_threshold_; ///< pool_options::release_threshold for a pool that maps; SIZE_MAX otherwise
    caches_type& front_;
    shared_store<Upstream>& store_;
    activity_counters& activity_;
    custody::detail::mutex sweep_mutex_; ///< serializes retire_idle
};

} // namespace custody::pool::detail
