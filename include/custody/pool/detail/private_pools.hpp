/// @file
/// `private_chunks`: the memory of a pool's capture-private pools: their chunks, taken from the
/// pool's upstream on a stream of their own and given back when wholly free, their free blocks, and
/// the lock-free index of their address ranges that the pool's common path asks.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/capture.hpp>
#include <custody/pool/capture_pool_id.hpp>
#include <custody/pool/detail/address_ranges.hpp>
#include <custody/pool/detail/free_set.hpp>
#include <custody/pool/detail/growth.hpp>
#include <custody/pool/detail/size_classes.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace custody::pool::detail {

/// What a capture_store holds, for the pool's statistics. A plain value.
///   reserved_bytes = live_block_bytes + free_bytes + lost_bytes
struct capture_figures {
    std::size_t reserved_bytes = 0;   ///< chunks held by private pools
    std::size_t live_bytes = 0;       ///< requested bytes of the private blocks handed out
    std::size_t live_block_bytes = 0; ///< the same blocks' bytes, rounded to the granule
    std::size_t free_bytes = 0;       ///< free in private pools (reusable by their later captures only)
    std::size_t lost_bytes = 0;       ///< given back when no host memory could record them: unused until released
    std::size_t pools = 0;            ///< private pools alive (holding memory or held by a graph)
    std::size_t routes = 0;           ///< begin_allocate_to_pool calls not yet ended
    std::size_t chunks = 0;
    std::uint64_t allocations = 0;
    std::uint64_t deallocations = 0;
    std::uint64_t upstream_allocations = 0;
    std::uint64_t upstream_deallocations = 0;

    /// The private pools' share of a resource's statistics (no peaks: the owner keeps those).
    [[nodiscard]] resource_statistics totals() const noexcept {
        resource_statistics s;
        s.live_bytes = live_bytes;
        s.reserved_bytes = reserved_bytes;
        s.allocations = allocations;
        s.deallocations = deallocations;
        s.live_allocations = static_cast<std::size_t>(allocations - deallocations);
        return s;
    }
};

/// One capture-private pool.
///   reserved = sum of chunks = block_bytes + common.bytes() + sum of pending[*].bytes() + lost
///   pending is empty unless routing
struct private_pool {
    capture_pool_id id;
    std::size_t holds = 0;       ///< begin_route calls not yet released
    bool routing = false;        ///< a route to it is open
    std::map<std::uintptr_t, std::size_t> chunks; ///< base -> size
    std::size_t reserved = 0;    ///< sum of chunks' sizes
    std::size_t block_bytes = 0; ///< handed out, rounded
    std::size_t lost = 0;
    free_set common;             ///< free for any later allocation routed here
    std::map<std::uintptr_t, free_set> pending; ///< stream key -> given back there during the route
};

/// The capture "{first, second}" as text.
inline std::string text(capture_pool_id id) { return "{" + std::to_string(id.first) + ", " + std::to_string(id.second) + "}"; }

/// The chunks and blocks of the private pools of a pool over `Upstream`.
///
/// Invariants (under the owner's mutex): chunk_owner_ and ranges_ hold exactly the chunks of every
/// pool; reserved_ = sum of the pools' reserved.
/// Thread safety: the owner's lock guards every call but owns() and reserved_bytes() (lock-free).
/// Ownership: owns the chunks, taken from and given back to the upstream, which outlives it. It
/// takes them under a relaxed capture mode, on a stream of its own (never the default stream: over
/// cudaMallocAsync the legacy default stream takes part in any blocking stream's capture), and
/// announces each to CUDA's tools as a heap that is one region, named after its pool.
template <stream_ordered_resource Upstream>
class private_chunks {
public:
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using limit_type = std::function<bool(std::size_t)>;

    /// The GPU's large page: a private chunk is growth_step, or the request rounded up to this.
    static constexpr std::size_t chunk_rounding = std::size_t{2} << 20;

    private_chunks(Upstream& upstream, int device, std::size_t chunk_alignment, std::size_t growth_step, limit_type may_take,
                   custody::detail::memory_annotations& annotations)
        : upstream_(upstream), device_(device), chunk_alignment_(chunk_alignment), growth_step_(growth_step),
          may_take_(std::move(may_take)), annotations_(annotations) {}
    private_chunks(const private_chunks&) = delete;
    private_chunks& operator=(const private_chunks&) = delete;

