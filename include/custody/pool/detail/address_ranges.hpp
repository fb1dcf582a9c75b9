/// @file
/// `address_ranges`: a set of disjoint address ranges that any thread can search without a lock
/// and without writing shared memory, changed rarely by one writer at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace custody::pool::detail {

/// Which addresses lie in one of a few ranges [begin, end): the pool asks it at every deallocate
/// (is this block capture-private?), so a search reads only (a sequence lock: it retries when a
/// change overlapped it) and shares no written cache line with other threads.
///
/// Invariants (each table): begin_[0, count) ascending; ranges disjoint; count <= capacity.
///   seq_ is odd exactly while a change is being written. A table replaced by a larger one is
///   kept (retired_) until the set is destroyed, since a reader may still be searching it; tables
///   double, so the retired ones hold less than the current one.
///   every range lies in [low_, low_ + span_) whenever contains() may be asked about it; span_ == 0
///   once the set is empty
/// Thread safety: contains() from any thread at any time; insert/erase by one thread at a time
/// (the owner's lock), concurrently with contains().
/// Complexity: contains O(log n) (O(1) when empty); insert and erase O(n).
class address_ranges {
public:
    address_ranges() = default;
    address_ranges(const address_ranges&) = delete;
    address_ranges& operator=(const address_ranges&) = delete;

