/// @file
/// `virtual_memory`: a leaf resource that hands out blocks of one reserved address range, mapping
/// physical memory in granules when a block is allocated and unmapping it when the block comes back.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/platform.hpp>
#include <custody/platform/virtual_memory.hpp>
#include <custody/resource/virtual_reservation.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace custody::resource {

/// What a virtual_memory resource holds, beyond resource_statistics.
struct virtual_memory_statistics {
    std::size_t reserved_bytes = 0; ///< address space held (the reservation)
    std::size_t mapped_bytes = 0;   ///< physical memory mapped: live blocks rounded up to granules
    std::size_t granule = 0;        ///< unit of mapping
    std::size_t free_bytes = 0;     ///< address space not in use: reserved - live spans - claimed - withheld
    std::size_t largest_free = 0;   ///< the largest block that could be allocated now
    std::size_t withheld_bytes = 0; ///< address space of blocks whose unmap failed (never reused)
    std::size_t claimed_bytes = 0;  ///< address space claimed by strategies that place their own blocks
    std::size_t placed_bytes = 0;   ///< mapped by map_at inside those claims
    std::uint64_t map_calls = 0;    ///< allocations and map_at calls that mapped memory
    std::uint64_t unmap_calls = 0;  ///< deallocations and unmap_at calls that unmapped memory
};

/// Device memory mapped on demand into one address range reserved up front (`Vmm`: `cuda::vmm` for
/// a GPU, `host::vmm` for the host platform). Each block takes whole granules of the range, first
/// fit by address; its physical memory is created and mapped when it is allocated and unmapped and
/// released when it is given back, so what is not live is returned to the device at once. A block
/// never moves and the range never grows: the reservation is the resource's capacity.
///
/// Use it where memory must go back to the device when it is freed, where blocks must be
/// exportable to another process (NCCL, CUDA IPC), or as the upstream of a strategy that caches;
/// every allocate and deallocate is several driver calls, so do not put it on a hot path alone.
///
/// Device binding: the memory belongs to the resource's device; access is granted to it and to the
/// peers in the options (and grant_access). Stream semantics: mapping is synchronous, so memory is
/// usable by work on any stream at once; deallocate on a stream first waits for that stream (work
/// enqueued on it may still use the memory), then unmaps, as cudaFree does.
/// Thread safety: thread-safe (one mutex; driver calls are made under it).
/// Ownership: owns the reservation and all memory mapped into it; destruction gives everything back
/// (blocks still live are unmapped with it).
/// Complexity: O(log f) in the f free ranges plus the reservation's map or unmap of the block's
/// granules. Alignment: up to the granule. Equality: identity.
///
/// statistics().reserved_bytes is the physical memory mapped for live blocks (what the resource
/// holds of the device's memory), as for every resource; the address range is
/// vmm_statistics().reserved_bytes.
///
/// **One owner of the range.** The resource is the one owner of its address range, and every user
/// asks it. allocate takes the lowest free part that fits (first fit by address). A strategy that
/// places its own blocks (the pool grows in the range granule by granule, docs/pool.md) first
/// claims address space with claim(), which takes the highest free part that fits, and then maps and
/// unmaps granule-aligned pieces of its claim itself with map_at and unmap_at, in any order. Claimed
/// space is never handed out by allocate, nor claimed twice, whether mapped or not; a granule that
/// would not unmap stays mapped inside its claim (is_mapped tells which), so the claimant never
/// maps over it. Each mapped granule counts as one live block.
template <virtual_memory_operations Vmm>
class virtual_memory final {
public:
    using platform_type = typename Vmm::platform_type;
    using stream_type = typename platform_type::stream_view;
    using vmm_type = Vmm;
    static constexpr const char* name = "virtual_memory";

    /// Reserves `capacity` bytes of `device`'s address space (see virtual_reservation for what
    /// throws).
    virtual_memory(int device, std::size_t capacity, reservation_options options = {})
        : range_(device, capacity, std::move(options)) {
        free_.emplace(0, range_.reserved_bytes());
    }
    /// Reserves default_capacity(device) bytes of `device`'s address space.
    explicit virtual_memory(int device, reservation_options options = {})
        : virtual_memory(device, default_capacity(device), std::move(options)) {}

