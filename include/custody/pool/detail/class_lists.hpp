/// @file
/// `class_lists`: a stream's free size-class blocks, one list per class, and which of them its last
/// event record covers. The one owner of the covered rule.
#pragma once

#include <custody/pool/detail/size_classes.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace custody::pool::detail {

/// A block's entry in a class list: its address (a multiple of the granule) with, in the low bits
/// the granule leaves free, the tag of the record epoch it was given back in.
inline constexpr std::uintptr_t tag_mask = granule - 1;

/// Which of a stream's free blocks a call means.
enum class which_blocks : unsigned char {
    all,     ///< every block (the stream's own use, the last resort)
    covered, ///< those given back before the stream's last record: idle once its event completes
};

/// One size class's free blocks in a shard, newest last: a stack of tagged addresses in storage of
/// its own, so that a push or a pop on the pool's fast path is a few instructions on one line.
///
/// Invariants (tag: the owner's current epoch tag):
///   size_ <= capacity_; blocks_[0, size_) are the blocks, oldest first, each tagged with the
///   epoch it was given back in
///   the blocks given back since the owner's last record form the top of the stack and carry tag
///   covered(tag) = size_ - the length of the run of entries tagged `tag` at the top: every block
///   below that run was given back before the last record (the owner relabels its blocks before
///   a tag comes round again, see class_lists::on_record)
/// Thread safety: none; the shard's lock guards it.
class alignas(32) class_list {
public:
    class_list() noexcept = default;
    class_list(const class_list&) = delete;
    class_list& operator=(const class_list&) = delete;
    ~class_list() { delete[] blocks_; }

    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

    /// Appends a block given back in the epoch tagged `tag`. Strong: a bad_alloc changes nothing.
    void push(std::uintptr_t address, std::uintptr_t tag) {
        if (size_ == capacity_) grow();
        blocks_[size_++] = address | tag;
    }

    /// Makes room for `n` more blocks. Strong: a bad_alloc changes nothing.
    void reserve(std::size_t n) {
        while (capacity_ - size_ < n) grow();
    }

    /// The same when the list has room without allocating; false (nothing changed) otherwise.
    [[nodiscard, gnu::always_inline]] bool push_within_capacity(std::uintptr_t address, std::uintptr_t tag) noexcept {
        if (size_ == capacity_) [[unlikely]] return false;
        blocks_[size_++] = address | tag;
        return true;
    }

    /// Removes the newest block into `address`; false when the list is empty. O(1).
    [[nodiscard, gnu::always_inline]] bool try_pop(std::uintptr_t& address) noexcept {
        if (size_ == 0) [[unlikely]] return false;
        address = blocks_[--size_] & ~tag_mask;
        return true;
    }

    /// Labels every block with `tag` (at a record: every block is covered then).
    void relabel(std::uintptr_t tag) noexcept {
        for (std::uint32_t i = 0; i < size_; ++i) blocks_[i] = (blocks_[i] & ~tag_mask) | tag;
    }

    /// Removes and returns the newest block when it starts at a multiple of `alignment`; 0 when
    /// the list is empty or that block is not so aligned. O(1).
    [[nodiscard]] std::uintptr_t pop(std::size_t alignment) noexcept {
        std::uintptr_t address = 0;
        if (size_ == 0 || ((blocks_[size_ - 1] & ~tag_mask) & (alignment - 1)) != 0) return 0;
        return try_pop(address) ? address : 0;
    }

    /// How many of the blocks are covered (the oldest ones). O(blocks given back since the record).
    [[nodiscard]] std::size_t covered(std::uintptr_t tag) const noexcept {
        std::uint32_t k = size_;
        while (k != 0 && (blocks_[k - 1] & tag_mask) == tag) --k;
        return k;
    }

    /// The newest covered block when it starts at a multiple of `alignment`; 0 otherwise.
    [[nodiscard]] std::uintptr_t newest_covered(std::uintptr_t tag, std::size_t alignment) const noexcept {
        const std::size_t k = covered(tag);
        if (k == 0) return 0;
        const std::uintptr_t address = blocks_[k - 1] & ~tag_mask;
        return (address & (alignment - 1)) != 0 ? 0 : address;
    }

    /// Removes and returns newest_covered(tag, alignment) (0: nothing removed). O(size) (an erase
    /// inside the list).
    [[nodiscard]] std::uintptr_t take_newest_covered(std::uintptr_t tag, std::size_t alignment) noexcept {
        const std::uintptr_t address = newest_covered(tag, alignment);
        if (address == 0) return 0;
        const auto k = static_cast<std::uint32_t>(covered(tag));
        std::copy(blocks_ + k, blocks_ + size_, blocks_ + k - 1);
        --size_;
        return address;
    }

    /// Passes the `count` oldest blocks to `f(address)` and removes them. `f` must not throw.
    template <class F>
    void take_oldest(std::size_t count, F&& f) noexcept {
        for (std::size_t i = 0; i < count; ++i) f(blocks_[i] & ~tag_mask);
        std::copy(blocks_ + count, blocks_ + size_, blocks_);
        size_ -= static_cast<std::uint32_t>(count);
    }

private:
    /// Doubles the storage (at least 8 blocks). Strong: a bad_alloc changes nothing.
    [[gnu::noinline]] void grow() {
        const std::uint32_t capacity = capacity_ == 0 ? 8U : 2 * capacity_;
        auto* blocks = new std::uintptr_t[capacity];
        std::copy(blocks_, blocks_ + size_, blocks);
        delete[] blocks_;
        blocks_ = blocks;
        capacity_ = capacity;
    }

