/// Raising a high-water mark kept in an atomic: the one compare-exchange loop custody's counters use.
#pragma once

#include <atomic>

namespace custody::detail {

/// Makes `peak` at least `value`; concurrent callers leave it at the largest value any of them gave.
/// Relaxed: a peak orders nothing else.
template <class T>
void raise_peak(std::atomic<T>& peak, T value) noexcept {
    T seen = peak.load(std::memory_order_relaxed);
    while (seen < value && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
    }
}

} // namespace custody::detail
