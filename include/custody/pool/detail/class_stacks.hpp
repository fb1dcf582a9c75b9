/// @file
/// `class_stacks`: a stream's free size-class blocks: per class a hot stack that the stream's own
/// calls push and pop on the common path, and a cold stack of the blocks its last event record
/// covers. The one owner of the covered rule for size-class blocks.
#pragma once

#include <custody/pool/detail/size_classes.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace custody::pool::detail {

/// Which of a stream's free blocks a call means.
enum class which_blocks : unsigned char {
    all,     ///< every block (the stream's own use, the last resort after a device synchronization)
    covered, ///< those given back before the stream's last record: idle once its event completes
};

/// One stream's free size-class blocks (class c holds blocks of class_size(c) bytes).
///
/// A block given back on the common path goes on its class's hot stack; when that stack is full,
/// the owner records the stream's event and moves the stack to the class's cold stack (flush): the
/// blocks there are covered, and other streams may take them once the event completes. A hot
/// block never leaves its stream but through the owner, or after the device is synchronized.
///
/// Invariants (for class c: hot = [bottom_[c], top_[c]), k = cold_[c], s = class_size(c)):
///   bottom_[c] <= top_[c] <= bottom_[c] + room_[c] (the storage); limit_[c] = bottom_[c] + cap_[c]
///   once the storage is made (all three null before); top_[c] <= limit_[c] but for blocks pushed
///   beyond the cap (push_beyond_cap)
///   1 <= cap_[c] <= most_ while most_ > 0; cap_[c] == 0 for every c when most_ == 0
///   used_ = sum over the classes whose storage is made of cap_[c] * s: a cap grows only while
///   used_ stays within budget_ (a class's first cap, at most max(256 KiB, s), is always given)
///   cold_bytes_ = sum over c of k.size * s
///   hot(c) = moved_[c] + the common path's pushes - its pops of class c: the common path counts
///   neither, fast_pushes and fast_block_bytes derive them
/// Thread safety: none; the shard's lock guards it.
/// Memory: 9 KiB without blocks; a hot stack holds at most `most` addresses, a cold one grows.
class class_stacks {
public:
    /// Stacks whose hot caps start at min(most, max(1, 256 KiB / size)) and grow on a miss up to
    /// `most` blocks, while all caps stay within `budget` bytes; `most` 0: no hot stacks (every
    /// block given back is covered at once). A hot stack's storage is made at its first use.
    class_stacks(std::size_t most, std::size_t budget) noexcept
        : most_(static_cast<std::uint32_t>(std::min<std::size_t>(most, 1U << 16))), budget_(budget) {
        for (std::size_t c = 0; c < class_count; ++c) {
            cap_[c] = most_ == 0 ? 0 : static_cast<std::uint32_t>(std::clamp<std::size_t>((256 << 10) / class_size(c), 1, most_));
        }
    }
    class_stacks(const class_stacks&) = delete;
    class_stacks& operator=(const class_stacks&) = delete;

    // ---- the common path: the stream's own blocks, under its lock ----

    /// The newest hot block of class `c` into `address`; false when there is none.
    [[nodiscard, gnu::always_inline]] bool try_pop(std::size_t c, std::uintptr_t& address) noexcept {
        std::uintptr_t* t = top_[c];
        if (t == bottom_[c]) [[unlikely]] return false;
        top_[c] = --t;
        address = *t;
        return true;
    }
    /// Pushes a block of class `c` onto its hot stack; false (nothing changed) when it is full.
    [[nodiscard, gnu::always_inline]] bool try_push(std::size_t c, std::uintptr_t address) noexcept {
        std::uintptr_t* t = top_[c];
        if (t >= limit_[c]) [[unlikely]] return false;
        *t = address;
        top_[c] = t + 1;
        return true;
    }

    // ---- the careful ways of the stream's own calls ----

