/// @file
/// `recorded_streams`: an adaptor for blocks used on streams besides the one they were allocated
/// and freed on (a side stream for communication or prefetch): such uses are recorded, and a
/// freed block goes back to the upstream only once the work enqueued on each recorded stream
/// before the free has finished. What PyTorch's `Tensor.record_stream` asks of its allocator.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/detail/layers.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/discarding.hpp>
#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/statistics.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::resource {

/// Forwards to `Upstream` (held by value, constructed in place from the constructor's arguments)
/// and adds record(ptr, s): "work enqueued on s uses ptr".
///
/// **Stream semantics.** deallocate(s0, p, ...) of a block with recorded streams s1..sn (other
/// than s0) records an event on each of them and holds p back; p is given to the upstream on s0
/// once every one of those events has completed, so no later allocation, on any stream, can get
/// p while work enqueued on s1..sn before the free may still use it. No stream waits on another:
/// the side streams' work never delays s0's (PyTorch's own allocator behaves the same way).
/// Held blocks are given back when a later allocate or deallocate finds their events complete,
/// by release_held() and trim() (which wait for them on the host), and by allocate before it
/// reports out-of-memory (it waits for them, gives them back and retries once). A block without
/// recorded streams costs one atomic load more than the upstream's deallocate.
/// Recording the free's own stream, or a stream twice, records nothing more.
///
/// **Graph capture.** While a capture is routed into the upstream's capture-private pools
/// (`capture_underway()` of a layer below, core/detail/layers.hpp), nothing here queries,
/// synchronizes or records an event: CUDA invalidates a capture begun in its global mode at an
/// event query from any thread, and an event recorded inside a capture cannot be queried. A block
/// freed then with recorded streams is held without events (deferred); held blocks are not looked
/// at; release_held(), trim() and allocate's retry give nothing back. The first call after the
/// capture ends records the deferred blocks' events on their streams (what PyTorch's caching
/// allocator does with blocks freed during a capture), and they then wait as any held block.
///
/// **Errors.** record() throws std::bad_alloc when it cannot note the use, and changes nothing
/// then. deallocate never throws: when an event cannot be created or recorded it waits on the host
/// for the recorded streams and gives the block back at once.
///
/// Thread safety: thread-safe (one mutex for the recorded uses and the held blocks; the upstream
/// as it is). Ownership: owns the upstream and the events; held blocks are given back when the
/// adaptor is destroyed, after waiting for their events.
/// Complexity: record O(1) expected; deallocate O(recorded streams); a scan of the held blocks,
/// O(held), runs only while some are held.
template <stream_ordered_resource Upstream>
class recorded_streams final {
public:
    using upstream_type = Upstream;
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using event_type = typename platform_type::event;

    static constexpr const char* name = "recorded_streams";

    template <class... Args>
    explicit recorded_streams(Args&&... upstream_args) : upstream_(std::forward<Args>(upstream_args)...) {}
    recorded_streams(const recorded_streams&) = delete;
    recorded_streams& operator=(const recorded_streams&) = delete;
    ~recorded_streams() { release(true, true); }

