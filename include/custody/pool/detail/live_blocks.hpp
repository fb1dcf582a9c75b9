/// @file
/// `live_blocks`: the blocks a checked pool has handed out, by address, so that a deallocate that
/// matches none (a double free, an interior or foreign pointer, a wrong size) is found before it
/// changes anything.
#pragma once

#include <custody/core/failure_callback.hpp>
#include <custody/pool/detail/spin_mutex.hpp>
#include <custody/pool/pool_misuse.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

namespace custody::pool::detail {

/// The live blocks of a checked pool: an open-addressing table keyed by a block's start (linear
/// probing, erased by shifting back, so probes stay short without tombstones), so that a pair costs
/// two short critical sections and no allocation on the common path.
///
/// Invariants (under mutex_; n = count_, p = pending_, c = capacity_):
///   c is 0 or a power of two >= 16; 2 * (n + p) <= c: the table is at most half full, room made
///   ahead for the p records reserved and not yet added
///   each live block is one slot (address != 0), found by probing from slot_of(address) without
///   passing an empty slot; no two slots hold one address
/// Thread safety: thread-safe (one spin lock, taken with no other lock of the pool held).
/// Complexity: O(1) expected per add and forget; a refused deallocate scans the table (O(c)) to
/// tell an interior pointer from a double free, once per misuse.
class live_blocks {
public:
    /// Makes room for one more record (add_reserved). Call before the block is taken, so that a
    /// bad_alloc takes no block. Strong.
    void reserve_one() {
        std::lock_guard lock(mutex_);
        if (2 * (count_ + pending_ + 1) > capacity_) grow();
        ++pending_;
    }
    /// Drops a reservation the caller will not use (no block was taken).
    void unreserve() noexcept {
        std::lock_guard lock(mutex_);
        --pending_;
    }

    /// Records, in the room reserve_one() made, a block of `size` bytes (its rounded size) handed
    /// out at `address` for (`bytes`, `alignment`). Allocates nothing.
    void add_reserved(std::uintptr_t address, std::size_t size, std::size_t bytes, std::size_t alignment) noexcept {
        std::lock_guard lock(mutex_);
        --pending_;
        std::size_t i = slot_of(address);
        while (slots_[i].address != 0) i = (i + 1) & (capacity_ - 1);
        slots_[i] = entry{address, size, bytes, alignment};
        ++count_;
    }

    /// What `take()` returns (a block of `size` bytes for `bytes` and `alignment`, or nullptr),
    /// recorded. The record's room is made first: a bad_alloc takes no block.
    template <class Take>
    [[nodiscard]] void* recorded(std::size_t size, std::size_t bytes, std::size_t alignment, Take&& take) {
        reserve_one();
        void* p = nullptr;
        try {
            p = take();
        } catch (...) {
            unreserve();
            throw;
        }
        if (p == nullptr) {
            unreserve();
        } else {
            add_reserved(reinterpret_cast<std::uintptr_t>(p), size, bytes, alignment);
        }
        return p;
    }

    /// remove(m, in_chunk), and the misuse found reported: to `on_misuse`, or else its describe()
    /// to custody::report_failure. True when the block was forgotten.
    template <class InChunk>
    bool forget(const misuse& m, InChunk&& in_chunk, misuse_callback on_misuse) noexcept {
        const std::optional<misuse> found = remove(m, in_chunk);
        if (!found) return true;
        report(*found, on_misuse);
        return false;
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

    /// Forgets the block at `m.address` when `m` (bytes, alignment) matches its allocation, and
    /// returns nothing; else returns `m` completed with what is wrong, and forgets nothing.
    /// `in_chunk(address)` tells whether an address lies in one of the pool's chunks.
    template <class InChunk>
    [[nodiscard]] std::optional<misuse> remove(misuse m, InChunk&& in_chunk) noexcept {
        {
            std::lock_guard lock(mutex_);
            if (capacity_ != 0) {
                for (std::size_t i = slot_of(m.address); slots_[i].address != 0; i = (i + 1) & (capacity_ - 1)) {
                    if (slots_[i].address != m.address) continue;
                    const entry& e = slots_[i];
                    if (e.bytes == m.bytes && e.alignment == m.alignment) [[likely]] {
                        erase(i);
                        return std::nullopt;
                    }
                    return with_block(m, misuse_kind::wrong_size, e);
                }
                for (std::size_t i = 0; i < capacity_; ++i) { // a misuse: which block holds the pointer?
                    const entry& e = slots_[i];
                    if (e.address != 0 && e.address < m.address && m.address < e.address + e.size) {
                        return with_block(m, misuse_kind::interior_pointer, e);
                    }
                }
            }
        }
        m.kind = in_chunk(m.address) ? misuse_kind::double_free : misuse_kind::foreign_pointer;
        return m;
    }

    [[nodiscard]] std::size_t size() const {
        std::lock_guard lock(mutex_);
        return count_;
    }

private:
    struct entry {
        std::uintptr_t address = 0; ///< 0: an empty slot
        std::size_t size = 0;       ///< the block's rounded size
        std::size_t bytes = 0;      ///< as allocated
        std::size_t alignment = 0;  ///< as allocated
    };

    static misuse with_block(misuse m, misuse_kind kind, const entry& e) noexcept {
        m.kind = kind;
        m.block = e.address;
        m.block_bytes = e.bytes;
        m.block_alignment = e.alignment;
        return m;
    }

    [[nodiscard]] std::size_t slot_of(std::uintptr_t address) const noexcept {
        // Blocks start on 256-byte boundaries: the multiply spreads the bits above them.
        return static_cast<std::size_t>((static_cast<std::uint64_t>(address >> 8) * 0x9E3779B97F4A7C15ULL) >> 32) &
               (capacity_ - 1);
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
        slots_[i] = entry{};
        --count_;
    }

    /// Doubles the table (at least 16 slots), rehashing every record. Strong.
    void grow() {
        const std::size_t capacity = std::max<std::size_t>(16, 2 * capacity_);
        auto slots = std::make_unique<entry[]>(capacity);
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
    std::unique_ptr<entry[]> slots_;
    std::size_t capacity_ = 0;
    std::size_t count_ = 0;
    std::size_t pending_ = 0;
};

} // namespace custody::pool::detail
