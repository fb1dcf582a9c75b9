/// @file
/// `probe_table`: an open-addressing table of (key, value) words, the one behind a checked pool's
/// tables of live blocks (live_blocks.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace custody::pool::detail {

/// Records of two words, keyed by a nonzero word whose bits above the eighth place it (a block's
/// start: blocks start on 256-byte boundaries, and a pool's blocks lie close together, so
/// neighbours take neighbouring slots). Linear probing; a record is erased by shifting the later
/// records of its probe run back, so probes stay short without tombstones. Room is the caller's to
/// make (fits, grow): insert allocates nothing.
///
/// Invariants: capacity_ is 0 or a power of two >= 16; each record is one slot (key != 0), found
/// by probing from home(key) without passing an empty slot; count_ = the slots with key != 0.
/// Thread safety: none; its owner's lock guards it. Memory: 16 bytes a slot.
class probe_table {
public:
    struct slot {
        std::uintptr_t key = 0; ///< 0: an empty slot
        std::size_t value = 0;
    };
    static constexpr std::size_t npos = ~std::size_t{0};

    probe_table() = default;
    probe_table(const probe_table&) = delete;
    probe_table& operator=(const probe_table&) = delete;

    /// Whether `n` more records keep the table at most half full.
    [[nodiscard, gnu::always_inline]] bool fits(std::size_t n) const noexcept { return 2 * (count_ + n) <= capacity_; }
    /// Records (key, value) in a free slot; room made (fits(1)).
    [[gnu::always_inline]] void insert(std::uintptr_t key, std::size_t value) noexcept {
        std::size_t i = home(key);
        while (slots_[i].key != 0) i = (i + 1) & (capacity_ - 1);
        slots_[i] = {key, value};
        ++count_;
    }
    /// The slot holding `key`, or npos.
    [[nodiscard, gnu::always_inline]] std::size_t find(std::uintptr_t key) const noexcept {
        if (capacity_ == 0) [[unlikely]] return npos;
        for (std::size_t i = home(key); slots_[i].key != 0; i = (i + 1) & (capacity_ - 1)) {
            if (slots_[i].key == key) return i;
        }
        return npos;
    }
    /// Removes slot i, moving later slots of its probe run back so that no probe passes a hole.
    void erase(std::size_t i) noexcept {
        const std::size_t mask = capacity_ - 1;
        for (std::size_t j = (i + 1) & mask; slots_[j].key != 0; j = (j + 1) & mask) {
            // Slot j may move to i when its home does not lie in (i, j] (cyclically).
            if (((j - home(slots_[j].key)) & mask) >= ((j - i) & mask)) {
                slots_[i] = slots_[j];
                i = j;
            }
        }
        slots_[i] = slot{};
        --count_;
    }
    /// Doubles the table (at least 16 slots), placing every record again. Strong.
    [[gnu::noinline]] void grow() {
        const std::size_t capacity = std::max<std::size_t>(16, 2 * capacity_);
        auto slots = std::make_unique<slot[]>(capacity);
        std::swap(slots, slots_);
        const std::size_t old = capacity_;
        capacity_ = capacity;
        count_ = 0;
        for (std::size_t i = 0; i < old; ++i) {
            if (slots[i].key != 0) insert(slots[i].key, slots[i].value);
        }
    }

    [[nodiscard]] const slot& at(std::size_t i) const noexcept { return slots_[i]; }
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    [[nodiscard]] std::size_t size() const noexcept { return count_; }

private:
    [[nodiscard]] std::size_t home(std::uintptr_t key) const noexcept {
        return static_cast<std::size_t>(key >> 8) & (capacity_ - 1);
    }

    std::size_t capacity_ = 0;
    std::size_t count_ = 0;
    std::unique_ptr<slot[]> slots_;
};

} // namespace custody::pool::detail
