/// @file
/// `live_blocks`: the blocks a checked pool has handed out, by address, so that a deallocate that
/// matches none (a double free, an interior or foreign pointer, a wrong size) is found before it
/// changes anything.
#pragma once

#include <custody/core/failure_callback.hpp>
#include <custody/pool/detail/probe_table.hpp>
#include <custody/pool/detail/size_classes.hpp>
#include <custody/pool/detail/spin_mutex.hpp>
#include <custody/pool/pool_misuse.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace custody::pool::detail {

/// The live blocks of one stream's shard in a checked pool, that its common path served: records
/// keyed by a block's start with its alignment (at most the granule) in the low bits the granule
/// leaves free, valued by its requested bytes, so that a pair records and forgets under the lock
/// its shard already holds, with no allocation while the table has room.
///
/// Invariants: the table is at most half full; one record a block the common path handed out.
/// Thread safety: none; the shard's lock guards it. Memory: 16 bytes a slot.
class live_table {
public:
    /// Records a block at `address` handed out for (`bytes`, `alignment` <= granule); false when the
    /// table would have to grow (reserve first).
    [[nodiscard, gnu::always_inline]] bool try_add(std::uintptr_t address, std::size_t bytes, std::size_t alignment) noexcept {
        if (!table_.fits(1)) [[unlikely]] return false;
        table_.insert(address | (alignment - 1), bytes);
        return true;
    }
    /// Makes room for one more record. Strong.
    void reserve_one() {
        if (!table_.fits(1)) table_.grow();
    }
    /// Forgets the block at `address` when it was recorded for (`bytes`, `alignment`); false (nothing
    /// changed) otherwise.
    [[nodiscard, gnu::always_inline]] bool forget(std::uintptr_t address, std::size_t bytes, std::size_t alignment) noexcept {
        if (alignment - 1 >= granule) [[unlikely]] return false;
        const std::size_t i = table_.find(address | (alignment - 1));
        if (i == probe_table::npos || table_.at(i).value != bytes) return false;
        table_.erase(i);
        return true;
    }
    /// The record of the block holding `address` (its start, bytes, alignment); a start of 0 when none.
    [[nodiscard]] misuse find(std::uintptr_t address) const noexcept {
        misuse m;
        for (std::size_t i = 0; i < table_.capacity(); ++i) {
            const probe_table::slot& e = table_.at(i);
            const std::uintptr_t start = e.key & ~(granule - 1);
            if (e.key != 0 && start <= address && address < start + block_size(e.value)) {
                m.block = start;
                m.block_bytes = e.value;
                m.block_alignment = (e.key & (granule - 1)) + 1;
            }
        }
        return m;
    }
    [[nodiscard]] std::size_t size() const noexcept { return table_.size(); }

private:
    probe_table table_;
};

/// The live blocks of a checked pool that its careful way served: records keyed by a block's start
/// (probe_table), so that a pair costs three short critical sections (room made, block recorded,
/// block forgotten) and no allocation.
///
/// Invariants (under mutex_; n = table_.size(), p = pending_, c = table_.capacity()):
///   2 * (n + p) <= c: the table is at most half full, room made ahead for the p records reserved
///   and not yet added; no two records hold one address
///   a record's value = bytes * 64 + log2(alignment): the allocation's request, 16 bytes a slot
/// Thread safety: thread-safe (one spin lock, taken with no other lock of the pool held).
/// Complexity: O(1) expected per add and forget; a refused deallocate scans the table (O(c)) to
/// tell an interior pointer from a double free, once per misuse.
class live_blocks {
public:
    /// Makes room for one more record (add). Call before the block is taken, so that a bad_alloc
    /// takes no block. Strong.
    [[gnu::always_inline]] void reserve_one() {
        mutex_.lock();
        if (!table_.fits(pending_ + 1)) [[unlikely]] {
            try {
                table_.grow();
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
        table_.insert(address, shape(bytes, alignment));
        mutex_.unlock();
    }

    /// Forgets the block at `address` when (`bytes`, `alignment`) match its allocation; false, and
    /// nothing forgotten, otherwise (then misuse_of says what is wrong).
    [[nodiscard, gnu::always_inline]] bool forget(std::uintptr_t address, std::size_t bytes, std::size_t alignment) noexcept {
        mutex_.lock();
        const std::size_t i = table_.find(address);
        const bool found = i != probe_table::npos && table_.at(i).value == shape(bytes, alignment);
        if (found) table_.erase(i);
        mutex_.unlock();
        return found;
    }

    /// What is wrong with a deallocate of `m` (address, bytes, alignment) that forget refused:
    /// a wrong size or alignment, an interior pointer, or else a double free (`in_chunk(address)`:
    /// the address lies in the pool's memory) or a foreign pointer.
    template <class InChunk>
    [[nodiscard]] misuse misuse_of(misuse m, InChunk&& in_chunk) const noexcept {
        {
            const std::lock_guard lock(mutex_);
            const std::size_t at = table_.find(m.address);
            if (at != probe_table::npos) return with_block(m, misuse_kind::wrong_size, table_.at(at));
            for (std::size_t i = 0; i < table_.capacity(); ++i) { // which block holds the pointer?
                const probe_table::slot& e = table_.at(i);
                if (e.key != 0 && e.key < m.address && m.address < e.key + block_size(e.value >> 6)) {
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
        return table_.size();
    }

private:
    [[nodiscard]] static std::size_t shape(std::size_t bytes, std::size_t alignment) noexcept {
        return bytes << 6 | static_cast<std::size_t>(std::countr_zero(alignment));
    }
    static misuse with_block(misuse m, misuse_kind kind, const probe_table::slot& e) noexcept {
        m.kind = kind;
        m.block = e.key;
        m.block_bytes = e.value >> 6;
        m.block_alignment = std::size_t{1} << (e.value & 63);
        return m;
    }

    mutable spin_mutex mutex_;
    std::size_t pending_ = 0;
    probe_table table_;
};

} // namespace custody::pool::detail
