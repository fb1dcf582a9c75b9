// Helpers for the debug suite: an upstream that records what it is given back, and a failure
// callback that collects messages.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/failure_callback.hpp>
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

/// Collects what custody::report_failure receives while it lives; restores the previous callback.
class failure_log {
public:
    failure_log() : previous_(set_failure_callback(&record)) {
        std::lock_guard lock(mutex());
        messages().clear();
    }
    ~failure_log() { set_failure_callback(previous_); }
    failure_log(const failure_log&) = delete;
    failure_log& operator=(const failure_log&) = delete;

    [[nodiscard]] std::vector<std::string> lines() const {
        std::lock_guard lock(mutex());
        return messages();
    }

private:
    static std::mutex& mutex() {
        static std::mutex m;
        return m;
    }
    static std::vector<std::string>& messages() {
        static std::vector<std::string> m;
        return m;
    }
    static void record(std::string_view message) noexcept {
        try {
            std::lock_guard lock(mutex());
            messages().emplace_back(message);
        } catch (...) {
        }
    }
    failure_callback previous_;
};

} // namespace custody::test
