/// @file
/// `stream_table`: the pool's shards by stream key, found without a lock on the common path.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

namespace custody::pool::detail {

/// Up to `capacity` shards, each made once for a stream key and kept until the table ends: an
/// open-addressing table probed without a lock, and the list of shards in the order their streams
/// were met.
///
/// Invariants:
///   size_ <= capacity_; slots_ = bit_ceil(2 * capacity_), so the table is at most half full
///   list_[0, size_) are the shards made so far, each in exactly one table slot, found by probing
///   linearly from slot_of(its key); slots only fill (a shard is never removed)
/// Thread safety: find and for_each are lock-free (acquire loads of slots published with release
/// stores); find_or_create serializes creation on a mutex. Ownership: owns its shards.
/// Complexity: find is O(1) expected (the table is at most half full).
template <class Shard>
class stream_table {
public:
    explicit stream_table(std::size_t capacity)
        : capacity_(capacity), slots_(std::bit_ceil(capacity * 2)),
          table_(std::make_unique<std::atomic<Shard*>[]>(slots_)),
          list_(std::make_unique<std::atomic<Shard*>[]>(capacity)) {}
    stream_table(const stream_table&) = delete;
    stream_table& operator=(const stream_table&) = delete;
    ~stream_table() {
        for (std::size_t i = 0; i < size(); ++i) delete list_[i].load(std::memory_order_relaxed);
    }

    /// The shard of `key`; nullptr when there is none yet.
    [[nodiscard]] Shard* find(std::uintptr_t key) const noexcept {
        for (std::size_t i = slot_of(key), probes = 0; probes < slots_; i = (i + 1) & (slots_ - 1), ++probes) {
            Shard* sh = table_[i].load(std::memory_order_acquire);
            if (sh == nullptr) return nullptr;
            if (sh->key == key) return sh;
        }
        return nullptr;
    }

    /// The shard of `key`, made by `make()` (returning a std::unique_ptr<Shard> whose key is `key`)
    /// when there is none; nullptr when the table is full. What `make` throws propagates, with the
    /// table unchanged.
    template <class Make>
    Shard* find_or_create(std::uintptr_t key, Make&& make) {
        std::lock_guard lock(mutex_);
        std::size_t i = slot_of(key);
        for (;; i = (i + 1) & (slots_ - 1)) {
            Shard* sh = table_[i].load(std::memory_order_acquire);
            if (sh == nullptr) break;
            if (sh->key == key) return sh;
        }
        const std::size_t n = size_.load(std::memory_order_relaxed);
        if (n == capacity_) return nullptr;
        Shard* made = make().release();
        list_[n].store(made, std::memory_order_release);
        size_.store(n + 1, std::memory_order_release);
        table_[i].store(made, std::memory_order_release);
        return made;
    }

    /// The shards made so far.
    [[nodiscard]] std::size_t size() const noexcept { return size_.load(std::memory_order_acquire); }
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

    /// Calls `f(Shard&)` for every shard, in the order they were made (those made meanwhile may
    /// or may not be visited).
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

    std::size_t capacity_;
    std::size_t slots_;
    std::unique_ptr<std::atomic<Shard*>[]> table_; ///< by key, open addressing
    std::unique_ptr<std::atomic<Shard*>[]> list_;  ///< list_[0, size_): in the order made
    std::atomic<std::size_t> size_{0};
    std::mutex mutex_; ///< serializes creation
};

} // namespace custody::pool::detail
