/// @file
/// `watch_set`: the tracking resource's installed watches, which fire on a threshold crossed by an
/// owner's or a device's live bytes, on growth across consecutive samples, or on the rise of their
/// floor's trend.
#pragma once

#include <custody/core/failure_callback.hpp>
#include <custody/debug/detail/trends.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/tracking_options.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace custody::debug::detail {

/// A watch that fired, with what it saw: its callback is called later, outside the tracker's lock.
using fired_watch = std::pair<int, watch_event>;

/// The watches of one tracker.
/// Invariants: ids are unique and increasing; a threshold watch is `armed` iff it has not fired
/// since a sample found its subject's live bytes <= its threshold with `above` false (they had not
/// risen above it since the previous sample), or since it was installed at or below it.
/// Thread safety: none; the tracker's mutex guards it. Complexity: a change is O(watches).
class watch_set {
public:
    /// Installs `w`, whose subject has `live` bytes now; `owner` is w.owner interned. Returns its id.
    int add(watch w, owner_id owner, std::size_t live) {
        installed i{++last_id_, owner, std::move(w)};
        i.last_bytes = live;
        i.armed = live <= i.spec.threshold_bytes;
        i.above = !i.armed;
        watches_.push_back(std::move(i));
        return last_id_;
    }
    /// Removes a watch; false when there is no such id.
    bool remove(int id) {
        return std::erase_if(watches_, [&](const installed& w) { return w.id == id; }) != 0;
    }
    [[nodiscard]] bool empty() const noexcept { return watches_.empty(); }
    [[nodiscard]] std::size_t size() const noexcept { return watches_.size(); }

    /// Runs the threshold watches of `owner` and of `device`, whose live bytes are now as given.
    /// Appends what fires to `fired` (reserved for size() more by the caller).
    void on_change(owner_id owner, std::size_t owner_bytes, int device, std::size_t device_bytes, int rank,
                   std::vector<fired_watch>& fired) noexcept {
        for (installed& w : watches_) {
            if (w.spec.threshold_bytes == SIZE_MAX) continue;
            const bool of_owner = w.spec.what == watch::subject::owner;
            if (of_owner ? w.owner != owner : w.spec.device != device) continue;
            const std::size_t live = of_owner ? owner_bytes : device_bytes;
            if (live <= w.spec.threshold_bytes) continue;
            w.above = true;
            if (w.armed) {
                w.armed = false;
                try {
                    fired.emplace_back(w.id, event_of(w, live, cause::threshold, rank));
                } catch (...) {
                    report_failure("custody: no memory to report a watch");
                }
            }
        }
    }

    /// At a sample: runs the growth watches and re-arms the threshold watches whose subject stayed
    /// at or below the threshold since the previous sample; `live_of(spec, owner)` gives each
    /// subject's bytes.
    template <class LiveOf>
    void on_sample(const LiveOf& live_of, int rank, std::vector<fired_watch>& fired) {
        for (installed& w : watches_) {
            const std::size_t live = live_of(w.spec, w.owner);
            if (!w.above && live <= w.spec.threshold_bytes) w.armed = true;
            w.above = live > w.spec.threshold_bytes;
            w.growths = live > w.last_bytes ? w.growths + 1 : 0;
            w.last_bytes = live;
            if (w.spec.growth_snapshots > 0 && w.growths == w.spec.growth_snapshots) {
                fired.emplace_back(w.id, event_of(w, live, cause::growth, rank));
            }
        }
    }

    /// At a sample: fires the trend watches of the owners and devices whose floor test raised its
    /// alarm (`raised`), `live_of(spec, owner)` giving each subject's bytes.
    template <class LiveOf>
    void on_trends(const std::vector<raised_trend>& raised, const LiveOf& live_of, int rank,
                   std::vector<fired_watch>& fired) {
        for (installed& w : watches_) {
            if (!w.spec.trend) continue;
            const bool of_owner = w.spec.what == watch::subject::owner;
            for (const raised_trend& r : raised) {
                if (r.of_device == of_owner || (of_owner ? r.owner != w.owner : r.device != w.spec.device)) continue;
                fired.emplace_back(w.id, event_of(w, live_of(w.spec, w.owner), cause::trend, rank));
                fired.back().second.forecast = r.estimate;
            }
        }
    }

    /// The callback of watch `id`; empty when it was removed.
    [[nodiscard]] std::function<void(const watch_event&)> callback_of(int id) const {
        for (const installed& w : watches_)
            if (w.id == id) return w.spec.callback;
        return {};
    }

private:
    enum class cause { threshold, growth, trend };

    struct installed {
        int id = 0;
        owner_id owner = nullptr;
        watch spec;
        bool armed = true;          ///< the threshold may fire (see the class's invariants)
        bool above = false;         ///< live bytes rose above the threshold since the previous sample
        std::size_t last_bytes = 0; ///< at the previous sample
        int growths = 0;            ///< consecutive samples with growth
    };

    [[nodiscard]] static watch_event event_of(const installed& w, std::size_t live, cause why, int rank) {
        watch_event e;
        e.watch_id = w.id;
        if (w.spec.what == watch::subject::owner) {
            e.owner = std::string(owner_name(w.owner));
            e.subject = "owner '" + e.owner + "'";
        } else {
            e.device = w.spec.device;
            e.subject = "device " + std::to_string(w.spec.device);
        }
        e.rank = rank;
        e.live_bytes = live;
        e.growth = why == cause::growth;
        e.trend = why == cause::trend;
        e.consecutive_growths = w.growths;
        return e;
    }

    std::vector<installed> watches_;
    int last_id_ = 0;
};

} // namespace custody::debug::detail
