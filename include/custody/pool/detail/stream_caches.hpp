/// @file
/// `stream_caches`: the pool's front: a shard per stream, found without a lock, the common path
/// that pops and pushes the stream's own size-class blocks, and the stream's own careful reuse.
/// What moves between streams, or between a stream and the back end, is the seam's (seam.hpp).
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/platform/platform.hpp>
#include <custody/pool/detail/counters.hpp>
#include <custody/pool/detail/event_pool.hpp>
#include <custody/pool/detail/live_blocks.hpp>
#include <custody/pool/detail/live_counts.hpp>
#include <custody/pool/detail/request.hpp>
#include <custody/pool/detail/shard.hpp>
#include <custody/pool/detail/stream_table.hpp>
#include <custody/pool/pool_options.hpp>
#include <custody/pool/pool_statistics.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace custody::pool::detail {

/// The streams' caches of a pool over `Upstream` (the pool's front): a shard per stream, found
/// without a lock, and each stream's own reuse.
///
/// Stream semantics: a block given back on stream s is reusable at once on s; it leaves s only as
/// the seam decides (covered by s's event, see class_stacks and shard).
/// Thread safety: thread-safe; each shard's lock guards it, and the common path takes that lock
/// alone: it reads the index slot of its stream's key and writes only its shard's first line, one
/// hot stack and that stack's storage (no atomic but the lock, no counter another stream writes).
/// Ownership: owns the shards and their events; the pool outlives it.
template <stream_ordered_resource Upstream>
class stream_caches {
public:
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using shard = detail::shard<typename platform_type::event>;

    /// For a pool of `device` (-1: none) with validated `options`. Creates options.initial_events
    /// events (on `device`, or the current one), and throws what creating them throws.
    /// `map_granule`: the unit a pool that maps unmaps in (0: one that grows in chunks), which the
    /// shards' spans count whole units of.
    stream_caches(const pool_options& options, int device, std::size_t map_granule)
        : flags_(options.checked ? shard_head::checked_bit : 0), hot_blocks_(options.record_interval - 1),
          hot_bytes_(options.record_bytes), map_granule_(map_granule), device_(device),
          events_(device >= 0 ? device : platform_type::current_device(), options.initial_events, options.event_batch),
          table_(options.max_streams) {}
    stream_caches(const stream_caches&) = delete;
    stream_caches& operator=(const stream_caches&) = delete;

    // ---- the common path ----

    /// The key a stream's shard is found by (Platform::stream_key).
    [[nodiscard, gnu::always_inline]] static std::uintptr_t key_of(stream_type stream) {
        return platform_type::stream_key(stream);
    }

    /// The newest block of class_of(bytes) (bytes <= small_threshold, alignment at most the granule)
    /// on the hot stack of the stream whose key is `key`, into `p`; false when its shard is not in
    /// its index slot or the stack is empty. In a checked pool the block is recorded as live.
    [[nodiscard, gnu::always_inline]] bool pop_fast(std::uintptr_t key, std::size_t bytes, std::size_t alignment, void*& p) {
        return pop(table_.home(key), key, bytes, alignment, p);
    }
    /// Pushes a block of class_of(bytes) onto the hot stack of the stream whose key is `key`; false
    /// (nothing changed) when its shard is not in its index slot or the stack is full. In a checked
    /// pool the block is forgotten as live first; false too when it is not live as given back.
    [[nodiscard, gnu::always_inline]] bool push_fast(std::uintptr_t key, std::uintptr_t address, std::size_t bytes,
                                                     std::size_t alignment) noexcept {
        return push(table_.home(key), key, address, bytes, alignment);
    }
    /// pop_fast and push_fast for a pool whose index is off (it looks at every call, and is not
    /// checked): the same index slot, kept on.
    [[nodiscard, gnu::always_inline]] bool pop_found(std::uintptr_t key, std::size_t bytes, void*& p) {
        return pop(table_.any_home(key), key, bytes, granule, p);
    }
    [[nodiscard, gnu::always_inline]] bool push_found(std::uintptr_t key, std::uintptr_t address, std::size_t bytes) noexcept {
        return push(table_.any_home(key), key, address, bytes, granule);
    }
    /// Turns the common path on or off (see stream_table::set_fast).
    void enable_fast(bool on) { table_.set_fast(on); }

