/// @file
/// `live_blocks`: the blocks a checked pool has handed out, by address, so that a deallocate that
/// matches none (a double free, an interior or foreign pointer, a wrong size) is found before it
/// changes anything.
#pragma once

#include <custody/core/failure_callback.hpp>
#include <custody/pool/detail/size_classes.hpp>
#include <custody/pool/detail/spin_mutex.hpp>
#include <custody/pool/pool_misuse.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

namespace custody::pool::detail {

/// The live blocks of one stream's shard in a checked pool, that its common path served: an
/// open-addressing table keyed by a block's start with its alignment (at most the granule) in the
/// low bits the granule leaves free, and its requested bytes, so that a pair records and forgets
/// under the lock its shard already holds, with no allocation while the table has room.
///
/// Invariants: capacity_ is 0 or a power of two >= 16; 2 * count_ <= capacity_; each record is
/// one slot (key != 0), found by probing linearly from slot_of(key) without passing an empty slot.
/// Thread safety: none; the shard's lock guards it. Memory: 16 bytes a slot.
class live_table {
public:
    live_table() = default;
    live_table(const live_table&) = delete;
    live_table& operator=(const live_table&) = delete;

    /// Records a block at `address` handed out for (`bytes`, `alignment` <= granule); false when the
    /// table would have to grow (reserve first).
    [[nodiscard, gnu::always_inline]] bool try_add(std::uintptr_t address, std::size_t bytes, std::size_t alignment) noexcept {
        if (2 * (count_ + 1) > capacity_) [[unlikely]] return false;
        const std::uintptr_t k = address | (alignment - 1);
        std::size_t i = slot_of(k);
        while (slots_[i].key != 0) i = (i + 1) & (capacity_ - 1);
        slots_[i] = {k, bytes};
        ++count_;
        return true;
    }
    /// Makes room for one more record. Strong.
    void reserve_one() {
        if (2 * (count_ + 1) > capacity_) grow();
    }
    /// Forgets the block at `address` when it was recorded for (`bytes`, `alignment`); false (nothing
    /// changed) otherwise.
    [[nodiscard, gnu::always_inline]] bool forget(std::uintptr_t address, std::size_t bytes, std::size_t alignment) noexcept {
        if (capacity_ == 0 || alignment - 1 >= granule) [[unlikely]] return false;
        const std::uintptr_t k = address | (alignment - 1);
        for (std::size_t i = slot_of(k); slots_[i].key != 0; i = (i + 1) & (capacity_ - 1)) {
            if (slots_[i].key != k) continue;
            if (slots_[i].bytes != bytes) return false;
            erase(i);
            return true;
        }
        return false;
    }
    /// The record of the block holding `address` (its start, bytes, alignment); a start of 0 when none.
    [[nodiscard]] misuse find(std::uintptr_t address) const noexcept {
        misuse m;
        for (std::size_t i = 0; i < capacity_; ++i) {
            const std::uintptr_t start = slots_[i].key & ~(granule - 1);
            if (slots_[i].key != 0 && start <= address && address < start + block_size(slots_[i].bytes)) {
                m.block = start;
                m.block_bytes = slots_[i].bytes;
                m.block_alignment = (slots_[i].key & (granule - 1)) + 1;
            }
        }
        return m;
    }
    [[nodiscard]] std::size_t size() const noexcept { return count_; }

private:
    struct slot {
        std::uintptr_t key = 0; ///< address | (alignment - 1); 0: empty
        std::size_t bytes = 0;
    };
    [[nodiscard]] std::size_t slot_of(std::uintptr_t k) const noexcept { return static_cast<std::size_t>(k >> 8) & (capacity_ - 1); }
    void erase(std::size_t i) noexcept {
        const std::size_t mask = capacity_ - 1;
        for (std::size_t j = (i + 1) & mask; slots_[j].key != 0; j = (j + 1) & mask) {
            const std::size_t home = slot_of(slots_[j].key);
            if (((j - home) & mask) >= ((j - i) & mask)) { // slot j may move to i
                slots_[i] = slots_[j];
                i = j;
            }
        }
        slots_[i] = slot{};
        --count_;
    }
    [[gnu::noinline]] void grow() {
        const std::size_t capacity = std::max<std::size_t>(16, 2 * capacity_);
        auto slots = std::make_unique<slot[]>(capacity);
        std::swap(slots, slots_);
        const std::size_t old = capacity_;
        capacity_ = capacity;
        for (std::size_t i = 0; i < old; ++i) {
            if (slots[i].key == 0) continue;
            std::size_t j = slot_of(slots[i].key);
            while (slots_[j].key != 0) j = (j + 1) & (capacity_ - 1);
            slots_[j] = slots[i];
        }
    }