    /// Address space to reserve for `device` when none is given: four times the device's memory
    /// where the platform can tell (address space costs no memory, and a strategy that grows in the
    /// range keeps free holes in it), else 1 TiB.
    [[nodiscard]] static std::size_t default_capacity(int device) noexcept {
        const std::optional<device_memory> m = platform_type::memory_info(device);
        return m && m->total != 0 && m->total <= SIZE_MAX / 4 ? 4 * m->total : std::size_t{1} << 40;
    }
    virtual_memory(const virtual_memory&) = delete;
    virtual_memory& operator=(const virtual_memory&) = delete;
    ~virtual_memory() = default;

    [[nodiscard]] void* allocate(stream_type, std::size_t bytes, std::size_t alignment) {
        return allocate_sync(bytes, alignment);
    }
    [[nodiscard]] void* try_allocate(stream_type, std::size_t bytes, std::size_t alignment) noexcept {
        if (bytes == 0 || alignment > range_.granule()) return nullptr;
        try {
            return take(bytes);
        } catch (...) {
            return nullptr;
        }
    }
    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        // Unmapping while the stream may still use the block would fault its work: if the wait fails
        // (reported), the block is kept mapped and withheld instead.
        if (!run_exit_tolerant<platform_type>("custody: virtual_memory waiting for the stream of a freed block",
                                              [&] { platform_type::synchronize(stream); })) {
            withhold(bytes);
            return;
        }
        deallocate_sync(ptr, bytes, alignment);
    }

    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        check_alignment(alignment, range_.granule());
        if (bytes == 0) return nullptr;
        void* ptr = take(bytes);
        if (ptr == nullptr) {
            throw out_of_memory(bytes, alignment, device(), statistics(), name, describe_free());
        }
        return ptr;
    }
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t) noexcept {
        if (ptr == nullptr) return;
        const std::size_t span = align_up(bytes, range_.granule());
        const std::size_t offset = static_cast<std::size_t>(static_cast<std::byte*>(ptr) -
                                                            static_cast<std::byte*>(range_.base()));
        std::lock_guard lock(mutex_);
        bool unmapped = false;
        try {
            unmapped = range_.unmap(offset, span);
        } catch (const std::exception& e) { // a block this resource did not hand out
            report_noexcept_failure("virtual_memory::deallocate", e.what());
            return;
        }
        stats_.on_deallocate(bytes, span);
        ++unmap_calls_;
        if (unmapped) {
            give_back(offset, span);
        } else {
            withheld_ += span; // still partly mapped: never handed out again
        }
    }

    [[nodiscard]] resource_statistics statistics() const noexcept { return stats_.snapshot(); }

    /// Address space and physical memory, as they are now.
    [[nodiscard]] virtual_memory_statistics vmm_statistics() const {
        std::lock_guard lock(mutex_);
        virtual_memory_statistics s;
        s.reserved_bytes = range_.reserved_bytes();
        s.mapped_bytes = range_.mapped_bytes();
        s.granule = range_.granule();
        s.withheld_bytes = withheld_;
        s.claimed_bytes = claimed_bytes_;
        s.placed_bytes = placed_;
        s.map_calls = map_calls_;
        s.unmap_calls = unmap_calls_;
        for (const auto& [offset, length] : free_) {
            s.free_bytes += length;
            s.largest_free = std::max(s.largest_free, length);
        }
        return s;
    }

    [[nodiscard]] int device() const noexcept { return range_.device(); }
    [[nodiscard]] std::size_t granularity() const noexcept { return range_.granule(); }
    [[nodiscard]] std::size_t reserved_bytes() const noexcept { return range_.reserved_bytes(); }
    [[nodiscard]] std::size_t mapped_bytes() const {
        std::lock_guard lock(mutex_);
        return range_.mapped_bytes();
    }

    /// Lets `peer` read and write every block, live now or allocated later.
    void grant_access(int peer) {
        std::lock_guard lock(mutex_);
        range_.grant_access(peer);
    }

    /// A POSIX file descriptor for the physical memory of the granule of a live block that holds
    /// `ptr` (the options made the resource exportable), owned by the caller. Another process maps
    /// it granule by granule (cuMemImportFromShareableHandle).
    [[nodiscard]] int export_fd(const void* ptr) const {
        std::lock_guard lock(mutex_);
        const auto offset = static_cast<std::size_t>(static_cast<const std::byte*>(ptr) -
                                                     static_cast<const std::byte*>(range_.base()));
        return range_.export_fd(align_down(offset, range_.granule()));
    }

    // ---- placing blocks elsewhere (see the class comment) ----

    /// The first byte of the range: a strategy places its blocks at offsets from it.
    [[nodiscard]] void* base() const noexcept { return range_.base(); }

    /// Claims `bytes` (a multiple of the granule) of address space for a strategy that places its
    /// own blocks: the highest free part of the range that holds them, nothing mapped. nullptr,
    /// changing nothing, when no free part is that large (or no host memory is left for the
    /// bookkeeping).
    [[nodiscard]] void* claim(std::size_t bytes) noexcept {
        if (bytes == 0 || bytes % range_.granule() != 0) return nullptr;
        std::lock_guard lock(mutex_);
        for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
            if (it->second < bytes) continue;
            const std::size_t offset = it->first + it->second - bytes;
            try {
                claims_.emplace(offset, bytes);
            } catch (const std::bad_alloc&) {
                return nullptr;
            }
            if (it->second == bytes) {
                free_.erase(std::next(it).base());
            } else {
                it->second -= bytes;
            }
            claimed_bytes_ += bytes;
            return static_cast<std::byte*>(range_.base()) + offset;
        }
        return nullptr;
    }

    /// Gives back the claim at `ptr` (as claim() returned it), which must be wholly unmapped; a
    /// claim still mapped in part is kept, and reported.
    void unclaim(void* ptr) noexcept {
        const std::size_t offset = offset_of(ptr);
        std::lock_guard lock(mutex_);
        auto it = claims_.find(offset);
        if (it == claims_.end()) {
            report_noexcept_failure("virtual_memory::unclaim", "not a claim");
            return;
        }
        for (std::size_t g = 0; placed_ != 0 && g < it->second; g += range_.granule()) { // nothing placed: none mapped
            if (range_.is_mapped(offset + g)) {
                report_noexcept_failure("virtual_memory::unclaim", "the claim is still mapped in part; it is kept");
                return;
            }
        }
        claimed_bytes_ -= it->second;
        const std::size_t bytes = it->second;
        claims_.erase(it);
        give_back(offset, bytes);
    }

    /// Maps physical memory over [ptr, ptr + bytes): granule-aligned, inside one claim and not
    /// mapped yet (std::invalid_argument otherwise). Returns false, changing nothing, when the device
    /// has no physical memory left (or no host memory for the bookkeeping); any other failure
    /// throws and changes nothing. Usable by every stream at once.
    [[nodiscard]] bool map_at(void* ptr, std::size_t bytes) {
        const std::size_t offset = offset_of(ptr);
        std::lock_guard lock(mutex_);
        if (!claimed(offset, bytes)) {
            throw std::invalid_argument("custody: virtual_memory::map_at: [" + std::to_string(offset) + ", +" +
                                        std::to_string(bytes) + ") is not a granule-aligned part of a claim");
        }
        if (!range_.map(offset, bytes)) return false; // throws for a part already mapped
        stats_.on_allocate(bytes, bytes, bytes / range_.granule());
        placed_ += bytes;
        ++map_calls_;
        return true;
    }

    /// Unmaps [ptr, ptr + bytes), a granule-aligned part of a claim that map_at mapped, and gives its
    /// physical memory back; the caller makes sure no work still uses it. False when some granule
    /// would not unmap (reported): that granule stays mapped, inside its claim (is_mapped says
    /// which), and the others are unmapped.
    bool unmap_at(void* ptr, std::size_t bytes) noexcept {
        const std::size_t offset = offset_of(ptr);
        const std::size_t granule = range_.granule();
        std::lock_guard lock(mutex_);
        if (!claimed(offset, bytes) || bytes > placed_) {
            report_noexcept_failure("virtual_memory::unmap_at", "not a part of what map_at mapped");
            return false;
        }
        bool all = false;
        try {
            all = range_.unmap(offset, bytes);
        } catch (const std::exception& e) { // not all mapped: not what map_at mapped
            report_noexcept_failure("virtual_memory::unmap_at", e.what());
            return false;
        }
        ++unmap_calls_;
        std::size_t unmapped = bytes;
        if (!all) {
            for (std::size_t g = 0; g < bytes; g += granule) {
                if (range_.is_mapped(offset + g)) unmapped -= granule;
            }
        }
        stats_.on_deallocate(unmapped, unmapped, unmapped / granule);
        placed_ -= unmapped;
        return all;
    }

    /// Whether the granule that holds `ptr` (inside the range) is mapped.
    [[nodiscard]] bool is_mapped(const void* ptr) const {
        std::lock_guard lock(mutex_);
        return range_.is_mapped(align_down(offset_of(ptr), range_.granule()));
    }

    friend bool operator==(const virtual_memory& a, const virtual_memory& b) noexcept { return &a == &b; }
    friend void get_property(const virtual_memory&, device_accessible) noexcept {}
    friend void get_property(const virtual_memory&, host_accessible) noexcept
        requires(platform_type::name == std::string_view("host"))
    {}