    /// Checked mode's record of the live blocks the careful way served (pool_options::checked);
    /// each shard keeps those its common path served.
    [[nodiscard]] live_blocks& live() noexcept { return live_; }
    /// Checked mode: makes room in the table of the shard of the stream whose key is `key` (if it
    /// has one) for one more block of its common path. Strong.
    void reserve_live(std::uintptr_t key) {
        shard* sh = table_.find(key);
        if (sh == nullptr) return;
        const std::lock_guard lock(sh->mutex);
        sh->live.reserve_one();
    }
    /// Checked mode: forgets the live block at `address` when (`bytes`, `alignment`) match its
    /// allocation, wherever it is recorded; false (nothing forgotten) otherwise.
    [[nodiscard]] bool forget_live(std::uintptr_t address, std::size_t bytes, std::size_t alignment) noexcept {
        if (live_.forget(address, bytes, alignment)) return true;
        bool found = false;
        table_.for_each([&](shard& sh) {
            if (found) return;
            const std::lock_guard lock(sh.mutex);
            found = sh.live.forget(address, bytes, alignment);
        });
        return found;
    }
    /// Checked mode: what is wrong with the deallocate `m` that forget_live refused (see
    /// live_blocks::misuse_of).
    template <class InChunk>
    [[nodiscard]] misuse misuse_of(misuse m, InChunk&& in_chunk) const noexcept {
        misuse found;
        table_.for_each([&](shard& sh) {
            const std::lock_guard lock(sh.mutex);
            if (const misuse f = sh.live.find(m.address); f.block != 0) found = f;
        });
        if (found.block == 0) return live_.misuse_of(m, in_chunk);
        m.kind = found.block == m.address ? misuse_kind::wrong_size : misuse_kind::interior_pointer;
        m.block = found.block;
        m.block_bytes = found.block_bytes;
        m.block_alignment = found.block_alignment;
        return m;
    }

private:
    [[nodiscard, gnu::always_inline]] bool pop(shard_head* head, std::uintptr_t key, std::size_t bytes, std::size_t alignment,
                                               void*& p) {
        if (!head->serves(key)) [[unlikely]] return false;
        auto& sh = static_cast<shard&>(*head);
        sh.mutex.lock(); // by hand: nothing in between throws, and a lock_guard is not always inlined
        std::uintptr_t address = 0;
        if (!sh.serves_locked(key) || !sh.classes.try_pop(classes_[(bytes - 1) / granule], address)) [[unlikely]] {
            return pop_checked(sh, key, bytes, alignment, p);
        }
        hand_out(sh, address, bytes, p);
        return true;
    }
    [[nodiscard, gnu::always_inline]] bool push(shard_head* head, std::uintptr_t key, std::uintptr_t address,
                                                std::size_t bytes, std::size_t alignment) noexcept {
        if (!head->serves(key)) [[unlikely]] return false;
        auto& sh = static_cast<shard&>(*head);
        sh.mutex.lock();
        if (!sh.serves_locked(key) || !sh.classes.try_push(classes_[(bytes - 1) / granule], address)) [[unlikely]] {
            return push_checked(sh, key, address, bytes, alignment);
        }
        sh.credit.add(bytes);
        sh.mutex.unlock();
        return true;
    }

