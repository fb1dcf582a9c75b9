/// @file
/// Each recording thread's event rings, one per recorder it recorded into, and the thread's
/// identity (OS id, name).
#pragma once

#include <custody/trace/detail/event_ring.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace custody::trace::detail {

/// Hands out recorder ids: never reused, so a thread's cached ring can never be mistaken for a
/// later recorder's.
inline std::uint64_t next_recorder_id() noexcept {
    static std::atomic<std::uint64_t> next{0};
    return next.fetch_add(1, std::memory_order_relaxed) + 1;
}

/// One thread's rings, one per recorder it recorded into. The last one used is cached for the
/// fast path. At thread exit the rings are marked abandoned; each recorder frees its ring once
/// drained.
struct thread_rings {
    std::uint64_t last_recorder = 0;
    event_ring* last = nullptr;
    std::vector<std::pair<std::uint64_t, std::shared_ptr<event_ring>>> all;
    thread_rings() = default;
    thread_rings(const thread_rings&) = delete;
    thread_rings& operator=(const thread_rings&) = delete;
    ~thread_rings() {
        for (auto& [id, ring] : all) ring->abandon();
    }
};

inline thread_rings& local_rings() noexcept {
    thread_local thread_rings rings;
    return rings;
}

inline std::uint64_t this_thread_os_id() noexcept {
#if defined(__linux__)
    return static_cast<std::uint64_t>(::syscall(SYS_gettid));
#else
    return static_cast<std::uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()));
#endif
}

inline std::string this_thread_name() {
    char name[64] = {};
    if (::pthread_getname_np(::pthread_self(), name, sizeof name) != 0) return {};
    return name;
}

} // namespace custody::trace::detail
