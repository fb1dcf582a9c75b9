// A host-platform resource for tests that records every call (with the device current inside it
// and the stream) and verifies that every deallocate matches a live allocation exactly.
#pragma once

#include <custody/core/properties.hpp>
#include <custody/platform/host.hpp>
#include <custody/resource/host_memory.hpp>

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace custody::test {

struct recorded_call {
    bool allocate;
    void* ptr;
    std::size_t bytes;
    std::size_t alignment;
    host::stream_view stream;
    int current_device; // the device current inside the call
};

/// Allocates from host_memory as if it were memory of `device`; records and checks every call.
/// `violations()` lists deallocations that matched no live block (wrong pointer, size, alignment
/// or a double free); such calls are not forwarded.
class checking_resource {
public:
    using stream_type = host::stream_view;

    explicit checking_resource(int device = 0) : device_(device) {}
    checking_resource(const checking_resource&) = delete;
    checking_resource& operator=(const checking_resource&) = delete;

    void* allocate(stream_type s, std::size_t bytes, std::size_t alignment) {
        void* p = upstream_.allocate(s, bytes, alignment);
        std::lock_guard lock(mutex_);
        calls_.push_back({true, p, bytes, alignment, s, host::platform::current_device()});
        if (p != nullptr) live_[p] = {bytes, alignment};
        return p;
    }
    void deallocate(stream_type s, void* p, std::size_t bytes, std::size_t alignment) noexcept {
        if (p == nullptr) return;
        {
            std::lock_guard lock(mutex_);
            calls_.push_back({false, p, bytes, alignment, s, host::platform::current_device()});
            auto it = live_.find(p);
            if (it == live_.end() || it->second.first != bytes || it->second.second != alignment) {
                violations_.push_back("deallocate(" + std::to_string(bytes) + ", " + std::to_string(alignment) +
                                      ") matches no live block");
                return;
            }
            live_.erase(it);
        }
        upstream_.deallocate(s, p, bytes, alignment);
    }
    void* allocate_sync(std::size_t bytes, std::size_t alignment) { return allocate({}, bytes, alignment); }
    void deallocate_sync(void* p, std::size_t bytes, std::size_t alignment) noexcept {
        deallocate({}, p, bytes, alignment);
    }
    [[nodiscard]] resource_statistics statistics() const { return upstream_.statistics(); }
    [[nodiscard]] int device() const noexcept { return device_; }

    [[nodiscard]] std::vector<recorded_call> calls() const {
        std::lock_guard lock(mutex_);
        return calls_;
    }
    [[nodiscard]] std::vector<std::string> violations() const {
        std::lock_guard lock(mutex_);
        return violations_;
    }
    [[nodiscard]] std::size_t live_blocks() const {
        std::lock_guard lock(mutex_);
        return live_.size();
    }

    friend bool operator==(const checking_resource& a, const checking_resource& b) noexcept { return &a == &b; }
    friend void get_property(const checking_resource&, device_accessible) noexcept {}
    friend void get_property(const checking_resource&, host_accessible) noexcept {}

private:
    int device_;
    resource::host_memory upstream_;
    mutable std::mutex mutex_;
    std::vector<recorded_call> calls_;
    std::map<void*, std::pair<std::size_t, std::size_t>> live_;
    std::vector<std::string> violations_;
};

} // namespace custody::test