private:
    /// [offset, offset + bytes) is a non-empty, granule-aligned part of one claim (mutex_ held).
    [[nodiscard]] bool claimed(std::size_t offset, std::size_t bytes) const noexcept {
        if (bytes == 0 || bytes % range_.granule() != 0 || offset % range_.granule() != 0) return false;
        auto it = claims_.upper_bound(offset);
        if (it == claims_.begin()) return false;
        --it;
        return offset - it->first <= it->second && bytes <= it->second - (offset - it->first);
    }

    [[nodiscard]] std::size_t offset_of(const void* ptr) const noexcept {
        return static_cast<std::size_t>(static_cast<const std::byte*>(ptr) - static_cast<const std::byte*>(range_.base()));
    }

    /// A block of `bytes`, mapped, or nullptr when neither address space nor physical memory is
    /// left; other failures throw. Either way nothing changes unless a block is returned.
    void* take(std::size_t bytes) {
        const std::size_t granule = range_.granule();
        if (align_up_overflows(bytes, granule)) return nullptr;
        const std::size_t span = align_up(bytes, granule);
        std::lock_guard lock(mutex_);
        auto it = free_.begin();
        while (it != free_.end() && it->second < span) ++it;
        if (it == free_.end()) return nullptr;
        const std::size_t offset = it->first;
        if (!range_.map(offset, span)) return nullptr;
        // From here nothing throws: the free range shrinks in place (its node is re-keyed).
        if (it->second == span) {
            free_.erase(it);
        } else {
            auto node = free_.extract(it);
            node.key() += span;
            node.mapped() -= span;
            free_.insert(std::move(node));
        }
        stats_.on_allocate(bytes, span);
        ++map_calls_;
        return static_cast<std::byte*>(range_.base()) + offset;
    }

    /// Gives up a live block without unmapping it: it stops counting as live and its part of the
    /// range is never handed out again (destruction unmaps it with the rest).
    void withhold(std::size_t bytes) noexcept {
        const std::size_t span = align_up(bytes, range_.granule());
        std::lock_guard lock(mutex_);
        stats_.on_deallocate(bytes, span);
        withheld_ += span;
    }

    /// Returns [offset, offset+span) to the free ranges, merged with its neighbours.
    void give_back(std::size_t offset, std::size_t span) noexcept {
        auto next = free_.lower_bound(offset);
        if (next != free_.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second == offset) {
                prev->second += span;
                if (next != free_.end() && prev->first + prev->second == next->first) {
                    prev->second += next->second;
                    free_.erase(next);
                }
                return;
            }
        }
        if (next != free_.end() && offset + span == next->first) {
            auto node = free_.extract(next);
            node.key() = offset;
            node.mapped() += span;
            free_.insert(std::move(node));
            return;
        }
        try {
            free_.emplace(offset, span);
        } catch (const std::exception& e) { // no memory for a node: the range is lost, not reused
            withheld_ += span;
            report_noexcept_failure("virtual_memory::deallocate", e.what());
        }
    }

    [[nodiscard]] std::string describe_free() const {
        const virtual_memory_statistics s = vmm_statistics();
        return "reserved " + std::to_string(s.reserved_bytes) + " B, mapped " + std::to_string(s.mapped_bytes) +
               " B, largest free range " + std::to_string(s.largest_free) + " B, granule " +
               std::to_string(s.granule) + " B";
    }

    mutable custody::detail::mutex mutex_;
    virtual_reservation<Vmm> range_;        // guarded by mutex_
    // Guarded by mutex_; the range's address space is in exactly one of them:
    //   sum(free_ lengths) + sum(live spans) + claimed_bytes_ + withheld_ == reserved
    std::map<std::size_t, std::size_t> free_;   // offset -> length: disjoint, not adjacent, granule-aligned
    std::map<std::size_t, std::size_t> claims_; // offset -> length: claimed by a strategy (claim())
    std::size_t claimed_bytes_ = 0;             // = sum(claims_ lengths)
    std::size_t withheld_ = 0;                  // live spans whose unmap failed: never handed out again
    std::size_t placed_ = 0;                    // mapped by map_at inside claims: placed_ <= claimed_bytes_
    std::uint64_t map_calls_ = 0;           // guarded by mutex_
    std::uint64_t unmap_calls_ = 0;         // guarded by mutex_
    statistics_counter stats_;              // live_bytes = sum of live requests; reserved_bytes = their spans
};

} // namespace custody::resource
