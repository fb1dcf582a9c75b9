/// @file
/// `spin_mutex`: a test-and-test-and-set lock for the pool's per-stream shards, whose critical
/// sections are a few dozen instructions long.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace custody::pool::detail {

/// A lock for very short critical sections that are almost never contended (one shard per
/// stream, and a stream is usually driven by one thread). Uncontended, lock() plus unlock() is two
/// atomic operations and no system call, where std::mutex costs about twice as much; contended, it
/// spins briefly on a plain load and then yields, so eight threads on two cores still make progress.
///
/// Meets the Lockable requirements (usable with std::lock_guard and std::unique_lock).
/// Thread safety: that is its purpose. Not recursive. Acquire/release ordering, so ThreadSanitizer
/// understands the happens-before edges it creates.
class spin_mutex {
public:
    spin_mutex() noexcept = default;
    spin_mutex(const spin_mutex&) = delete;
    spin_mutex& operator=(const spin_mutex&) = delete;

    /// The uncontended case is one atomic bit set (fetch_or of the lock bit: a `lock bts` on x86),
    /// kept small so that it is inlined at every call site; the spinning is out of line.
    [[gnu::always_inline]] void lock() noexcept {
        if ((locked_.fetch_or(1U, std::memory_order_acquire) & 1U) == 0) [[likely]] return;
        lock_contended();
    }
    [[nodiscard]] bool try_lock() noexcept {
        return locked_.load(std::memory_order_relaxed) == 0 && (locked_.fetch_or(1U, std::memory_order_acquire) & 1U) == 0;
    }
    [[gnu::always_inline]] void unlock() noexcept { locked_.store(0, std::memory_order_release); }

private:
    [[gnu::noinline, gnu::cold]] void lock_contended() noexcept {
        for (unsigned spins = 0;; ++spins) {
            while (locked_.load(std::memory_order_relaxed) != 0) {
                if (++spins > 64) std::this_thread::yield();
            }
            if ((locked_.fetch_or(1U, std::memory_order_acquire) & 1U) == 0) return;
        }
    }

    std::atomic<std::uint32_t> locked_{0}; ///< 1: held
};

} // namespace custody::pool::detail