    std::size_t capacity_ = 0;
    std::size_t count_ = 0;
    std::unique_ptr<slot[]> slots_;
};

/// The live blocks of a checked pool that its careful way served: an open-addressing table keyed by a block's start (linear
/// probing, erased by shifting back, so probes stay short without tombstones), so that a pair costs
/// three short critical sections (room made, block recorded, block forgotten) and no allocation.
///
/// Invariants (under mutex_; n = count_, p = pending_, c = capacity_):
///   c is 0 or a power of two >= 16; 2 * (n + p) <= c: the table is at most half full, room made
///   ahead for the p records reserved and not yet added
///   each live block is one slot (address != 0), found by probing from slot_of(address) without
///   passing an empty slot; no two slots hold one address
///   a slot's shape = bytes * 64 + log2(alignment): the allocation's request, 16 bytes a slot
/// Thread safety: thread-safe (one spin lock, taken with no other lock of the pool held).
/// Complexity: O(1) expected per add and forget; a refused deallocate scans the table (O(c)) to
/// tell an interior pointer from a double free, once per misuse.
class live_blocks {
public:
    /// Makes room for one more record (add). Call before the block is taken, so that a bad_alloc
    /// takes no block. Strong.
    [[gnu::always_inline]] void reserve_one() {
        mutex_.lock();
        if (2 * (count_ + pending_ + 1) > capacity_) [[unlikely]] {
            try {
                grow();
            } catch (...) {
                mutex_.unlock();
                throw;
            }
        }
        ++pending_;
        mutex_.unlock();
    }
    /// Drops a reservation the caller will not use (no block was taken).
    void unreserve() noexcept {
        const std::lock_guard lock(mutex_);
        --pending_;
    }

    /// Records, in the room reserve_one() made, a block handed out at `address` for (`bytes`,
    /// `alignment`). Allocates nothing.
    [[gnu::always_inline]] void add(std::uintptr_t address, std::size_t bytes, std::size_t alignment) noexcept {
        mutex_.lock();
        --pending_;
        insert(address, bytes, alignment);
        mutex_.unlock();
    }

    /// Forgets the block at `address` when (`bytes`, `alignment`) match its allocation; false, and
    /// nothing forgotten, otherwise (then misuse_of says what is wrong).
    [[nodiscard, gnu::always_inline]] bool forget(std::uintptr_t address, std::size_t bytes, std::size_t alignment) noexcept {
        mutex_.lock();
        if (capacity_ != 0) [[likely]] {
            for (std::size_t i = slot_of(address); slots_[i].address != 0; i = (i + 1) & (capacity_ - 1)) {
                if (slots_[i].address != address) continue;
                if (slots_[i].shape != shape(bytes, alignment)) break;
                erase(i);
                mutex_.unlock();
                return true;
            }
        }
        mutex_.unlock();
        return false;
    }

