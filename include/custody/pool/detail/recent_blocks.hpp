/// @file
/// `recent_blocks`: the large blocks a stream gave back most recently, kept aside so that a block
/// asked for again at the same size comes back in O(1), without touching the free trees.
#pragma once

#include <custody/pool/detail/free_set.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace custody::pool::detail {

/// Up to four large blocks, oldest first. A large block freed and asked for again at the same size
/// (an MLP activation from one layer to the next) is found here; older ones move into the
/// stream's free spans, where they coalesce, when newer ones push them out.
///
/// Invariants:
///   covered_ <= count_ <= capacity
///   blocks_[0, covered_) were given back before the shard's last event record (covered), the
///   others after it; a block's chunk and kind are filled in only when it leaves for the spans
/// Thread safety: none; the shard's lock guards it. Complexity: O(capacity) per call.
class recent_blocks {
public:
    static constexpr std::size_t capacity = 4;

    [[nodiscard]] std::size_t size() const noexcept { return count_; }
    [[nodiscard]] std::size_t covered() const noexcept { return covered_; }
    [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
    [[nodiscard]] bool full() const noexcept { return count_ == capacity; }
    [[nodiscard]] bool all_covered() const noexcept { return covered_ == count_; }

    /// The bytes of every block held.
    [[nodiscard]] std::size_t bytes() const noexcept {
        std::size_t n = 0;
        for (std::size_t i = 0; i < count_; ++i) n += blocks_[i].size;
        return n;
    }
    /// The bytes of the covered blocks.
    [[nodiscard]] std::size_t covered_bytes() const noexcept {
        std::size_t n = 0;
        for (std::size_t i = 0; i < covered_; ++i) n += blocks_[i].size;
        return n;
    }
    /// The largest block held; 0 when empty.
    [[nodiscard]] std::size_t largest() const noexcept {
        std::size_t n = 0;
        for (std::size_t i = 0; i < count_; ++i) n = std::max(n, blocks_[i].size);
        return n;
    }

    /// Appends a block given back now (not covered). Precondition: !full().
    void push(const free_block& b) noexcept { blocks_[count_++] = b; }

    /// The oldest block. Precondition: !empty().
    [[nodiscard]] const free_block& oldest() const noexcept { return blocks_[0]; }
    /// Removes the oldest block. Precondition: !empty().
    void pop_oldest() noexcept { erase(0, 1); }

    /// Takes a block of exactly `size` bytes starting at a multiple of `alignment`, the one at the
    /// lowest address when several fit (low addresses first keep the high ends of chunks free
    /// together); returns its address, or 0 when none fits.
    [[nodiscard]] std::uintptr_t take_exact(std::size_t size, std::size_t alignment) noexcept {
        std::size_t found = count_;
        for (std::size_t i = 0; i < count_; ++i) {
            const free_block& b = blocks_[i];
            if (b.size == size && (b.address & (alignment - 1)) == 0 &&
                (found == count_ || b.address < blocks_[found].address)) {
                found = i;
            }
        }
        if (found == count_) return 0;
        const std::uintptr_t address = blocks_[found].address;
        erase(found, 1);
        return address;
    }

    /// The shard's event was just recorded: every block held is covered.
    void cover() noexcept { covered_ = count_; }

    /// Removes the `n` oldest blocks (n <= size()), passing each to `f(const free_block&)`; `f` must
    /// not throw.
    template <class F>
    void take_oldest(std::size_t n, F&& f) noexcept {
        for (std::size_t i = 0; i < n; ++i) f(blocks_[i]);
        erase(0, n);
    }

private:
    /// Removes blocks_[first, first + n), keeping the order of the others and the covered prefix.
    void erase(std::size_t first, std::size_t n) noexcept {
        std::move(blocks_.begin() + static_cast<std::ptrdiff_t>(first + n),
                  blocks_.begin() + static_cast<std::ptrdiff_t>(count_),
                  blocks_.begin() + static_cast<std::ptrdiff_t>(first));
        count_ -= n;
        // Of the removed blocks, those in [first, min(first + n, covered_)) were covered.
        if (first < covered_) covered_ -= std::min(covered_, first + n) - first;
    }

    std::array<free_block, capacity> blocks_{};
    std::size_t count_ = 0;
    std::size_t covered_ = 0;
};

} // namespace custody::pool::detail
