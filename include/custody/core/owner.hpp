/// @file
/// Owner tags as vocabulary: `owner_id` (an interned owner name), the thread's current owner, and
/// `owner_binding`, which makes an owner current for one call. Interning names and the nestable
/// `owner_scope` are the debug layer's (debug/owner_scope.hpp); a handle that keeps an owner (a
/// buffer) needs only this.
#pragma once

#include <string>

namespace custody {

/// An interned owner name: a pointer to a string that lives until the process exits (made by
/// debug::intern_owner or an owner_scope), so a ledger entry stores one pointer and two entries
/// with the same owner compare by address. nullptr means untagged.
using owner_id = const std::string*;

namespace detail {

/// The owner of what this thread allocates now; nullptr outside every owner scope.
inline owner_id& current_owner_slot() noexcept {
    thread_local owner_id current = nullptr;
    return current;
}

} // namespace detail

/// The owner of what this thread allocates now (nullptr when outside every scope). Constant time:
/// one thread-local read.
[[nodiscard]] inline owner_id current_owner() noexcept { return detail::current_owner_slot(); }

/// Makes `owner` this thread's current owner while it lives (exactly `owner`: unlike an
/// owner_scope it does not join the enclosing scope's name), then restores the previous one. What
/// a handle uses to allocate again under the owner it was made with, wherever it is resized.
/// Cost: one thread-local read, and two writes only when `owner` is not already current.
/// Thread safety: as owner_scope: made and destroyed on one thread, in reverse order.
class owner_binding {
public:
    explicit owner_binding(owner_id owner) noexcept : previous_(detail::current_owner_slot()), owner_(owner) {
        if (owner_ != previous_) detail::current_owner_slot() = owner_;
    }
    ~owner_binding() {
        if (owner_ != previous_) detail::current_owner_slot() = previous_;
    }
    owner_binding(const owner_binding&) = delete;
    owner_binding& operator=(const owner_binding&) = delete;

private:
    owner_id previous_;
    owner_id owner_;
};

} // namespace custody