    /// Waits for the device (a replay may still use private memory) and gives every chunk back.
    void release_all() noexcept {
        if (chunk_owner_.empty()) return;
        try {
            synchronize_devices();
        } catch (...) {
            report_failure("stream_ordered_pool: synchronizing the device failed before giving capture memory back");
        }
        for (auto& [base, pool] : chunk_owner_) {
            annotations_.heap_returned(reinterpret_cast<void*>(base));
            upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(base), pool->chunks.at(base), chunk_alignment_);
        }
    }

    /// `address` lies in private memory. Lock-free; one compare while no private chunk lies near it.
    [[nodiscard, gnu::always_inline]] bool owns(std::uintptr_t address) const noexcept { return ranges_.contains(address); }
    [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved_.load(std::memory_order_relaxed); }

    /// A block of `bytes` at `alignment` from `p` for the stream of `key`: one it gave back during
    /// the route, else p's common set, else a new chunk. Size 0 when none can be had. Strong.
    free_block take(private_pool& p, std::uintptr_t key, std::size_t bytes, std::size_t alignment) {
        const std::size_t size = align_up(bytes, granule);
        free_block b;
        if (auto pending = p.pending.find(key); pending != p.pending.end()) b = pending->second.take(size, alignment);
        if (b.size == 0) b = p.common.take(size, alignment);
        if (b.size == 0 && grow(p, size, alignment)) b = p.common.take(size, alignment);
        if (b.size == 0) return b;
        p.block_bytes += b.size;
        live_bytes_ += bytes;
        ++allocations_;
        return b;
    }
    /// Takes back a private block (owns(address)) given back on the stream of `key`: to its pool's
    /// pending set while routed, else its common set. Returns its pool.
    private_pool* give(std::uintptr_t key, std::uintptr_t address, std::size_t bytes) noexcept {
        auto it = chunk_owner_.upper_bound(address);
        if (it == chunk_owner_.begin()) return nullptr; // unreachable: owns(address)
        --it;
        private_pool& p = *it->second;
        const free_block b{address, align_up(bytes, granule), it->first};
        p.block_bytes -= b.size;
        live_bytes_ -= bytes;
        ++deallocations_;
        try {
            keep_free(p, p.routing ? p.pending[key] : p.common, b);
        } catch (...) {
            lose(p, b.size);
        }
        return &p;
    }
    /// Puts `b` into `set` of `p`; counted lost when there is no host memory for it.
    void keep_free(private_pool& p, free_set& set, const free_block& b) noexcept {
        try {
            set.insert(b);
        } catch (...) {
            lose(p, b.size);
        }
    }

    /// Gives back the wholly free chunks of `released` (pools without holds), after waiting for the
    /// device (a graph replay may still be using them); returns the bytes.
    std::size_t give_back(const std::vector<private_pool*>& released) noexcept {
        const auto whole = [](const private_pool& p) {
            return [&p](std::uintptr_t address, std::size_t size) {
                auto c = p.chunks.find(address);
                return c != p.chunks.end() && c->second == size;
            };
        };
        bool any = false;
        for (private_pool* p : released) {
            p->common.for_each([&](const free_block& b) { any = any || whole(*p)(b.address, b.size); });
        }
        if (!any) return 0;
        try {
            synchronize_devices();
        } catch (...) {
            report_failure("stream_ordered_pool: synchronizing the device failed; capture memory is kept for now");
            return 0;
        }
        std::size_t given = 0;
        for (private_pool* p : released) {
            p->common.take_whole_chunks(whole(*p), [&](const free_block& b) {
                p->chunks.erase(b.address);
                chunk_owner_.erase(b.address);
                ranges_.erase(b.address);
                p->reserved -= b.size;
                reserved_.fetch_sub(b.size, std::memory_order_relaxed);
                annotations_.heap_returned(reinterpret_cast<void*>(b.address));
                upstream_.deallocate(stream_type{}, reinterpret_cast<void*>(b.address), b.size, chunk_alignment_);
                ++upstream_deallocations_;
                given += b.size;
            });
        }
        return given;
    }

    /// Adds the chunks' figures to `f` (the pools' own figures are the owner's to add).
    void add_to(capture_figures& f) const noexcept {
        f.live_bytes = live_bytes_;
        f.allocations = allocations_;
        f.deallocations = deallocations_;
        f.upstream_allocations = upstream_allocations_;
        f.upstream_deallocations = upstream_deallocations_;
    }

    /// Waits for all work on the pool's device (every device, for a pool of no device).
    void synchronize_devices() const {
        if (device_ >= 0) {
            platform_type::synchronize_device(device_);
        } else {
            for (int d = 0; d < platform_type::device_count(); ++d) platform_type::synchronize_device(d);
        }
    }