    /// Notes that work enqueued on `stream` uses `ptr` (a block of this resource, not yet freed).
    /// Strong guarantee: throws std::bad_alloc and notes nothing when memory runs out.
    void record(void* ptr, stream_type stream) {
        if (ptr == nullptr) return;
        std::lock_guard lock(mutex_);
        auto [it, inserted] = uses_.try_emplace(reinterpret_cast<std::uintptr_t>(ptr));
        std::vector<stream_type>& streams = it->second;
        if (std::find(streams.begin(), streams.end(), stream) != streams.end()) return;
        try {
            streams.push_back(stream);
        } catch (...) {
            if (inserted) uses_.erase(it);
            throw;
        }
        recorded_.store(uses_.size(), std::memory_order_release);
    }

    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        if (held_count_.load(std::memory_order_acquire) != 0) release_completed();
        try {
            return upstream_.allocate(stream, bytes, alignment);
        } catch (const out_of_memory&) {
            if (release_held() == 0) throw;
        }
        return upstream_.allocate(stream, bytes, alignment);
    }

    /// Gives `ptr` back on `stream`: at once without recorded streams, else once their work
    /// enqueued before this call has finished (see the class comment).
    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        if (recorded_.load(std::memory_order_acquire) == 0) { // the common case: nothing recorded at all
            upstream_.deallocate(stream, ptr, bytes, alignment);
        } else {
            deallocate_recorded(stream, ptr, bytes, alignment);
        }
        if (held_count_.load(std::memory_order_acquire) != 0) release_completed();
    }

    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        return allocate(stream_type{}, bytes, alignment);
    }
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        deallocate(stream_type{}, ptr, bytes, alignment);
    }

    /// Gives back every held block whose recorded work has finished, without waiting. Returns how
    /// many were given back (none while a capture is underway).
    std::size_t release_completed() noexcept { return release(false, false); }
    /// Waits on the host for the recorded work of every held block and gives them all back.
    /// Returns how many were given back (none, without waiting, while a capture is underway).
    std::size_t release_held() noexcept { return release(true, false); }

    /// The blocks held now (freed, waiting for their recorded streams' work), by address.
    [[nodiscard]] std::vector<std::uintptr_t> held_addresses() const {
        std::lock_guard lock(mutex_);
        std::vector<std::uintptr_t> out;
        out.reserve(held_.size());
        for (const held_block& b : held_) out.push_back(reinterpret_cast<std::uintptr_t>(b.ptr));
        return out;
    }

    /// Blocks freed but held for their recorded streams, and their bytes.
    [[nodiscard]] std::size_t held_blocks() const noexcept { return held_count_.load(std::memory_order_acquire); }
    [[nodiscard]] std::size_t held_bytes() const noexcept { return held_bytes_.load(std::memory_order_acquire); }

    /// Gives every held block back (waiting for its streams), then trims the upstream when it can.
    /// Returns the bytes the upstream gave back to its own upstream (0 when it cannot trim, and
    /// while a capture is underway: then it does nothing).
    std::size_t trim()
        requires requires(Upstream& u) {
            { u.trim() } -> std::convertible_to<std::size_t>;
        }
    {
        if (custody::detail::capture_underway(upstream_)) return 0;
        release_held();
        return upstream_.trim();
    }

    [[nodiscard]] resource_statistics statistics() const
        requires resource_with_statistics<Upstream>
    {
        return upstream_.statistics();
    }
    [[nodiscard]] auto detailed_statistics() const
        requires requires(const Upstream& u) { u.detailed_statistics(); }
    {
        return upstream_.detailed_statistics();
    }
    [[nodiscard]] int device() const
        requires device_bound_resource<Upstream>
    {
        return upstream_.device();
    }
    [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
    [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }

    friend bool operator==(const recorded_streams& a, const recorded_streams& b) noexcept { return &a == &b; }
    CUSTODY_FORWARD_PROPERTIES(recorded_streams, Upstream)
    CUSTODY_FORWARD_DISCARDING(Upstream, upstream_)

private:
    /// deallocate of a block that may have recorded streams.
    void deallocate_recorded(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        std::vector<stream_type> streams;
        {
            std::lock_guard lock(mutex_);
            if (auto it = uses_.find(reinterpret_cast<std::uintptr_t>(ptr)); it != uses_.end()) {
                streams = std::move(it->second);
                uses_.erase(it);
                recorded_.store(uses_.size(), std::memory_order_release);
            }
        }
        std::erase(streams, stream);
        if (streams.empty()) {
            upstream_.deallocate(stream, ptr, bytes, alignment);
        } else {
            hold(held_block{ptr, bytes, alignment, stream, {}, {}}, std::move(streams));
        }
    }

    /// A freed block waiting for the events recorded on its streams at the free, or, freed while
    /// a capture was underway, for those events to be recorded (deferred: `events` empty).
    struct held_block {
        void* ptr;
        std::size_t bytes;
        std::size_t alignment;
        stream_type stream; ///< the stream it was freed on, and is given back on
        std::vector<event_type> events;
        std::vector<stream_type> deferred; ///< the recorded streams, until their events are recorded
    };

    /// Keeps `block` until the work on `streams` enqueued before now has finished: records an
    /// event on each, or, while a capture is underway, defers that. When neither can be done,
    /// waits for the streams on the host and gives the block back now.
    void hold(held_block block, std::vector<stream_type> streams) noexcept {
        try {
            if (custody::detail::capture_underway(upstream_)) {
                block.deferred = std::move(streams);
            } else {
                record_events(block, streams);
            }
            std::lock_guard lock(mutex_);
            held_.push_back(std::move(block));
            held_count_.store(held_.size(), std::memory_order_release);
            held_bytes_.fetch_add(held_.back().bytes, std::memory_order_acq_rel);
            return;
        } catch (...) {
        }
        give_back_now(block, block.deferred.empty() ? streams : block.deferred);
    }

    /// Records an event on each of `streams` into `block.events`.
    void record_events(held_block& block, const std::vector<stream_type>& streams) {
        block.events.reserve(block.events.size() + streams.size());
        for (const stream_type& s : streams) {
            block.events.push_back(take_event(platform_type::stream_device(s)));
            block.events.back().record(s);
        }
    }

    /// Waits for `streams` on the host, then gives `block` back: when no event could be recorded.
    void give_back_now(const held_block& block, const std::vector<stream_type>& streams) noexcept {
        for (const stream_type& s : streams) {
            try {
                platform_type::synchronize(s);
            } catch (...) {
            }
        }
        upstream_.deallocate(block.stream, block.ptr, block.bytes, block.alignment);
    }

    /// Records the events of the blocks freed while a capture was underway (none is now).
    void record_deferred() noexcept {
        std::vector<held_block> deferred;
        {
            std::lock_guard lock(mutex_);
            if (std::none_of(held_.begin(), held_.end(), [](const held_block& b) { return !b.deferred.empty(); })) return;
            try {
                auto first = std::stable_partition(held_.begin(), held_.end(),
                                                   [](const held_block& b) { return b.deferred.empty(); });
                deferred.reserve(static_cast<std::size_t>(held_.end() - first));
                for (auto it = first; it != held_.end(); ++it) deferred.push_back(std::move(*it));
                held_.erase(first, held_.end());
            } catch (...) {
                return; // kept deferred: tried again by the next call
            }
        }
        for (held_block& b : deferred) {
            try {
                record_events(b, b.deferred);
                b.deferred.clear();
            } catch (...) {
                b.events.clear();
            }
            if (!b.deferred.empty()) {
                give_back_now(b, b.deferred);
                held_bytes_.fetch_sub(b.bytes, std::memory_order_acq_rel);
                b.ptr = nullptr;
            }
        }
        bool kept = false;
        {
            std::lock_guard lock(mutex_);
            try {
                held_.reserve(held_.size() + deferred.size());
                for (held_block& b : deferred) {
                    if (b.ptr != nullptr) held_.push_back(std::move(b)); // cannot throw: room reserved
                }
                kept = true;
            } catch (...) {
            }
            held_count_.store(held_.size(), std::memory_order_release);
        }
        if (kept) return;
        for (held_block& b : deferred) { // no memory to keep them: wait for their events here
            if (b.ptr == nullptr) continue;
            static_cast<void>(completed(b, true));
            held_bytes_.fetch_sub(b.bytes, std::memory_order_acq_rel);
            upstream_.deallocate(b.stream, b.ptr, b.bytes, b.alignment);
        }
    }

    /// An event of `device` from the stock, or a new one.
    event_type take_event(int device) {
        {
            std::lock_guard lock(mutex_);
            for (auto it = stock_.begin(); it != stock_.end(); ++it) {
                if (it->device() == device) {
                    event_type e = std::move(*it);
                    stock_.erase(it);
                    return e;
                }
            }
        }
        return event_type(device);
    }

    [[nodiscard]] static bool completed(const held_block& b, bool wait) noexcept {
        if (!b.deferred.empty()) return false;
        for (const event_type& e : b.events) {
            try {
                if (wait) {
                    e.synchronize();
                } else if (!e.ready()) {
                    return false;
                }
            } catch (...) {
                if (!wait) return false; // a failing query: keep the block rather than risk its reuse
            }
        }
        return true;
    }

    /// Gives back the held blocks whose events have completed (all of them, waiting for their
    /// events, when `wait`). Does nothing while a capture is underway, unless `at_destruction`.
    std::size_t release(bool wait, bool at_destruction) noexcept {
        if (held_count_.load(std::memory_order_acquire) == 0) return 0;
        if (!at_destruction && custody::detail::capture_underway(upstream_)) return 0;
        record_deferred();
        std::vector<held_block> done;
        {
            std::lock_guard lock(mutex_);
            if (held_.empty()) return 0;
            try {
                done.reserve(held_.size());
            } catch (...) {
                return 0;
            }
            auto keep = std::stable_partition(held_.begin(), held_.end(),
                                              [&](const held_block& b) { return !completed(b, wait); });
            for (auto it = keep; it != held_.end(); ++it) done.push_back(std::move(*it));
            held_.erase(keep, held_.end());
            held_count_.store(held_.size(), std::memory_order_release);
            for (held_block& b : done) {
                held_bytes_.fetch_sub(b.bytes, std::memory_order_acq_rel);
                for (event_type& e : b.events) {
                    try {
                        stock_.push_back(std::move(e));
                    } catch (...) {
                    }
                }
            }
        }
        for (held_block& b : done) upstream_.deallocate(b.stream, b.ptr, b.bytes, b.alignment);
        return done.size();
    }

    Upstream upstream_;
    mutable custody::detail::mutex mutex_;
    std::unordered_map<std::uintptr_t, std::vector<stream_type>> uses_; ///< live blocks' recorded streams
    std::vector<held_block> held_;                                       ///< freed, waiting for their events
    std::vector<event_type> stock_;                                      ///< completed events, for reuse
    std::atomic<std::size_t> recorded_{0};   ///< recorded_ == uses_.size()
    std::atomic<std::size_t> held_count_{0}; ///< held_count_ == held_.size()
    std::atomic<std::size_t> held_bytes_{0}; ///< held_bytes_ == sum of held_[i].bytes
};

} // namespace custody::resource