    std::uintptr_t* blocks_ = nullptr;
    std::uint32_t size_ = 0;
    std::uint32_t capacity_ = 0;
};

/// A shard's lists, one per size class (list c holds blocks of class_size(c) bytes), and its
/// record epoch: the number of times the shard's event was recorded (its tag: modulo 256).
///
/// Invariant: a block is covered (given back before the stream's event was last recorded, so idle
/// once that event completes) iff class_list::covered counts it for the current tag; no block
/// carries the current tag but those given back in the current epoch. A record is O(1) but once
/// every 128 records, which relabels every block held (all covered then) with a tag of the other
/// half of the 256, which the current tag does not reach before the next relabelling.
/// Thread safety: none; the shard's lock guards it. Memory: 2.3 KiB without blocks.
class class_lists {
public:
    /// Empty lists whose epoch starts at `first_epoch`, so that a test reaches the wraps without
    /// records.
    explicit class_lists(std::uint32_t first_epoch = 1) noexcept
        : epoch_(first_epoch), tag_(first_epoch & tag_mask), lists_{} {}

    /// Gives back a block of class `c`. Strong: a bad_alloc changes nothing.
    void push(std::size_t c, std::uintptr_t address) { lists_[c].push(address, tag_); }
    /// The same when list `c` has room without allocating; false (nothing changed) otherwise.
    [[nodiscard, gnu::always_inline]] bool push_within_capacity(std::size_t c, std::uintptr_t address) noexcept {
        return lists_[c].push_within_capacity(address, tag_);
    }
    /// Makes room in list `c` for `n` more blocks. Strong: a bad_alloc changes nothing.
    void reserve(std::size_t c, std::size_t n) { lists_[c].reserve(n); }
    /// Takes the newest block of class `c` (alignment at most the granule) into `address`; false
    /// when there is none.
    [[nodiscard, gnu::always_inline]] bool try_pop(std::size_t c, std::uintptr_t& address) noexcept {
        return lists_[c].try_pop(address);
    }
    /// Takes the newest block of class `c` when aligned (see class_list::pop); 0 otherwise.
    [[nodiscard]] std::uintptr_t pop(std::size_t c, std::size_t alignment) noexcept {
        return lists_[c].pop(alignment);
    }
    /// How many blocks of class `c` are covered.
    [[nodiscard]] std::size_t covered(std::size_t c) const noexcept { return lists_[c].covered(tag_); }
    /// How many blocks of class `c` `which` means (the oldest ones).
    [[nodiscard]] std::size_t count(std::size_t c, which_blocks which) const noexcept {
        return which == which_blocks::all ? lists_[c].size() : lists_[c].covered(tag_);
    }
    /// The newest covered block of class `c`, when aligned; 0 otherwise.
    [[nodiscard]] std::uintptr_t newest_covered(std::size_t c, std::size_t alignment) const noexcept {
        return lists_[c].newest_covered(tag_, alignment);
    }
    /// Takes newest_covered(c, alignment); 0 otherwise.
    [[nodiscard]] std::uintptr_t take_newest_covered(std::size_t c, std::size_t alignment) noexcept {
        return lists_[c].take_newest_covered(tag_, alignment);
    }

    /// The current epoch (records so far, from the first epoch, wrapping at 2^32).
    [[nodiscard]] std::uint32_t epoch() const noexcept { return epoch_; }

    /// The shard's event was just recorded: every block held now is covered. O(1) but once every
    /// 128 records (see the invariant).
    void on_record() noexcept {
        ++epoch_;
        tag_ = epoch_ & tag_mask;
        constexpr std::uintptr_t half = (tag_mask + 1) / 2;
        if ((tag_ & (half - 1)) == 0) {
            for (auto& list : lists_) list.relabel(tag_ ^ half);
        }
    }

    /// The number of blocks `which` means.
    [[nodiscard]] std::size_t count(which_blocks which) const noexcept {
        std::size_t n = 0;
        for (std::size_t c = 0; c < class_count; ++c) n += count(c, which);
        return n;
    }

    /// Removes the blocks `which` means, passing each to `f(address, size)`. `f` must not throw.
    template <class F>
    void take(which_blocks which, F&& f) noexcept {
        for (std::size_t c = 0; c < class_count; ++c) {
            const std::size_t size = class_size(c);
            lists_[c].take_oldest(count(c, which), [&](std::uintptr_t address) { f(address, size); });
        }
    }

    /// The bytes of every block held. O(classes).
    [[nodiscard]] std::size_t bytes() const noexcept {
        std::size_t n = 0;
        for (std::size_t c = 0; c < class_count; ++c) n += lists_[c].size() * class_size(c);
        return n;
    }

    /// The size of the largest class that holds a block; 0 when none does.
    [[nodiscard]] std::size_t largest() const noexcept {
        for (std::size_t c = class_count; c-- > 0;) {
            if (!lists_[c].empty()) return class_size(c);
        }
        return 0;
    }

private:
    /// Before the lists, so that they share a cache line with the shard's other hot fields.
    std::uint32_t epoch_;
    std::uintptr_t tag_; ///< epoch_ modulo 256 (< granule)
    std::array<class_list, class_count> lists_;
};

} // namespace custody::pool::detail