    /// True when `address` lies in one of the ranges. Inline, one subtraction and a compare for an
    /// address outside the span from the lowest range's start to the highest one's end (every
    /// address while the set is empty); the search otherwise.
    [[nodiscard, gnu::always_inline]] bool contains(std::uintptr_t address) const noexcept {
        if (address - low_.load(std::memory_order_acquire) >= span_.load(std::memory_order_acquire)) [[likely]] {
            return false;
        }
        return search(address);
    }

private:
    [[gnu::noinline, gnu::cold]] bool search(std::uintptr_t address) const noexcept {
        if (size_.load(std::memory_order_acquire) == 0) return false;
        for (;;) {
            const std::uint64_t before = seq_.load(std::memory_order_acquire);
            if ((before & 1U) != 0) {
                std::this_thread::yield();
                continue;
            }
            const table* t = current_.load(std::memory_order_acquire);
            // Acquire loads: the second read of seq_ cannot move before them, and a value a change
            // wrote makes that read see the change's odd count (no fence: ThreadSanitizer does not model fences).
            const std::size_t n = std::min(t->count.load(std::memory_order_acquire), t->capacity);
            std::size_t lo = 0;
            std::size_t hi = n; // the first range whose begin > address lies in [lo, hi]
            while (lo < hi) {
                const std::size_t mid = lo + (hi - lo) / 2;
                if (t->slots[mid].begin.load(std::memory_order_acquire) <= address) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            const bool found = lo != 0 && address < t->slots[lo - 1].end.load(std::memory_order_acquire);
            if (seq_.load(std::memory_order_relaxed) == before) return found;
        }
    }

public:
    /// The number of ranges.
    [[nodiscard]] std::size_t size() const noexcept { return size_.load(std::memory_order_acquire); }

    /// Makes room for `n` ranges, so that inserting up to that many cannot fail. Strong.
    void reserve(std::size_t n) {
        if (current_.load(std::memory_order_relaxed) != nullptr &&
            current_.load(std::memory_order_relaxed)->capacity >= n) {
            return;
        }
        auto bigger = std::make_unique<table>(std::max<std::size_t>(n, 2 * capacity()));
        retired_.reserve(retired_.size() + 1);
        const table* old = current_.load(std::memory_order_relaxed);
        const std::size_t count = old == nullptr ? 0 : old->count.load(std::memory_order_relaxed);
        for (std::size_t i = 0; i < count; ++i) bigger->set(i, old->slots[i].begin.load(std::memory_order_relaxed),
                                                             old->slots[i].end.load(std::memory_order_relaxed));
        bigger->count.store(count, std::memory_order_relaxed);
        begin_write();
        current_.store(bigger.get(), std::memory_order_release);
        end_write();
        if (old != nullptr) retired_.push_back(std::move(owned_)); // reserved above: cannot throw
        owned_ = std::move(bigger);
    }

    /// Adds [begin, end), which overlaps no range of the set. Throws bad_alloc (set unchanged).
    void insert(std::uintptr_t begin, std::uintptr_t end) {
        reserve(size() + 1);
        table& t = *owned_;
        const std::size_t n = t.count.load(std::memory_order_relaxed);
        std::size_t at = 0;
        while (at < n && t.slots[at].begin.load(std::memory_order_relaxed) < begin) ++at;
        begin_write();
        for (std::size_t i = n; i > at; --i) {
            t.set(i, t.slots[i - 1].begin.load(std::memory_order_relaxed), t.slots[i - 1].end.load(std::memory_order_relaxed));
        }
        t.set(at, begin, end);
        t.count.store(n + 1, std::memory_order_release);
        end_write();
        size_.store(n + 1, std::memory_order_release);
        // The span only widens while ranges remain (a stale wide span costs a search, never a miss),
        // published before the range's first block is handed out. While low_ moves, span_ covers
        // every address, so that no reader sees a window that leaves out a range it may hold.
        const std::uintptr_t old_low = low_.load(std::memory_order_relaxed);
        const std::uintptr_t low = n == 0 ? begin : std::min(begin, old_low);
        const std::uintptr_t high = n == 0 ? end : std::max(end, old_low + span_.load(std::memory_order_relaxed));
        span_.store(UINTPTR_MAX, std::memory_order_release);
        low_.store(low, std::memory_order_release);
        span_.store(high - low, std::memory_order_release);
    }

    /// Removes the range that starts at `begin` (nothing if there is none).
    void erase(std::uintptr_t begin) noexcept {
        if (owned_ == nullptr) return;
        table& t = *owned_;
        const std::size_t n = t.count.load(std::memory_order_relaxed);
        std::size_t at = 0;
        while (at < n && t.slots[at].begin.load(std::memory_order_relaxed) != begin) ++at;
        if (at == n) return;
        begin_write();
        for (std::size_t i = at; i + 1 < n; ++i) {
            t.set(i, t.slots[i + 1].begin.load(std::memory_order_relaxed), t.slots[i + 1].end.load(std::memory_order_relaxed));
        }
        t.count.store(n - 1, std::memory_order_release);
        end_write();
        size_.store(n - 1, std::memory_order_release);
        if (n == 1) span_.store(0, std::memory_order_release); // empty: every address misses at once
    }

private:
    struct slot {
        std::atomic<std::uintptr_t> begin{0};
        std::atomic<std::uintptr_t> end{0};
    };
    struct table {
        explicit table(std::size_t n) : capacity(n), slots(std::make_unique<slot[]>(n)) {}
        /// Release stores: none can move before the odd count that begin_write() stored.
        void set(std::size_t i, std::uintptr_t b, std::uintptr_t e) noexcept {
            slots[i].begin.store(b, std::memory_order_release);
            slots[i].end.store(e, std::memory_order_release);
        }
        const std::size_t capacity;
        std::atomic<std::size_t> count{0};
        std::unique_ptr<slot[]> slots;
    };

    [[nodiscard]] std::size_t capacity() const noexcept { return owned_ == nullptr ? 4 : owned_->capacity; }
    void begin_write() noexcept { seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
    void end_write() noexcept { seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

    /// Every range lies in [low_, low_ + span_) (span_ 0: no range); read first by contains().
    std::atomic<std::uintptr_t> low_{0};
    std::atomic<std::uintptr_t> span_{0};
    std::atomic<std::uint64_t> seq_{0};
    std::atomic<const table*> current_{nullptr}; // == owned_.get()
    std::atomic<std::size_t> size_{0};           // == owned_->count
    std::unique_ptr<table> owned_;
    std::vector<std::unique_ptr<table>> retired_;
};

} // namespace custody::pool::detail
