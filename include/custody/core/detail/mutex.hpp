/// @file
/// `mutex` and `shared_mutex`: the standard locks, whose end ThreadSanitizer hears of.
#pragma once

#include <mutex>
#include <shared_mutex>

#if defined(__SANITIZE_THREAD__)
#define CUSTODY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CUSTODY_TSAN 1
#endif
#endif

#ifdef CUSTODY_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace custody::detail {

/// Tells ThreadSanitizer that the lock at `address` is gone. libstdc++'s std::mutex and
/// std::shared_mutex end without a call it intercepts (pthread_mutex_destroy), so a lock's history
/// outlives it: the next lock built at the same address (a resource on the stack of the next
/// function) inherits the order it was taken in, and two unrelated resources read as a lock-order
/// inversion. Nothing without ThreadSanitizer.
inline void forget_lock([[maybe_unused]] void* address) noexcept {
#ifdef CUSTODY_TSAN
    __tsan_mutex_destroy(address, 0);
#endif
}

/// std::mutex, usable wherever one is (std::lock_guard<std::mutex>, a condition variable's
/// std::unique_lock<std::mutex>), that tells ThreadSanitizer when it ends (forget_lock).
class mutex : public std::mutex {
public:
    mutex() = default;
    ~mutex() { forget_lock(this); }
    mutex(const mutex&) = delete;
    mutex& operator=(const mutex&) = delete;
};

/// std::shared_mutex that tells ThreadSanitizer when it ends (forget_lock).
class shared_mutex : public std::shared_mutex {
public:
    shared_mutex() = default;
    ~shared_mutex() { forget_lock(this); }
    shared_mutex(const shared_mutex&) = delete;
    shared_mutex& operator=(const shared_mutex&) = delete;
};

} // namespace custody::detail
