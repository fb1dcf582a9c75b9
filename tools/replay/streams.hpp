/// @file
/// `stream_pool`: the streams a replay uses for one device program, one per stream of the trace,
/// made on first use for each platform and shared by every allocator replayed on that device.
#pragma once

#include "program.hpp"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace custody::replay {

/// One platform's streams for a program: views[i] is the trace's stream i (views[0], the default
/// stream, is the platform's default stream); owned holds the streams created for the others.
template <class Platform>
struct stream_set {
    std::vector<typename Platform::stream> owned;
    std::vector<typename Platform::stream_view> views;

    stream_set(std::size_t count, int device) {
        owned.reserve(count);
        views.emplace_back();
        for (std::size_t i = 1; i < count; ++i) {
            owned.emplace_back(device);
            views.push_back(owned.back().view());
        }
    }
};

/// The streams of one device program on each platform an allocator needs, made on first use.
/// Must outlive every allocator that uses them. Thread safety: none.
class stream_pool {
public:
    explicit stream_pool(const device_program& p) : count_(p.streams.size()) {}

    /// Platform's streams on `device`, one per trace stream.
    template <class Platform>
    const std::vector<typename Platform::stream_view>& views(int device) {
        std::shared_ptr<void>& slot = sets_[std::string(Platform::name)];
        if (!slot) slot = std::make_shared<stream_set<Platform>>(count_, device);
        return static_cast<stream_set<Platform>*>(slot.get())->views;
    }

private:
    std::size_t count_;
    std::map<std::string, std::shared_ptr<void>> sets_;
};

} // namespace custody::replay
