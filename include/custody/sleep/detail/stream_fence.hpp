/// @file
/// `stream_fence`: the streams a set of blocks was used on, and a private stream ordered after the
/// work enqueued on them so far, without waiting on the host.
#pragma once

#include <custody/platform/platform.hpp>
#include <custody/sleep/detail/block_ledger.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

namespace custody::sleep::detail {

/// The streams that work on some blocks may still be running on. Collects each stream once, tells
/// whether one is capturing a graph, and makes a follower stream wait for everything enqueued on
/// all of them so far: one event recorded on each, waited on by the follower (P::wait), so that
/// what the follower does next (copy out, unmap after it) comes after that work and nothing
/// waits on the host but whoever waits for the follower.
///
/// Not thread-safe (one sleep at a time uses it). Complexity: add O(streams); order_after O(streams)
/// platform calls.
template <class Platform>
class stream_fence {
public:
    using stream_view = typename Platform::stream_view;

    /// Adds the streams of `uses` not added yet. Throws std::bad_alloc (keeping what was added).
    void add(std::span<const stream_use<stream_view>> uses) {
        for (const stream_use<stream_view>& u : uses) {
            if (std::find(uses_.begin(), uses_.end(), u) == uses_.end()) uses_.push_back(u);
        }
    }

    /// The first stream that is capturing a graph (a query: no capture is joined or invalidated).
    [[nodiscard]] std::optional<stream_use<stream_view>> capturing() const {
        for (const auto& u : uses_) {
            if (Platform::is_capturing(u.stream)) return u;
        }
        return std::nullopt;
    }

    /// Work enqueued on `follower` from now on runs after all the work enqueued so far on every
    /// stream added (`follower` itself needs nothing: it is in order). Throws the platform's error;
    /// the waits already enqueued then only delay `follower`.
    void order_before(stream_view follower) {
        events_.reserve(uses_.size());
        for (const auto& u : uses_) {
            if (u.stream == follower) continue;
            basic_device_guard<Platform> guard(u.device); // an event and the stream it is recorded on share a device
            events_.emplace_back(u.device);
            events_.back().record(u.stream);
            Platform::wait(follower, events_.back());
        }
    }

    [[nodiscard]] std::size_t size() const noexcept { return uses_.size(); }

private:
    std::vector<stream_use<stream_view>> uses_; ///< distinct
    std::vector<typename Platform::event> events_; ///< kept until the fence goes: the follower's waits refer to them
};

} // namespace custody::sleep::detail
