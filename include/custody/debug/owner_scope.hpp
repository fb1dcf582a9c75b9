/// @file
/// `owner_scope`: an RAII tag that names the owner of the memory a thread allocates inside it
/// ("decoder/layer.3/attn" when nested), and the interned owner names the tracker stores.
#pragma once

#include <custody/core/detail/mutex.hpp>
#include <custody/core/owner.hpp>

#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

namespace custody::debug {

/// The owner recorded for memory allocated outside every owner scope and without an explicit owner.
inline constexpr std::string_view untagged_owner = "<untagged>";

/// An interned owner name (core/owner.hpp); nullptr means untagged.
using custody::owner_id;
/// The owner of what this thread allocates now (core/owner.hpp).
using custody::current_owner;

namespace detail {

/// The process-wide table of owner names. Grows with the number of distinct names, never shrinks
/// (owner names are few: layers, stages, caches). Thread-safe (one mutex).
/// Invariant: two calls with equal names return the same pointer.
class owner_table {
public:
    static owner_table& instance() {
        static owner_table* table = new owner_table; // never destroyed: ids outlive static destructors
        return *table;
    }
    [[nodiscard]] owner_id intern(std::string_view name) {
        std::lock_guard lock(mutex_);
        return &*names_.emplace(name).first; // node-based set: the address is stable
    }

private:
    custody::detail::mutex mutex_;
    std::unordered_set<std::string> names_;
};

} // namespace detail

/// Interns `name`. "" and untagged_owner ("<untagged>") are untagged (nullptr): the name an owner
/// is shown by is the one it is found by, so a scope named "<untagged>" is the untagged owner, not a
/// second owner of that name. Thread-safe; costs a lock and a hash.
[[nodiscard]] inline owner_id intern_owner(std::string_view name) {
    if (name.empty() || name == untagged_owner) return nullptr;
    return detail::owner_table::instance().intern(name);
}

/// The name of an owner id ("<untagged>" for nullptr).
[[nodiscard]] inline std::string_view owner_name(owner_id id) noexcept {
    return id == nullptr ? untagged_owner : std::string_view(*id);
}

/// Names the owner of the memory this thread allocates while the scope lives. Scopes nest: inside
/// `owner_scope a("decoder"); owner_scope b("layer.3");` the owner is "decoder/layer.3".
///
/// Thread safety: a scope belongs to the thread that made it (the owner is thread-local) and must
/// be destroyed on that thread, in reverse order of construction (as RAII does by itself).
/// Not copyable or movable. Complexity: construction interns the joined name (a lock and a hash);
/// destruction is constant.
class owner_scope {
public:
    explicit owner_scope(std::string_view name) : previous_(custody::detail::current_owner_slot()) {
        std::string path;
        if (previous_ != nullptr) {
            path.reserve(previous_->size() + 1 + name.size());
            path += *previous_;
            if (!name.empty()) path += '/';
        }
        path += name;
        self_ = intern_owner(path);
        custody::detail::current_owner_slot() = self_;
    }
    ~owner_scope() { custody::detail::current_owner_slot() = previous_; }
    owner_scope(const owner_scope&) = delete;
    owner_scope& operator=(const owner_scope&) = delete;

    /// The full owner name this scope set ("decoder/layer.3").
    [[nodiscard]] std::string_view name() const noexcept { return owner_name(self_); }
    [[nodiscard]] owner_id id() const noexcept { return self_; }

private:
    owner_id previous_;
    owner_id self_ = nullptr;
};

} // namespace custody::debug
