/// @file
/// `stream_table`: the pool's shards by stream key, found without a lock on the common path (one
/// load from a direct-mapped index), and given to a new stream once their own stream has gone quiet.
#pragma once

#include <custody/core/detail/mutex.hpp>

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace custody::pool::detail {

/// Up to `capacity` shards, each serving one stream key at a time: an open-addressing table probed
/// without a lock, and every shard made so far. A shard whose stream went quiet can be retired
/// (its slot cleared) and later serve another key: shards are never destroyed before the table.
///
/// The common path looks in `home(key)` alone: the shard in slot key mod 256 of a direct-mapped
/// index, or a head that serves no stream (never null). A key whose slot another shard holds is
/// found by find(), the careful way.
///
/// Invariants (K(sh) = sh->key, a key no stream has for a retired shard):
///   size_ <= capacity_; slots_ = bit_ceil(2 * capacity_), so the table is at most half full
///   list_[0, size_) are the shards made so far; every one serving a stream is in exactly one slot,
///   found by probing linearly from slot_of(K), and every retired one is in spare_
///   a slot is a shard, empty (nullptr: probing stops) or a tombstone (a retired key: probing goes
///   on); no tombstone is directly followed by an empty slot (those become empty themselves)
///   all_[i] is &nobody_ or the first shard made serving a key k with k mod 256 = i;
///   home_[i] = (fast_ ? all_[i] : &nobody_)
/// Thread safety: find and for_each are lock-free (acquire loads of slots and keys published with
/// release stores); find_or_create and retire serialize on a mutex. A thread that found a shard
/// checks its key again under the shard's lock (retire changes it under that lock).
/// Complexity: find is O(1) expected while few streams were retired; O(slots) at worst.
template <class Shard>
class stream_table {
public:
    /// What a slot of the index holds: a shard, seen through its head.
    using head_type = typename Shard::head_type;

    explicit stream_table(std::size_t capacity)
        : capacity_(capacity), slots_(std::bit_ceil(capacity * 2)),
          table_(std::make_unique<std::atomic<Shard*>[]>(slots_)),
          list_(std::make_unique<std::atomic<Shard*>[]>(capacity)) {
        for (auto& h : home_) h.store(&nobody_, std::memory_order_relaxed);
        for (auto& h : all_) h.store(&nobody_, std::memory_order_relaxed);
    }
    stream_table(const stream_table&) = delete;
    stream_table& operator=(const stream_table&) = delete;
    ~stream_table() {
        for (std::size_t i = 0; i < size(); ++i) delete list_[i].load(std::memory_order_relaxed);
    }

    /// The head in the index slot of `key`: its shard when the head serves `key` (checked again
    /// under the shard's lock); never null. One load. While the index is off (set_fast), no slot
    /// holds a shard.
    [[nodiscard, gnu::always_inline]] head_type* home(std::uintptr_t key) const noexcept {
        return home_[key & (home_slots - 1)].load(std::memory_order_acquire);
    }
    /// home(key), on whether the index is on or off (for a pool that looks at every call).
    [[nodiscard, gnu::always_inline]] head_type* any_home(std::uintptr_t key) const noexcept {
        return all_[key & (home_slots - 1)].load(std::memory_order_acquire);
    }

    /// The shard of `key`; nullptr when there is none. The first slot probed holds it unless two
    /// keys met there or a key was retired before it (then out of line). The caller checks the
    /// key again under the shard's lock.
    [[nodiscard, gnu::always_inline]] Shard* find(std::uintptr_t key) const noexcept {
        Shard* sh = table_[slot_of(key)].load(std::memory_order_acquire);
        if (sh != nullptr && sh != tombstone() && sh->key.load(std::memory_order_acquire) == key) [[likely]] return sh;
        return find_probing(key);
    }

private:
    /// find past its first slot: probes on until the key or an empty slot.
    [[gnu::noinline]] Shard* find_probing(std::uintptr_t key) const noexcept {
        for (std::size_t i = slot_of(key), probes = 0; probes < slots_; i = (i + 1) & (slots_ - 1), ++probes) {
            Shard* sh = table_[i].load(std::memory_order_acquire);
            if (sh == nullptr) return nullptr;
            if (sh != tombstone() && sh->key.load(std::memory_order_acquire) == key) return sh;
        }
        return nullptr;
    }

public:
    /// The shard of `key`, made by `make(reuse)` when there is none: `reuse` is a retired shard to
    /// give `key` to, or nullptr for a new one; `make` returns the shard (owned by the table from
    /// then on). nullptr when every shard serves a stream. What `make` throws propagates, with the
    /// table unchanged.
    template <class Make>
    Shard* find_or_create(std::uintptr_t key, Make&& make) {
        std::lock_guard lock(mutex_);
        std::size_t i = slot_of(key);
        std::size_t free_slot = slots_;
        for (std::size_t probes = 0; probes < slots_; i = (i + 1) & (slots_ - 1), ++probes) {
            Shard* sh = table_[i].load(std::memory_order_acquire);
            if (sh == nullptr) break;
            if (sh == tombstone()) {
                if (free_slot == slots_) free_slot = i;
            } else if (sh->key.load(std::memory_order_relaxed) == key) {
                return sh;
            }
        }
        if (free_slot == slots_) free_slot = i;
        const std::size_t n = size_.load(std::memory_order_relaxed);
        Shard* reuse = spare_.empty() ? nullptr : spare_.back();
        if (reuse == nullptr && n == capacity_) return nullptr;
        Shard* made = make(reuse);
        if (reuse != nullptr) {
            spare_.pop_back();
        } else {
            list_[n].store(made, std::memory_order_release);
            size_.store(n + 1, std::memory_order_release);
        }
        table_[free_slot].store(made, std::memory_order_release);
        for (auto* index : {&home_, &all_}) {
            auto& h = (*index)[key & (home_slots - 1)];
            if ((fast_ || index == &all_) && h.load(std::memory_order_relaxed) == &nobody_) h.store(made, std::memory_order_release);
        }
        return made;
    }

    /// Takes `sh` (whose key the caller changed to no stream's under its lock; it served `key`) out of the table,
    /// to serve another key later. Strong: a bad_alloc (the spare list) leaves it in.
    void retire(Shard* sh, std::uintptr_t key) {
        std::lock_guard lock(mutex_);
        spare_.reserve(spare_.size() + 1);
        for (std::size_t i = slot_of(key), probes = 0; probes < slots_; i = (i + 1) & (slots_ - 1), ++probes) {
            if (table_[i].load(std::memory_order_relaxed) != sh) continue;
            table_[i].store(tombstone(), std::memory_order_release);
            if (all_[key & (home_slots - 1)].load(std::memory_order_relaxed) == sh) index(key & (home_slots - 1), sh);
            // Tombstones right before an empty slot end no probe that could go further: empty them.
            for (std::size_t j = i; table_[(j + 1) & (slots_ - 1)].load(std::memory_order_relaxed) == nullptr &&
                                    table_[j].load(std::memory_order_relaxed) == tombstone();
                 j = (j - 1) & (slots_ - 1)) {
                table_[j].store(nullptr, std::memory_order_release);
            }
            spare_.push_back(sh);
            return;
        }
    }

    /// Turns the index on (the common path finds shards) or off (it finds none: a capture is
    /// routed, or the pool looks at every call).
    void set_fast(bool on) {
        std::lock_guard lock(mutex_);
        fast_ = on;
        for (std::size_t i = 0; i < home_slots; ++i) index(i, nullptr);
    }

    /// The shards made so far (those retired included).
    [[nodiscard]] std::size_t size() const noexcept { return size_.load(std::memory_order_acquire); }
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    /// The shards that serve a stream now.
    [[nodiscard]] std::size_t serving() const {
        std::lock_guard lock(mutex_);
        return size() - spare_.size();
    }

    /// Calls `f(Shard&)` for every shard made so far, retired ones included (their key is no stream's), in
    /// the order they were made (those made meanwhile may or may not be visited).
    template <class F>
    void for_each(F&& f) const {
        const std::size_t n = size();
        for (std::size_t i = 0; i < n; ++i) f(*list_[i].load(std::memory_order_acquire));
    }

private:
    [[nodiscard]] std::size_t slot_of(std::uintptr_t key) const noexcept {
        return static_cast<std::size_t>((static_cast<std::uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> 32) &
               (slots_ - 1);
    }
    /// A slot whose key was retired: probing goes on past it.
    [[nodiscard]] static Shard* tombstone() noexcept { return reinterpret_cast<Shard*>(alignof(Shard)); }

    /// Puts into index slot `i` the first shard made that serves a key of that slot, but `gone`
    /// (being retired), or nobody (mutex_ held).
    void index(std::size_t i, const Shard* gone) noexcept {
        head_type* next = &nobody_;
        for_each([&](Shard& sh) {
            const std::uintptr_t k = sh.key.load(std::memory_order_relaxed);
            if (next == &nobody_ && &sh != gone && k != head_type::no_stream && (k & (home_slots - 1)) == i) next = &sh;
        });
        all_[i].store(next, std::memory_order_release);
        home_[i].store(fast_ ? next : &nobody_, std::memory_order_release);
    }

    static constexpr std::size_t home_slots = 256;
    /// The head of no shard, in every index slot no shard holds.
    inline static constinit head_type nobody_{head_type::no_stream};

    std::array<std::atomic<head_type*>, home_slots> home_; ///< the common path's index
    std::array<std::atomic<head_type*>, home_slots> all_;  ///< the same, never off
    bool fast_ = true;                                    ///< the index is on; guarded by mutex_
    std::size_t capacity_;
    std::size_t slots_;
    std::unique_ptr<std::atomic<Shard*>[]> table_; ///< by key, open addressing
    std::unique_ptr<std::atomic<Shard*>[]> list_;  ///< list_[0, size_): in the order made
    std::atomic<std::size_t> size_{0};
    mutable custody::detail::mutex mutex_; ///< serializes creation and retirement
    std::vector<Shard*> spare_; ///< retired shards, guarded by mutex_
};

} // namespace custody::pool::detail
