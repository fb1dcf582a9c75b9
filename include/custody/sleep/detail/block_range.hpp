/// @file
/// `block_range`: one block's address range, reserved for the block's life, with the physical
/// memory of the whole range mapped into it as one piece while its owner is awake, and none while
/// it sleeps; and the checks of the unit blocks are rounded to and of the devices they are shared
/// with.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/error.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/virtual_memory.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace custody::sleep::detail {

/// The unit blocks of `device` are rounded up to: `granule`, or the device's granularity for 0.
/// Throws std::invalid_argument for a device without virtual memory management, or a granule that
/// is not a power-of-two multiple of the device's.
template <virtual_memory_operations Vmm>
std::size_t checked_granule(int device, std::size_t granule) {
    if (!Vmm::supported(device)) {
        throw std::invalid_argument("custody: device " + std::to_string(device) + " has no virtual memory management");
    }
    const std::size_t minimum = Vmm::granularity(device);
    const std::size_t g = granule == 0 ? minimum : granule;
    if (!is_pow2(g) || g < minimum || g % minimum != 0) {
        throw std::invalid_argument("custody: granule " + std::to_string(granule) +
                                    " is not a power-of-two multiple of the device's " + std::to_string(minimum));
    }
    return g;
}

/// `asked`, without duplicates and without `device`. Throws std::invalid_argument for a peer that
/// does not exist.
template <virtual_memory_operations Vmm>
std::vector<int> checked_peers(int device, const std::vector<int>& asked) {
    std::vector<int> peers;
    for (int p : asked) {
        if (!Vmm::supported(p)) throw std::invalid_argument("custody: peer device " + std::to_string(p) + " does not exist");
        if (p != device && std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);
    }
    return peers;
}

/// A range of `Vmm`'s address space (reserved on construction, freed on destruction) into which
/// one physical allocation of the range's whole size is mapped, or none.
///
/// One piece, unlike virtual_reservation's one allocation per granule: a block is never partly
/// unmapped, so a block of any size costs a create, a map and a set_access to wake and an unmap and
/// a release to sleep (five driver calls), where granules would cost two or three per granule
/// (24,000 granules of 2 MiB for a 47 GiB KV cache). The size is any multiple of the device's
/// granularity, as cuMemCreate takes.
///
/// map() either maps the whole range with the access of `access` or changes nothing (false when the
/// device has no memory, a throw otherwise; the one exception: a failed map whose own undo cannot
/// unmap keeps the memory mapped, reported, rather than release memory still mapped: the range is
/// then mapped but not usable, its access unknown, and nothing is copied into it until a later
/// map() has unmapped it and mapped it anew). unmap() gives the memory back at once, or keeps it
/// mapped when the platform refuses (reported).
/// Not thread-safe: the resource serializes the calls. No stream semantics: the caller makes sure
/// no work uses a range it unmaps. Owns the range and the memory mapped into it; destruction
/// unmaps and releases it, then frees the range (kept, and reported, if it would not unmap).
template <virtual_memory_operations Vmm>
class block_range {
public:
    using handle = typename Vmm::handle;

    /// Reserves `span` bytes (a multiple of Vmm::granularity(device)) aligned to `alignment` (a
    /// power of two), nothing mapped. `access`: the devices the memory is made accessible to, the
    /// owner first. Throws custody::out_of_memory when there is no address space left.
    block_range(int device, std::size_t span, std::size_t alignment, std::vector<int> access)
        : device_(device), span_(span), access_(std::move(access)) {
        base_ = Vmm::reserve(device, span, alignment);
        if (base_ == nullptr) {
            throw out_of_memory(span, alignment, device, resource_statistics{}, "sleepable_memory",
                                "no address space left to reserve");
        }
    }
    block_range(const block_range&) = delete;
    block_range& operator=(const block_range&) = delete;
    ~block_range() {
        if (unmap()) Vmm::free_reservation(device_, base_, span_);
    }

    [[nodiscard]] void* base() const noexcept { return base_; }
    [[nodiscard]] std::size_t span() const noexcept { return span_; }
    [[nodiscard]] bool is_mapped() const noexcept { return memory_.has_value(); }
    /// Mapped with the access of access(): what may be read and written. A mapped range whose map
    /// failed half way (its undo would not unmap) is not.
    [[nodiscard]] bool is_usable() const noexcept { return memory_.has_value() && usable_; }
    /// Physical memory held: span() when mapped, else 0.
    [[nodiscard]] std::size_t mapped_bytes() const noexcept { return memory_ ? span_ : 0; }
    /// The devices that can access the memory when it is mapped, the owner first.
    [[nodiscard]] const std::vector<int>& access() const noexcept { return access_; }

    /// Maps memory over the whole range, accessible to access(); false, changing nothing, when the
    /// device has no memory for it (create finds none, or a platform that commits memory at map or
    /// set_access throws out_of_memory there). A range a failed map left mapped but not usable is
    /// unmapped first: custody::error when it still will not. Precondition: !is_usable().
    [[nodiscard]] bool map() {
        if (!unmap()) throw error("custody: sleepable_memory: a block whose failed map left it mapped will not unmap");
        const std::optional<handle> h = Vmm::create(device_, span_, false);
        if (!h) return false;
        try {
            Vmm::map(base_, span_, *h);
        } catch (const out_of_memory&) {
            Vmm::release(*h);
            return false;
        } catch (...) {
            Vmm::release(*h);
            throw;
        }
        try {
            Vmm::set_access(base_, span_, std::span<const int>(access_));
        } catch (const out_of_memory&) {
            undo_map(*h);
            return false;
        } catch (...) {
            undo_map(*h);
            throw;
        }
        memory_ = h;
        usable_ = true;
        return true;
    }

    /// Unmaps and releases the memory (nothing to do when not mapped). false when the platform
    /// refuses the unmap: the memory stays mapped and held.
    bool unmap() noexcept {
        if (!memory_) return true;
        if (!Vmm::unmap(device_, base_, span_)) return false;
        Vmm::release(*memory_);
        memory_.reset();
        return true;
    }

    /// Lets `peer` (a device that exists) read and write the memory, now if it is mapped and at
    /// every later map (nothing to do if it may already). Throws the platform's error (nothing
    /// recorded) or std::bad_alloc.
    void grant_access(int peer) {
        if (std::find(access_.begin(), access_.end(), peer) != access_.end()) return;
        std::vector<int> access = access_;
        access.push_back(peer);
        if (is_usable()) Vmm::set_access(base_, span_, std::span<const int>(access));
        access_ = std::move(access);
    }

private:
    /// After a failed set_access: unmaps and releases `h`, or, when it will not unmap, keeps it
    /// (mapped, not usable), so that it is unmapped later rather than released while mapped.
    void undo_map(handle h) noexcept {
        if (Vmm::unmap(device_, base_, span_)) {
            Vmm::release(h);
        } else {
            memory_ = h;
            usable_ = false;
        }
    }

    int device_;
    std::size_t span_;                 ///< span_ % Vmm::granularity(device_) == 0
    void* base_ = nullptr;             ///< [base_, base_ + span_) reserved
    std::vector<int> access_;          ///< access_[0] == device_; no duplicates
    std::optional<handle> memory_;     ///< engaged iff mapped over the whole range
    bool usable_ = false;              ///< with memory_: its access is access_ (false: a failed map's, unknown)
};

} // namespace custody::sleep::detail