    /// The end of a pop (the shard's lock held; released here): counted, the stream's credit spent
    /// (or the pool-wide total committed), the block handed out.
    [[gnu::always_inline]] void hand_out(shard& sh, std::uintptr_t address, std::size_t bytes, void*& p) {
        ++sh.pops;
        if (sh.credit.try_spend(bytes)) [[likely]] {
            sh.mutex.unlock();
        } else {
            counts_.commit_and_unlock(sh, sh.credit.overdrawn(bytes), each_shard());
        }
        p = reinterpret_cast<void*>(address);
    }
    /// pop's rare branch (the shard's lock held; released here): in a checked pool whose shard
    /// serves `key`, the pop recorded among the live blocks (when the record needs no allocation;
    /// else false, for the careful way to make room first); false otherwise.
    [[gnu::always_inline]] bool pop_checked(shard& sh, std::uintptr_t key, std::size_t bytes, std::size_t alignment, void*& p) {
        const std::size_t c = classes_[(bytes - 1) / granule];
        std::uintptr_t address = 0;
        if (sh.owner != (key | flags_) || flags_ == 0 || !sh.classes.try_pop(c, address)) {
            sh.mutex.unlock();
            return false;
        }
        if (!sh.live.try_add(address, bytes, alignment)) {
            static_cast<void>(sh.classes.try_push(c, address)); // back where it was
            sh.mutex.unlock();
            return false;
        }
        hand_out(sh, address, bytes, p);
        return true;
    }
    /// push's rare branch (the shard's lock held; released here): in a checked pool whose shard
    /// serves `key`, the push once the block is forgotten as live, as given back; false otherwise
    /// (the careful way then reports a misuse, or finds room).
    [[gnu::always_inline]] bool push_checked(shard& sh, std::uintptr_t key, std::uintptr_t address, std::size_t bytes,
                                        std::size_t alignment) noexcept {
        const std::size_t c = classes_[(bytes - 1) / granule];
        if (sh.owner != (key | flags_) || flags_ == 0 || sh.classes.hot_room(c) == 0 || !sh.live.forget(address, bytes, alignment)) {
            sh.mutex.unlock();
            return false;
        }
        static_cast<void>(sh.classes.try_push(c, address));
        sh.credit.add(bytes);
        sh.mutex.unlock();
        return true;
    }

public:
    // ---- finding a stream's shard, the careful way ----

