/// @file
/// `class_lists`: a stream's free size-class blocks, one list per class, and which of them its last
/// event record covers. The one owner of the covered rule.
#pragma once

#include <custody/pool/detail/size_classes.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace custody::pool::detail {

/// One size class's free blocks in a shard, newest last.
///
/// Invariant (owner_epoch: the epoch of the class_lists that holds it):
///   epoch_ == owner_epoch => blocks_[0, min(covered_, size)) were given back before the owner's
///                            last record, the others after it
///   epoch_ != owner_epoch => every block was given back before the owner's last record
/// So a record costs O(1) for every list (the owner's epoch moves on), and a push or a pop touches
/// one half cache line.
/// Thread safety: none; the shard's lock guards it.
class alignas(32) class_list {
public:
    [[nodiscard]] std::size_t size() const noexcept { return blocks_.size(); }
    [[nodiscard]] bool empty() const noexcept { return blocks_.empty(); }

    /// Appends a block given back in epoch `owner_epoch`. Strong: a bad_alloc changes nothing.
    void push(std::uintptr_t address, std::uint32_t owner_epoch) {
        blocks_.push_back(address);
        if (epoch_ != owner_epoch) { // the first block since the last record: all before it are covered
            covered_ = static_cast<std::uint32_t>(blocks_.size() - 1);
            epoch_ = owner_epoch;
        }
    }

    /// Removes and returns the newest block when it starts at a multiple of `alignment`; 0 when the
    /// list is empty or that block is not so aligned. O(1).
    [[nodiscard]] std::uintptr_t pop(std::size_t alignment) noexcept {
        if (blocks_.empty() || (alignment > granule && (blocks_.back() & (alignment - 1)) != 0)) return 0;
        const std::uintptr_t address = blocks_.back();
        blocks_.pop_back();
        if (covered_ > blocks_.size()) covered_ = static_cast<std::uint32_t>(blocks_.size());
        return address;
    }

    /// How many of the blocks are covered (the oldest ones).
    [[nodiscard]] std::size_t covered(std::uint32_t owner_epoch) const noexcept {
        return epoch_ == owner_epoch ? std::min<std::size_t>(covered_, blocks_.size()) : blocks_.size();
    }

    /// The newest covered block when it starts at a multiple of `alignment`; 0 otherwise.
    [[nodiscard]] std::uintptr_t newest_covered(std::uint32_t owner_epoch, std::size_t alignment) const noexcept {
        const std::size_t k = covered(owner_epoch);
        if (k == 0) return 0;
        const std::uintptr_t address = blocks_[k - 1];
        return alignment > granule && (address & (alignment - 1)) != 0 ? 0 : address;
    }

    /// Removes and returns newest_covered(owner_epoch, alignment) (0: nothing removed). O(size)
    /// (an erase inside the list).
    [[nodiscard]] std::uintptr_t take_newest_covered(std::uint32_t owner_epoch, std::size_t alignment) noexcept {
        const std::uintptr_t address = newest_covered(owner_epoch, alignment);
        if (address == 0) return 0;
        const std::size_t k = covered(owner_epoch);
        blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(k - 1));
        if (epoch_ == owner_epoch) covered_ = static_cast<std::uint32_t>(k - 1);
        return address;
    }

    /// Passes the `count` oldest blocks to `f(address)` and removes them; those left (if any) came
    /// after the owner's last record. `f` must not throw.
    template <class F>
    void take_oldest(std::size_t count, std::uint32_t owner_epoch, F&& f) noexcept {
        for (std::size_t i = 0; i < count; ++i) f(blocks_[i]);
        blocks_.erase(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(count));
        covered_ = 0;
        epoch_ = owner_epoch;
    }

    /// After the owner's epoch wrapped to 1: no list may keep an epoch equal to the new one.
    void forget_epoch() noexcept { epoch_ = 0; }

private:
    std::vector<std::uintptr_t> blocks_;
    std::uint32_t covered_ = 0; ///< meaningful while epoch_ == the owner's epoch
    std::uint32_t epoch_ = 0;
};

/// A shard's lists, one per size class (list c holds blocks of class_size(c) bytes), and its
/// record epoch: the number of times the shard's event was recorded, wrapping.
///
/// Invariant: a block is covered (given back before the stream's event was last recorded, so idle
/// once that event completes) iff class_list::covered says so for the current epoch_.
/// Thread safety: none; the shard's lock guards it. Memory: about 4.6 KiB without blocks.
class class_lists {
public:
    /// Empty lists whose epoch starts at `first_epoch` (>= 1; the default is the shard's), so that
    /// the wrap can be reached in a test without 2^32 records.
    explicit class_lists(std::uint32_t first_epoch = 1) noexcept : epoch_(first_epoch), lists_{} {}

    /// Gives back a block of class `c`. Strong: a bad_alloc changes nothing.
    void push(std::size_t c, std::uintptr_t address) { lists_[c].push(address, epoch_); }
    /// Takes the newest block of class `c` when aligned (see class_list::pop); 0 otherwise.
    [[nodiscard]] std::uintptr_t pop(std::size_t c, std::size_t alignment) noexcept {
        return lists_[c].pop(alignment);
    }
    /// How many blocks of class `c` are covered.
    [[nodiscard]] std::size_t covered(std::size_t c) const noexcept { return lists_[c].covered(epoch_); }
    /// The newest covered block of class `c` when aligned; 0 otherwise.
    [[nodiscard]] std::uintptr_t newest_covered(std::size_t c, std::size_t alignment) const noexcept {
        return lists_[c].newest_covered(epoch_, alignment);
    }
    /// Takes the newest covered block of class `c` when aligned; 0 otherwise.
    [[nodiscard]] std::uintptr_t take_newest_covered(std::size_t c, std::size_t alignment) noexcept {
        return lists_[c].take_newest_covered(epoch_, alignment);
    }

    /// The shard's event was just recorded: every block held now is covered. O(1), but for one
    /// pass over the lists every 2^32 records (the epoch wraps).
    void on_record() noexcept {
        if (++epoch_ == 0) {
            for (auto& list : lists_) list.forget_epoch();
            epoch_ = 1;
        }
    }

    /// The number of blocks held: all of them, or the covered ones.
    [[nodiscard]] std::size_t count(bool covered_only) const noexcept {
        std::size_t n = 0;
        for (const auto& list : lists_) n += covered_only ? list.covered(epoch_) : list.size();
        return n;
    }

    /// Removes every block (or every covered one), passing each to `f(address, size)`; blocks left
    /// behind came after the last record. `f` must not throw.
    template <class F>
    void take(bool covered_only, F&& f) noexcept {
        for (std::size_t c = 0; c < class_count; ++c) {
            class_list& list = lists_[c];
            const std::size_t size = class_size(c);
            list.take_oldest(covered_only ? list.covered(epoch_) : list.size(), epoch_,
                             [&](std::uintptr_t address) { f(address, size); });
        }
    }

    /// The size of the largest class that holds a block; 0 when none does.
    [[nodiscard]] std::size_t largest() const noexcept {
        for (std::size_t c = class_count; c-- > 0;) {
            if (!lists_[c].empty()) return class_size(c);
        }
        return 0;
    }

private:
    /// >= 1: 1 + records so far, wrapping from 2^32 - 1 to 1 (see on_record). Before the lists, so
    /// that it shares a cache line with the shard's other hot fields.
    std::uint32_t epoch_;
    std::array<class_list, class_count> lists_;
};

} // namespace custody::pool::detail
