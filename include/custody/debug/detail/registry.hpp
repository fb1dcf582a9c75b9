/// @file
/// The process-wide registry of live trackers, which answers "which tracker handed out this
/// pointer?" when a tracker is given a pointer it does not know.
#pragma once

#include <custody/core/detail/mutex.hpp>
#include <custody/debug/report.hpp>

#include <mutex>
#include <string>
#include <vector>

namespace custody::debug::detail {

/// One registered tracker: an opaque object and the function that looks a pointer up in it.
/// `lookup` fills the allocation side and returns true when the tracker holds `ptr` live; it locks
/// only the tracker's own state.
struct tracker_entry {
    const void* self = nullptr;
    bool (*lookup)(const void* self, const void* ptr, allocation_site& site, std::string& name) = nullptr;
};

/// Lock order: the registry's mutex, then a tracker's. A tracker never calls into the registry
/// while holding its own mutex, so the two orders cannot meet.
/// Thread safety: thread-safe. Complexity: linear in the number of live trackers (a handful).
class tracker_registry {
public:
    static tracker_registry& instance() {
        static tracker_registry* registry = new tracker_registry; // outlives static destructors
        return *registry;
    }

    void add(tracker_entry e) {
        std::lock_guard lock(mutex_);
        entries_.push_back(e);
    }
    void remove(const void* self) noexcept {
        std::lock_guard lock(mutex_);
        std::erase_if(entries_, [&](const tracker_entry& e) { return e.self == self; });
    }
    /// Asks every tracker but `asking` whether it holds `ptr` live.
    bool find_owner(const void* asking, const void* ptr, allocation_site& site, std::string& name) const {
        std::lock_guard lock(mutex_);
        for (const tracker_entry& e : entries_) {
            if (e.self != asking && e.lookup(e.self, ptr, site, name)) return true;
        }
        return false;
    }
    [[nodiscard]] std::size_t size() const {
        std::lock_guard lock(mutex_);
        return entries_.size();
    }

private:
    mutable custody::detail::mutex mutex_;
    std::vector<tracker_entry> entries_; // one per live tracker
};

} // namespace custody::debug::detail