    /// The newest hot block of class `c` when it starts at a multiple of `alignment`; 0 otherwise.
    [[nodiscard]] std::uintptr_t pop(std::size_t c, std::size_t alignment) noexcept {
        if (top_[c] == bottom_[c] || (top_[c][-1] & (alignment - 1)) != 0) return 0;
        --moved_[c];
        return *--top_[c];
    }
    /// Pushes a block of class `c` onto its hot stack (making its storage first); false when full.
    [[nodiscard]] bool push(std::size_t c, std::uintptr_t address) noexcept {
        if (bottom_[c] == nullptr && cap_[c] != 0) resize_hot(c, cap_[c]);
        if (!try_push(c, address)) return false;
        ++moved_[c];
        return true;
    }
    /// Pushes a block of class `c` onto its hot stack even when it is full (a stream that cannot
    /// record its event: see covering::keep_class); the common path still sees the stack full.
    /// False on a bad_alloc (nothing changed).
    [[nodiscard]] bool push_beyond_cap(std::size_t c, std::uintptr_t address) noexcept {
        if (hot_count(c) == room_[c] && !reserve_hot(c, std::max<std::size_t>(8, 2 * room_[c]))) return false;
        *top_[c]++ = address;
        ++moved_[c];
        return true;
    }
    /// A miss of class `c` on the stream's own calls: its cap doubles (up to `most`, within the
    /// budget, as far as host memory allows), and up to the room left of its cold blocks, the
    /// newest, come back to the hot stack. Returns how many came back.
    std::size_t refill_from_cold(std::size_t c) noexcept {
        if (bottom_[c] == nullptr && cap_[c] != 0) resize_hot(c, cap_[c]);
        const auto want = std::min<std::uint32_t>(2 * cap_[c], most_);
        if (want > cap_[c] && used_ + (want - cap_[c]) * class_size(c) <= budget_) resize_hot(c, want);
        cold_stack& k = cold_[c];
        const auto n = static_cast<std::uint32_t>(std::min<std::size_t>(k.size, hot_room(c)));
        for (std::uint32_t i = 0; i < n; ++i) *top_[c]++ = k.base[--k.size];
        cold_bytes_ -= n * class_size(c);
        moved_[c] += n;
        return n;
    }
    /// A cold block of class `c` (the newest) when it starts at a multiple of `alignment`, handed
    /// out directly (a stream without hot stacks takes its own covered blocks back so); 0 otherwise.
    [[nodiscard]] std::uintptr_t pop_cold(std::size_t c, std::size_t alignment) noexcept {
        cold_stack& k = cold_[c];
        if (k.size == 0 || (k.base[k.size - 1] & (alignment - 1)) != 0) return 0;
        cold_bytes_ -= class_size(c);
        return k.base[--k.size];
    }
    /// Room on the hot stack of class `c` within its cap.
    [[nodiscard]] std::size_t hot_room(std::size_t c) const noexcept {
        return top_[c] >= limit_[c] ? 0 : static_cast<std::size_t>(limit_[c] - top_[c]);
    }
    /// Puts `n` blocks of class `c`, `run`, `run + s`, ..., onto the hot stack, the lowest on top.
    /// Precondition: n <= hot_room(c).
    void push_run(std::size_t c, std::uintptr_t run, std::size_t n) noexcept {
        for (std::size_t i = n; i-- > 0;) *top_[c]++ = run + i * class_size(c);
        moved_[c] += static_cast<std::int64_t>(n);
    }

    /// The stream's event was just recorded: every hot block of class `c` (every class when c is
    /// class_count) moves to its cold stack, covered. Strong for each class (a bad_alloc, a cold
    /// stack growing, moves nothing of the class it stops at).
    void flush(std::size_t c = class_count) {
        const std::size_t first = c == class_count ? 0 : c, last = c == class_count ? class_count : c + 1;
        for (std::size_t i = first; i < last; ++i) {
            const std::size_t n = hot_count(i);
            if (n == 0) continue;
            push_cold(i, bottom_[i], n);
            moved_[i] -= static_cast<std::int64_t>(n);
            top_[i] = bottom_[i];
        }
    }
    /// Puts `n` covered blocks of class `c` onto its cold stack (a block given back right before a
    /// record, or blocks adopted from another stream). Strong.
    void push_cold(std::size_t c, const std::uintptr_t* blocks, std::size_t n) {
        cold_stack& k = cold_[c];
        if (k.capacity - k.size < n) grow_cold(k, k.size + n);
        std::copy(blocks, blocks + n, k.base.get() + k.size);
        k.size += static_cast<std::uint32_t>(n);
        cold_bytes_ += n * class_size(c);
    }

    // ---- other streams: covered blocks only ----

    /// Up to `n` cold blocks of class `c`, the oldest first, to `f(address)`, and removed.
    template <class F>
    std::size_t take_cold(std::size_t c, std::size_t n, F&& f) noexcept {
        cold_stack& k = cold_[c];
        n = std::min<std::size_t>(n, k.size);
        for (std::size_t i = 0; i < n; ++i) f(k.base[i]);
        std::copy(k.base.get() + n, k.base.get() + k.size, k.base.get());
        k.size -= static_cast<std::uint32_t>(n);
        cold_bytes_ -= n * class_size(c);
        return n;
    }
    /// Removes the blocks `which` means (cold ones; with `all`, hot ones too), passing each to
    /// `f(address, size)`. `f` must not throw.
    template <class F>
    void take(which_blocks which, F&& f) noexcept {
        for (std::size_t c = 0; c < class_count; ++c) {
            take_cold(c, cold_[c].size, [&](std::uintptr_t a) { f(a, class_size(c)); });
            if (which != which_blocks::all) continue;
            for (const std::uintptr_t* p = bottom_[c]; p != top_[c]; ++p) f(*p, class_size(c));
            moved_[c] -= static_cast<std::int64_t>(hot_count(c));
            top_[c] = bottom_[c];
        }
    }

    // ---- figures ----