    /// What is wrong with a deallocate of `m` (address, bytes, alignment) that forget refused:
    /// a wrong size or alignment, an interior pointer, or else a double free (`in_chunk(address)`:
    /// the address lies in the pool's memory) or a foreign pointer.
    template <class InChunk>
    [[nodiscard]] misuse misuse_of(misuse m, InChunk&& in_chunk) const noexcept {
        {
            const std::lock_guard lock(mutex_);
            for (std::size_t i = 0; i < capacity_; ++i) {
                const slot& e = slots_[i];
                if (e.address == m.address) return with_block(m, misuse_kind::wrong_size, e);
            }
            for (std::size_t i = 0; i < capacity_; ++i) { // which block holds the pointer?
                const slot& e = slots_[i];
                if (e.address != 0 && e.address < m.address && m.address < e.address + block_size(e.shape >> 6)) {
                    return with_block(m, misuse_kind::interior_pointer, e);
                }
            }
        }
        m.kind = in_chunk(m.address) ? misuse_kind::double_free : misuse_kind::foreign_pointer;
        return m;
    }

    /// Reports `m`: to `on_misuse`, or else its describe() to custody::report_failure.
    static void report(const misuse& m, misuse_callback on_misuse) noexcept {
        if (on_misuse != nullptr) {
            on_misuse(m);
            return;
        }
        try {
            report_failure(m.describe());
        } catch (...) {
            report_failure("stream_ordered_pool: a deallocate that matches no live block was refused");
        }
    }

    [[nodiscard]] std::size_t size() const {
        const std::lock_guard lock(mutex_);
        return count_;
    }

private:
    struct slot {
        std::uintptr_t address = 0; ///< 0: an empty slot
        std::size_t shape = 0;      ///< bytes * 64 + log2(alignment), as allocated
    };

    [[nodiscard]] static std::size_t shape(std::size_t bytes, std::size_t alignment) noexcept {
        return bytes << 6 | static_cast<std::size_t>(std::countr_zero(alignment));
    }
    static misuse with_block(misuse m, misuse_kind kind, const slot& e) noexcept {
        m.kind = kind;
        m.block = e.address;
        m.block_bytes = e.shape >> 6;
        m.block_alignment = std::size_t{1} << (e.shape & 63);
        return m;
    }

    [[nodiscard]] std::size_t slot_of(std::uintptr_t address) const noexcept {
        // Blocks start on 256-byte boundaries, and a pool's blocks lie close together: neighbours
        // take neighbouring slots.
        return static_cast<std::size_t>(address >> 8) & (capacity_ - 1);
    }

    /// Records a block in a free slot (mutex_ held, room made).
    [[gnu::always_inline]] void insert(std::uintptr_t address, std::size_t bytes, std::size_t alignment) noexcept {
        std::size_t i = slot_of(address);
        while (slots_[i].address != 0) i = (i + 1) & (capacity_ - 1);
        slots_[i] = {address, shape(bytes, alignment)};
        ++count_;
    }

    /// Removes slot i, moving later slots of its probe run back so that no probe passes a hole.
    void erase(std::size_t i) noexcept {
        const std::size_t mask = capacity_ - 1;
        for (std::size_t j = (i + 1) & mask; slots_[j].address != 0; j = (j + 1) & mask) {
            const std::size_t home = slot_of(slots_[j].address);
            // Slot j may move to i when its home does not lie in (i, j] (cyclically).
            if (((j - home) & mask) >= ((j - i) & mask)) {
                slots_[i] = slots_[j];
                i = j;
            }
        }
        slots_[i] = slot{};
        --count_;
    }

    /// Doubles the table (at least 16 slots), rehashing every record. Strong.
    [[gnu::noinline]] void grow() {
        const std::size_t capacity = std::max<std::size_t>(16, 2 * capacity_);
        auto slots = std::make_unique<slot[]>(capacity);
        std::swap(slots, slots_);
        const std::size_t old = capacity_;
        capacity_ = capacity;
        for (std::size_t i = 0; i < old; ++i) {
            if (slots[i].address == 0) continue;
            std::size_t j = slot_of(slots[i].address);
            while (slots_[j].address != 0) j = (j + 1) & (capacity_ - 1);
            slots_[j] = slots[i];
        }
    }

    mutable spin_mutex mutex_;
    std::size_t capacity_ = 0;
    std::size_t count_ = 0;
    std::size_t pending_ = 0;
    std::unique_ptr<slot[]> slots_;
};

} // namespace custody::pool::detail
