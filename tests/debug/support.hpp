// Helpers for the debug suite: an upstream that records what it is given back (and, from
// tests/support, the failure log).
#pragma once

#include "../support/failure_log.hpp"

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/host.hpp>

#include <cstddef>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace custody::test {

/// A host-platform upstream that counts calls and, at deallocate, keeps a copy of the bytes it is
/// given back (after the stream's pending work, as a real free would run). Thread-safe.
class inspecting_upstream {
public:
    using stream_type = host::stream_view;

    void* allocate(stream_type, std::size_t bytes, std::size_t alignment) {
        check_alignment(alignment);
        if (bytes == 0) return nullptr;
        void* p = ::operator new(bytes, std::align_val_t{alignment});
        std::lock_guard lock(mutex_);
        stats_.on_allocate(bytes, bytes);
        return p;
    }
    void deallocate(stream_type s, void* p, std::size_t bytes, std::size_t alignment) noexcept {
        if (p == nullptr) return;
        host::platform::synchronize(s);
        {
            std::lock_guard lock(mutex_);
            const auto* b = static_cast<const unsigned char*>(p);
            last_freed_.assign(b, b + bytes);
            stats_.on_deallocate(bytes, bytes);
        }
        ::operator delete(p, std::align_val_t{alignment});
    }
    void* allocate_sync(std::size_t bytes, std::size_t alignment) { return allocate({}, bytes, alignment); }
    void deallocate_sync(void* p, std::size_t bytes, std::size_t alignment) noexcept { deallocate({}, p, bytes, alignment); }
    [[nodiscard]] resource_statistics statistics() const noexcept { return stats_.snapshot(); }
    [[nodiscard]] std::vector<unsigned char> last_freed() const {
        std::lock_guard lock(mutex_);
        return last_freed_;
    }
    friend bool operator==(const inspecting_upstream& a, const inspecting_upstream& b) noexcept { return &a == &b; }

private:
    mutable std::mutex mutex_;
    statistics_counter stats_;
    std::vector<unsigned char> last_freed_;
};

static_assert(stream_ordered_resource<inspecting_upstream>);

} // namespace custody::test