    [[nodiscard]] std::size_t cold_bytes() const noexcept { return cold_bytes_; }
    [[nodiscard]] std::size_t cold_count(std::size_t c) const noexcept { return cold_[c].size; }
    [[nodiscard]] std::size_t hot_count(std::size_t c) const noexcept { return static_cast<std::size_t>(top_[c] - bottom_[c]); }
    /// Whether some block is hot (given back since the last flush: not covered). O(classes).
    [[nodiscard]] bool any_hot() const noexcept {
        for (std::size_t c = 0; c < class_count; ++c) {
            if (top_[c] != bottom_[c]) return true;
        }
        return false;
    }
    /// The number of blocks `which` means. O(classes).
    [[nodiscard]] std::size_t count(which_blocks which) const noexcept {
        std::size_t n = 0;
        for (std::size_t c = 0; c < class_count; ++c) n += cold_[c].size + (which == which_blocks::all ? hot_count(c) : 0);
        return n;
    }
    /// The bytes of every block held. O(classes).
    [[nodiscard]] std::size_t bytes() const noexcept {
        std::size_t n = cold_bytes_;
        for (std::size_t c = 0; c < class_count; ++c) n += hot_count(c) * class_size(c);
        return n;
    }
    /// The size of the largest class that holds a block; 0 when none does.
    [[nodiscard]] std::size_t largest() const noexcept {
        for (std::size_t c = class_count; c-- > 0;) {
            if (hot_count(c) != 0 || cold_[c].size != 0) return class_size(c);
        }
        return 0;
    }
    /// The blocks pushed on the common path so far, given those popped there (`fast_pops`).
    [[nodiscard]] std::uint64_t fast_pushes(std::uint64_t fast_pops) const noexcept {
        std::int64_t n = 0;
        for (std::size_t c = 0; c < class_count; ++c) n += static_cast<std::int64_t>(hot_count(c)) - moved_[c];
        return static_cast<std::uint64_t>(n) + fast_pops;
    }
    /// The bytes of the blocks the common path popped minus those it pushed.
    [[nodiscard]] std::int64_t fast_block_bytes() const noexcept {
        std::int64_t n = 0;
        for (std::size_t c = 0; c < class_count; ++c) {
            n += (moved_[c] - static_cast<std::int64_t>(hot_count(c))) * static_cast<std::int64_t>(class_size(c));
        }
        return n;
    }
    /// Forgets what the common path did (for a shard that serves a new stream, its stacks empty).
    void forget_counts() noexcept { moved_.fill(0); }
    /// The hot cap of class `c` (blocks).
    [[nodiscard]] std::size_t cap(std::size_t c) const noexcept { return cap_[c]; }

private:
    struct cold_stack {
        std::unique_ptr<std::uintptr_t[]> base;
        std::uint32_t size = 0;
        std::uint32_t capacity = 0;
    };

    /// Makes the storage of the hot stack of class `c` hold `room` blocks (keeping those held);
    /// false on a bad_alloc (nothing changed).
    bool reserve_hot(std::size_t c, std::size_t room) noexcept {
        auto* grown = new (std::nothrow) std::uintptr_t[room];
        if (grown == nullptr) return false;
        const std::size_t n = hot_count(c);
        std::copy(bottom_[c], top_[c], grown);
        storage_[c].reset(grown);
        bottom_[c] = grown;
        top_[c] = grown + n;
        limit_[c] = grown + cap_[c];
        room_[c] = static_cast<std::uint32_t>(room);
        return true;
    }
    /// Makes the cap of class `c` `want` blocks (want >= cap_[c]); on a bad_alloc it stays.
    void resize_hot(std::size_t c, std::uint32_t want) noexcept {
        const bool first = bottom_[c] == nullptr;
        if ((want > room_[c] || first) && !reserve_hot(c, std::max<std::size_t>(want, room_[c]))) return;
        used_ += (want - (first ? 0 : cap_[c])) * class_size(c);
        cap_[c] = want;
        limit_[c] = bottom_[c] + want;
    }
    static void grow_cold(cold_stack& k, std::size_t need) {
        const std::size_t capacity = std::max<std::size_t>({need, 2 * std::size_t{k.capacity}, 8});
        auto grown = std::make_unique<std::uintptr_t[]>(capacity);
        std::copy(k.base.get(), k.base.get() + k.size, grown.get());
        k.base = std::move(grown);
        k.capacity = static_cast<std::uint32_t>(capacity);
    }

    // The common path reads top_, bottom_ and limit_ alone, each found by the class index scaled by 8.
    std::array<std::uintptr_t*, class_count> top_{};
    std::array<std::uintptr_t*, class_count> bottom_{};
    std::array<std::uintptr_t*, class_count> limit_{};
    std::array<std::int64_t, class_count> moved_{}; ///< blocks put on hot stacks minus those taken, by careful calls
    std::uint32_t most_;   ///< pool_options::record_interval - 1 (0: no hot stacks)
    std::size_t budget_;   ///< pool_options::record_bytes
    std::size_t used_ = 0; ///< sum of cap_[c] * class_size(c) over the classes in use
    std::size_t cold_bytes_ = 0;
    std::array<std::uint32_t, class_count> cap_{};
    std::array<std::uint32_t, class_count> room_{};
    std::array<std::unique_ptr<std::uintptr_t[]>, class_count> storage_{}; ///< the hot stacks' storage
    std::array<cold_stack, class_count> cold_{};
};

} // namespace custody::pool::detail