private:
    /// Takes a chunk for `size` bytes at `alignment` into p's common set. Strong. Under a relaxed
    /// capture mode from the start: the owner's limit may ask the device for its free memory
    /// (cudaMemGetInfo), as potentially unsafe as taking the memory.
    bool grow(private_pool& p, std::size_t size, std::size_t alignment) {
        const basic_capture_mode_guard<platform_type> relaxed(capture_mode::relaxed);
        const std::size_t need = size + (alignment > chunk_alignment_ ? alignment - chunk_alignment_ : 0);
        const std::size_t preferred = need <= growth_step_ ? growth_step_ : align_up(need, chunk_rounding);
        const std::size_t tries[2] = {preferred, need}; // the exact need when the preferred chunk is refused
        for (std::size_t i = 0; i < (preferred == need ? 1U : 2U); ++i) {
            const std::size_t n = tries[i];
            if (!may_take_(n)) continue;
            ranges_.reserve(ranges_.size() + 1);
            // On the store's own stream (made at the first growth), synchronized: usable by every stream.
            void* ptr = take_waited(upstream_, growth_stream_, device_, n, chunk_alignment_);
            if (ptr == nullptr) continue;
            const auto base = reinterpret_cast<std::uintptr_t>(ptr);
            try {
                p.chunks.emplace(base, n);
                try {
                    chunk_owner_.emplace(base, &p);
                    p.common.insert({base, n, base});
                } catch (...) {
                    chunk_owner_.erase(base);
                    throw;
                }
            } catch (...) {
                p.chunks.erase(base);
                upstream_.deallocate(growth_stream_->view(), ptr, n, chunk_alignment_);
                throw;
            }
            ranges_.insert(base, base + n); // room reserved above
            announce(p, ptr, n);
            p.reserved += n;
            reserved_.fetch_add(n, std::memory_order_relaxed);
            ++upstream_allocations_;
            return true;
        }
        return false;
    }

    /// Announces a new chunk of `p` to CUDA's tools: a heap that is one region, named after `p`.
    void announce(const private_pool& p, const void* chunk, std::size_t n) noexcept {
        if (!annotations_.on()) return; // spares the name
        try {
            annotations_.heap_taken(chunk, n, "custody capture pool " + text(p.id), /*whole=*/true);
        } catch (...) { // no memory for the name: the chunk goes unannounced
        }
    }
    void lose(private_pool& p, std::size_t size) noexcept {
        p.lost += size;
        report_failure("stream_ordered_pool: no host memory to record a free capture block; it stays unused until its pool is released");
    }

    Upstream& upstream_;
    const int device_;
    const std::size_t chunk_alignment_;
    const std::size_t growth_step_;
    const limit_type may_take_;
    custody::detail::memory_annotations& annotations_;
    std::optional<typename platform_type::stream> growth_stream_; ///< made at the first growth
    std::map<std::uintptr_t, private_pool*> chunk_owner_;        ///< chunk base -> its pool
    address_ranges ranges_;
    std::atomic<std::size_t> reserved_{0};
    std::size_t live_bytes_ = 0;
    std::uint64_t allocations_ = 0;
    std::uint64_t deallocations_ = 0;
    std::uint64_t upstream_allocations_ = 0;
    std::uint64_t upstream_deallocations_ = 0;
};

} // namespace custody::pool::detail
