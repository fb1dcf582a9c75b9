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

/// What the table reads of a shard: its stream's key, at the start of the shard (a shard type
/// derives from it).
struct keyed {
    /// The key no stream has: the key of the empty slots' placeholder.
    static constexpr std::uintptr_t no_key = UINTPTR_MAX;
    const std::uintptr_t key; ///< Platform::stream_key of the stream
};

/// Up to `capacity` shards (a `Shard` derives from `keyed`), each made once for a stream key and
/// kept until the table ends: an open-addressing table probed without a lock, and the list of
/// shards in the order their streams were met.
///
/// Invariants:
///   size_ <= capacity_; mask_ + 1 = bit_ceil(2 * capacity_) slots, so the table is at most half full
///   list_[0, size_) are the shards made so far, each in exactly one table slot, found by probing
///   linearly from slot_of(its key) = key & mask_; slots only fill (a shard is never removed)
///   an empty slot points to the placeholder (key no_key), never to nothing: a lookup reads a
///   slot and compares its key, with no test for an empty slot
/// Thread safety: find and for_each are lock-free and write nothing (acquire loads of slots
/// published with release stores); find_or_create serializes creation on a mutex. Ownership: owns
/// its shards.
/// Complexity: find is O(1) expected (the table is at most half full): on the common path one slot.
template <class Shard>
class stream_table {
public:
    explicit stream_table(std::size_t capacity)
        : capacity_(capacity), mask_(std::bit_ceil(capacity * 2) - 1),
          table_(std::make_unique<std::atomic<const keyed*>[]>(mask_ + 1)),
          list_(std::make_unique<std::atomic<Shard*>[]>(capacity)) {
        for (std::size_t i = 0; i <= mask_; ++i) table_[i].store(&placeholder, std::memory_order_relaxed);
    }
    stream_table(const stream_table&) = delete;
    stream_table& operator=(const stream_table&) = delete;
    ~stream_table() {
        for (std::size_t i = 0; i < size(); ++i) delete list_[i].load(std::memory_order_relaxed);
    }

    /// The shard of `key` (!= keyed::no_key); nullptr when there is none yet. The first slot
    /// probed holds it unless two keys met there (then out of line).
    [[nodiscard, gnu::always_inline]] Shard* find(std::uintptr_t key) const noexcept {
        const keyed* k = table_[slot_of(key)].load(std::memory_order_acquire);
        if (k->key == key) [[likely]] return static_cast<Shard*>(const_cast<keyed*>(k));
        return find_probing(key);
    }

    /// The shard of `key`, made by `make()` (returning a std::unique_ptr<Shard> whose key is `key`)
    /// when there is none; nullptr when the table is full or `key` is keyed::no_key. What `make`
    /// throws propagates, with the table unchanged.
    template <class Make>
    Shard* find_or_create(std::uintptr_t key, Make&& make) {
        if (key == keyed::no_key) return nullptr;
        std::lock_guard lock(mutex_);
        std::size_t i = slot_of(key);
        for (;; i = (i + 1) & mask_) {
            const keyed* k = table_[i].load(std::memory_order_relaxed);
            if (k == &placeholder) break;
            if (k->key == key) return static_cast<Shard*>(const_cast<keyed*>(k));
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
    static constexpr keyed placeholder{keyed::no_key};

    /// The key's own low bits: stream keys are the platforms' stream ids (cudaStreamGetId, the host
    /// streams' counter), handed out in sequence, so consecutive streams take consecutive slots
    /// (keys that collide probe on). No hash: the lookup is on every call.
    [[nodiscard]] std::size_t slot_of(std::uintptr_t key) const noexcept { return static_cast<std::size_t>(key) & mask_; }

    /// find past its first slot: probes on until the key or an empty slot.
    [[gnu::noinline]] Shard* find_probing(std::uintptr_t key) const noexcept {
        if (key == keyed::no_key) return nullptr;
        for (std::size_t i = slot_of(key), probes = 0; probes <= mask_; i = (i + 1) & mask_, ++probes) {
            const keyed* k = table_[i].load(std::memory_order_acquire);
            if (k == &placeholder) return nullptr;
            if (k->key == key) return static_cast<Shard*>(const_cast<keyed*>(k));
        }
        return nullptr;
    }

    std::size_t capacity_;
    std::size_t mask_; ///< slots - 1
    std::unique_ptr<std::atomic<const keyed*>[]> table_; ///< by key, open addressing
    std::unique_ptr<std::atomic<Shard*>[]> list_;        ///< list_[0, size_): in the order made
    std::atomic<std::size_t> size_{0};
    std::mutex mutex_; ///< serializes creation
};

} // namespace custody::pool::detail