    /// The shard of the stream whose key is `key`, made at its first use; nullptr when none can be
    /// had (every shard serves an active stream: see the seam's retire_idle). Throws
    /// std::invalid_argument for a stream of another device, and what making an event throws. The
    /// caller checks shard::serves(key) under the shard's lock (it may have been retired since).
    shard* shard_for(stream_type stream, std::uintptr_t key) {
        if (shard* sh = table_.find(key)) [[likely]] return sh;
        check_device(stream);
        return table_.find_or_create(key, [&](shard* reuse) {
            if (reuse == nullptr) {
                auto made = std::make_unique<shard>(key, flags_, events_.acquire(), hot_blocks_, hot_bytes_);
                for (auto& set : made->spans) set.count_whole(map_granule_); // what release_granules reads
                return made.release();
            }
            std::lock_guard lock(reuse->mutex);
            reuse->serve(key, flags_);
            return reuse;
        });
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

    // ---- the stream's own reuse, the careful way ----

    /// A block for `r` from the stream's own cache in O(1): its hot stack, refilled from its cold
    /// one after a miss (a size-class request at most granule-aligned), or a recent large block of
    /// exactly its size; counted. nullptr when none serves, or the shard no longer serves `key`.
    void* take_own(shard& sh, std::uintptr_t key, request r) {
        std::uintptr_t address = 0;
        std::size_t owed = 0;
        {
            std::lock_guard lock(sh.mutex);
            if (!sh.serves(key)) [[unlikely]] return nullptr; // retired since it was found
            if (!r.small()) {
                address = sh.take_recent(r.size, r.alignment);
            } else if (address = sh.classes.pop(r.size_class, r.alignment); address == 0) {
                if (r.alignment <= granule && sh.classes.refill_from_cold(r.size_class) != 0) {
                    address = sh.classes.pop(r.size_class, r.alignment);
                } else {
                    address = sh.classes.pop_cold(r.size_class, r.alignment);
                }
            }
            if (address == 0) return nullptr;
            owed = sh.on_allocated(r);
        }
        if (owed != 0) [[unlikely]] counts_.commit(owed, each_shard());
        return reinterpret_cast<void*>(address);
    }

    /// Counts an allocation of `r` served by the slow path for the stream of `sh` (nullptr: none).
    void count_taken(shard* sh, request r) noexcept {
        std::size_t owed = r.bytes;
        if (sh != nullptr) {
            std::lock_guard lock(sh->mutex);
            owed = sh->on_allocated(r);
        } else {
            counts_.slow().allocated(r.size, r.bytes);
        }
        if (owed != 0) counts_.commit(owed, each_shard());
    }
    /// Counts a block given back without a shard (a capturing stream, or one past max_streams).
    void count_given_without_shard(request r) noexcept { counts_.deallocated_slow(r); }

    /// A block for `r` from this stream's spans of `kind`; 0 when none fits.
    std::uintptr_t take_span(shard& sh, block_kind kind, request r) {
        std::lock_guard lock(sh.mutex);
        return sh.take_span(kind, r.size, r.alignment);
    }

    // ---- every stream ----

    /// Calls `f(shard&)` for every shard, in the order their streams were met.
    template <class F>
    void for_each(F&& f) const {
        table_.for_each(f);
    }
    /// The shards serving a stream now.
    [[nodiscard]] std::size_t size() const { return table_.serving(); }
    /// The shards made so far.
    [[nodiscard]] std::size_t made() const noexcept { return table_.size(); }

    /// Takes `sh` (its lock held, its blocks taken out) out of service: its counts go to the
    /// pool's totals, its credit back to the peak counter; it serves the next new stream. The caller
    /// then calls retired(sh, key) with no lock held.
    void retire_locked(shard& sh) noexcept {
        std::lock_guard sweep(sweep_mutex_);
        retired_ += sh.totals();
        retired_fast_ += sh.pops;
        counts_.counter().release(sh.credit.take_all()); // its live bytes stay counted, in retired_
        sh.counts = {};
        sh.credit = {};
        sh.pops = 0;
        sh.classes.forget_counts();
        sh.set_key(shard::no_stream);
    }
    /// The second half of retire_locked: the table gives `sh` (which served `key`) to the next stream.
    void retired(shard& sh, std::uintptr_t key) { table_.retire(&sh, key); }

    /// The pool's counts: the slow path's, every shard's (each lock taken briefly) and the retired
    /// shards'. When `p` is given, each shard's cache goes to it too.
    [[nodiscard]] counters totals(pool_statistics* p = nullptr) const {
        counters c = counts_.slow().load();
        table_.for_each([&](shard& sh) {
            std::lock_guard lock(sh.mutex);
            c += sh.totals();
            if (p == nullptr || sh.key.load(std::memory_order_relaxed) == shard::no_stream) return; // retired
            const std::size_t cached = sh.cached();
            p->per_stream.push_back({sh.key.load(std::memory_order_relaxed), cached});
            p->stream_cached_bytes += cached;
            p->largest_free_block = std::max(p->largest_free_block, sh.largest());
            p->fast_allocations += sh.pops;
        });
        std::lock_guard sweep(sweep_mutex_);
        c += retired_;
        if (p != nullptr) p->fast_allocations += retired_fast_;
        return c;
    }

    [[nodiscard]] live_counts<shard>& counts() noexcept { return counts_; }
    [[nodiscard]] std::size_t peak() const noexcept { return counts_.peak(); }
    [[nodiscard]] event_pool<platform_type>& events() noexcept { return events_; }
    [[nodiscard]] int device() const noexcept { return device_; }

    /// Calls f(shard&) for every shard (live_counts' passes over the streams).
    [[nodiscard]] auto each_shard() noexcept {
        return [this](auto&& f) { table_.for_each(f); };
    }

private:
    /// Throws std::invalid_argument when `stream` belongs to another device than the pool's.
    void check_device(stream_type stream) const {
        if (device_ < 0 || stream == stream_type{} || platform_type::stream_device(stream) == device_) return;
        throw std::invalid_argument("custody: stream of device " + std::to_string(platform_type::stream_device(stream)) +
                                    " used with a pool of device " + std::to_string(device_));
    }

    /// class_by_granule, here so that the common path finds it from the pool's address (no
    /// position-independent load of the table's address)
    const std::array<std::uint8_t, small_threshold / granule> classes_ = class_by_granule;
    std::uintptr_t flags_;   ///< shard_head::checked_bit in a checked pool (its shards' owner carries it), else 0
    std::size_t hot_blocks_; ///< record_interval - 1: the uncovered blocks a class's hot stack keeps
    std::size_t hot_bytes_;  ///< record_bytes: the bytes the hot stacks' caps may grow to
    std::size_t map_granule_;
    int device_;
    event_pool<platform_type> events_;
    stream_table<shard> table_;
    live_counts<shard> counts_; ///< live bytes = the shards' credit.live() + counts_.slow()'s
    live_blocks live_;          ///< checked mode: the blocks handed out
    mutable custody::detail::mutex sweep_mutex_; ///< guards retired_
    counters retired_;               ///< the counts of retired shards
    std::uint64_t retired_fast_ = 0; ///< their common-path allocations
};

} // namespace custody::pool::detail
