/// @file
/// `segment_journal<Upstream>`: an adaptor between a pool and the memory it takes, that knows the
/// segments the pool holds (every block it took from `Upstream` and has not given back) and writes
/// their comings and goings into an allocation_history: the segments of a PyTorch memory snapshot
/// (debug/pytorch_snapshot.hpp).
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/discarding.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/statistics.hpp>
#include <custody/debug/history.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace custody::debug {

/// A block a pool holds from its upstream. `stream`: the platform's stream key it was taken on.
struct memory_segment {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
    std::uintptr_t stream = 0;
    std::int64_t unix_ns = 0; ///< when it was taken
    bool mapped = false;      ///< a run the pool mapped (map_at), joined with the runs it touches
};

/// Forwards every call to `Upstream` (held by value, constructed in place from the trailing
/// constructor arguments) and notes each block it hands out as a segment until it comes back,
/// recording segment_alloc and segment_free in `history` (when given). Meant to sit under a pool
/// (stream_ordered_pool<segment_journal<cuda_async>>), whose chunks are then the segments; what the
/// upstream can tell of itself (trim, retained_bytes, pool_handle, device, properties) is forwarded.
/// Over an upstream a pool grows in by mapping (resource::virtual_memory: claim, map_at, unmap_at),
/// the mapping is forwarded too, and each contiguous mapped run is one segment (as PyTorch's expandable
/// segments are), recorded as segment_map and segment_unmap: a block never crosses its run's ends.
///
/// Stream semantics, errors: the upstream's. A segment that cannot be noted (no host memory) is
/// given back and the call fails as the upstream's would (bad_alloc; nullptr from try_allocate).
/// Thread safety: thread-safe (one mutex for the segments, never held while calling the upstream).
/// Ownership: owns its upstream; shares the history. Complexity: the upstream's, plus O(log n).
/// Equality: identity.
template <stream_ordered_resource Upstream>
class segment_journal final {
public:
    using upstream_type = Upstream;
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;

    static constexpr const char* name = "segment_journal";
    /// The upstream's largest alignment (256 where it declares none, as every resource serves).
    static constexpr std::size_t max_alignment = [] {
        if constexpr (requires { Upstream::max_alignment; }) {
            return static_cast<std::size_t>(Upstream::max_alignment);
        } else {
            return std::size_t{256};
        }
    }();

    template <class... Args>
    explicit segment_journal(std::shared_ptr<allocation_history> history, Args&&... upstream_args)
        : upstream_(std::forward<Args>(upstream_args)...), history_(std::move(history)) {}
    segment_journal(const segment_journal&) = delete;
    segment_journal& operator=(const segment_journal&) = delete;

    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        void* p = upstream_.allocate(stream, bytes, alignment);
        if (p != nullptr && !note_taken(p, bytes, platform_type::stream_key(stream))) {
            upstream_.deallocate(stream, p, bytes, alignment);
            throw std::bad_alloc();
        }
        return p;
    }
    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        note_given(ptr, bytes, platform_type::stream_key(stream));
        upstream_.deallocate(stream, ptr, bytes, alignment);
    }
    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        void* p = upstream_.allocate_sync(bytes, alignment);
        if (p != nullptr && !note_taken(p, bytes, 0)) {
            upstream_.deallocate_sync(p, bytes, alignment);
            throw std::bad_alloc();
        }
        return p;
    }
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        note_given(ptr, bytes, 0);
        upstream_.deallocate_sync(ptr, bytes, alignment);
    }
    /// Non-throwing allocate, how a pool grows: nullptr when the upstream has no memory.
    [[nodiscard]] void* try_allocate(stream_type stream, std::size_t bytes, std::size_t alignment) noexcept {
        void* p = custody::try_allocate(upstream_, stream, bytes, alignment);
        if (p != nullptr && !note_taken(p, bytes, platform_type::stream_key(stream))) {
            upstream_.deallocate(stream, p, bytes, alignment);
            return nullptr;
        }
        return p;
    }

    /// The segments held now, by address.
    [[nodiscard]] std::vector<memory_segment> segments() const {
        std::lock_guard lock(mutex_);
        std::vector<memory_segment> out;
        out.reserve(segments_.size());
        for (const auto& [address, s] : segments_) out.push_back(s);
        return out;
    }

    // ---- growth by mapping, where the upstream offers it (resource::virtual_memory) ----

    /// Maps [ptr, ptr + bytes) as the upstream does, and notes it joined to the mapped segments it
    /// touches. False (nothing mapped) when the upstream has no memory, or none is left to note it.
    [[nodiscard]] bool map_at(void* ptr, std::size_t bytes)
        requires requires(Upstream& u) { { u.map_at(ptr, bytes) } -> std::same_as<bool>; }
    {
        if (!upstream_.map_at(ptr, bytes)) return false;
        if (!note_mapped(reinterpret_cast<std::uintptr_t>(ptr), bytes)) {
            static_cast<void>(upstream_.unmap_at(ptr, bytes));
            return false;
        }
        return true;
    }
    /// Unmaps [ptr, ptr + bytes) as the upstream does, cutting it out of its mapped segment.
    bool unmap_at(void* ptr, std::size_t bytes) noexcept
        requires requires(Upstream& u) { { u.unmap_at(ptr, bytes) } noexcept -> std::same_as<bool>; }
    {
        note_unmapped(reinterpret_cast<std::uintptr_t>(ptr), bytes);
        return upstream_.unmap_at(ptr, bytes);
    }
    /// Address space claimed for the pool to map into, as the upstream claims it (nothing mapped:
    /// no segment yet).
    [[nodiscard]] void* claim(std::size_t bytes) noexcept
        requires requires(Upstream& u) { { u.claim(bytes) } noexcept -> std::same_as<void*>; }
    {
        return upstream_.claim(bytes);
    }
    void unclaim(void* ptr) noexcept
        requires requires(Upstream& u) { { u.unclaim(ptr) } noexcept; }
    {
        upstream_.unclaim(ptr);
    }
    [[nodiscard]] bool is_mapped(const void* ptr) const
        requires requires(const Upstream& u) { { u.is_mapped(ptr) } -> std::same_as<bool>; }
    {
        return upstream_.is_mapped(ptr);
    }
    [[nodiscard]] void* base() const noexcept
        requires requires(const Upstream& u) { u.base(); }
    {
        return upstream_.base();
    }
    [[nodiscard]] std::size_t reserved_bytes() const noexcept
        requires requires(const Upstream& u) { u.reserved_bytes(); }
    {
        return upstream_.reserved_bytes();
    }
    [[nodiscard]] std::size_t granularity() const noexcept
        requires requires(const Upstream& u) { u.granularity(); }
    {
        return upstream_.granularity();
    }

    // ---- what the upstream tells of itself ----

    std::size_t trim()
        requires requires(Upstream& u) { u.trim(); }
    {
        return upstream_.trim();
    }
    [[nodiscard]] std::size_t retained_bytes() const noexcept
        requires requires(const Upstream& u) { u.retained_bytes(); }
    {
        return upstream_.retained_bytes();
    }
    [[nodiscard]] auto pool_handle() const noexcept
        requires requires(const Upstream& u) { u.pool_handle(); }
    {
        return upstream_.pool_handle();
    }
    [[nodiscard]] resource_statistics statistics() const
        requires resource_with_statistics<Upstream>
    {
        return upstream_.statistics();
    }
    [[nodiscard]] auto device() const noexcept
        requires device_bound_resource<Upstream>
    {
        return upstream_.device();
    }
    [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
    [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }
    [[nodiscard]] const std::shared_ptr<allocation_history>& history() const noexcept { return history_; }

    friend bool operator==(const segment_journal& a, const segment_journal& b) noexcept { return &a == &b; }
    CUSTODY_FORWARD_PROPERTIES(segment_journal, Upstream)
    CUSTODY_FORWARD_DISCARDING(Upstream, upstream_)

private:
    /// Notes a segment taken; false when there is no memory to note it (nothing noted then).
    bool note_taken(void* p, std::size_t bytes, std::uintptr_t stream) noexcept {
        const memory_segment s{reinterpret_cast<std::uintptr_t>(p), bytes, stream, allocation_history::unix_now_ns()};
        try {
            std::lock_guard lock(mutex_);
            segments_.insert_or_assign(s.address, s);
        } catch (...) {
            return false;
        }
        if (history_) history_->record(history_event{history_action::segment_alloc, s.address, bytes, stream, s.unix_ns, nullptr, {}});
        return true;
    }
    void note_given(void* p, std::size_t bytes, std::uintptr_t stream) noexcept {
        const auto address = reinterpret_cast<std::uintptr_t>(p);
        {
            std::lock_guard lock(mutex_);
            segments_.erase(address);
        }
        if (history_) {
            history_->record(history_event{history_action::segment_free, address, bytes, stream,
                                           allocation_history::unix_now_ns(), nullptr, {}});
        }
    }

    /// Notes [address, address + bytes) mapped: one segment with the mapped segments ending at
    /// address and starting at its end. False when there is no host memory to note it.
    bool note_mapped(std::uintptr_t address, std::size_t bytes) noexcept {
        const std::int64_t now = allocation_history::unix_now_ns();
        try {
            std::lock_guard lock(mutex_);
            memory_segment joined{address, bytes, 0, now, true};
            auto after = segments_.find(address + bytes);
            auto before = segments_.lower_bound(address);
            if (before != segments_.begin()) --before;
            const bool join_before = before != segments_.end() && before->second.mapped &&
                                     before->first + before->second.bytes == address;
            const bool join_after = after != segments_.end() && after->second.mapped;
            if (join_before) {
                joined.address = before->first;
                joined.bytes += before->second.bytes;
                joined.unix_ns = before->second.unix_ns;
            }
            if (join_after) joined.bytes += after->second.bytes;
            segments_.insert_or_assign(joined.address, joined); // may throw: nothing changed yet
            if (join_after) segments_.erase(after);
        } catch (...) {
            return false;
        }
        if (history_) history_->record(history_event{history_action::segment_map, address, bytes, 0, now, nullptr, {}});
        return true;
    }
    /// Notes [address, address + bytes) unmapped: cut out of the mapped segment holding it, which
    /// may split in two (when there is no host memory for the second part, it is dropped from
    /// the notes; the memory itself is unaffected).
    void note_unmapped(std::uintptr_t address, std::size_t bytes) noexcept {
        {
            std::lock_guard lock(mutex_);
            auto it = segments_.upper_bound(address);
            if (it != segments_.begin()) {
                --it;
                memory_segment& s = it->second;
                if (s.mapped && address + bytes <= s.address + s.bytes) {
                    const memory_segment tail{address + bytes, s.address + s.bytes - address - bytes, s.stream, s.unix_ns, true};
                    s.bytes = address - s.address;
                    if (s.bytes == 0) segments_.erase(it);
                    if (tail.bytes != 0) {
                        try {
                            segments_.insert_or_assign(tail.address, tail);
                        } catch (...) {
                        }
                    }
                }
            }
        }
        if (history_) {
            history_->record(history_event{history_action::segment_unmap, address, bytes, 0,
                                           allocation_history::unix_now_ns(), nullptr, {}});
        }
    }

    Upstream upstream_;
    std::shared_ptr<allocation_history> history_; ///< null: no history kept
    mutable custody::detail::mutex mutex_;
    std::map<std::uintptr_t, memory_segment> segments_; ///< address -> the segment held there
};

} // namespace custody::debug
