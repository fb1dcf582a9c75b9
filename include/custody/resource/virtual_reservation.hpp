/// @file
/// `virtual_reservation`: one contiguous range of a device's address space, with physical memory
/// mapped into it and unmapped from it granule by granule, in any order.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/error.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/virtual_memory.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace custody::resource {

/// How a reservation maps its memory.
struct reservation_options {
    /// The unit of mapping: 0 for the device's granularity, otherwise a power-of-two multiple of it.
    std::size_t granule = 0;
    /// Physical memory created exportable (a POSIX file descriptor per granule, for NCCL or IPC).
    bool exportable = false;
    /// Devices besides the owner that may read and write the mapped memory.
    std::vector<int> peers;
};

/// A range of `Vmm`'s address space reserved on construction and given back on destruction, into
/// which physical memory of one device is mapped on demand, one physical allocation per granule,
/// so that any granule can be unmapped (and its memory returned to the device) whatever was mapped
/// around it. This is what a strategy grows in without stranding memory: one range per kind,
/// granules mapped as it grows and unmapped as it trims.
///
/// Each map creates, maps and grants access to its granules, or, on any failure, undoes what it did
/// and leaves the reservation as it was (strong guarantee). Each unmap gives its granules' physical
/// memory back at once. Access: the owner and `peers`, and any device grant_access adds.
///
/// Thread safety: not thread-safe; its owner serializes the calls (a resource holds it under its
/// lock). Stream semantics: none of its own: mapping and unmapping are synchronous, and the caller
/// makes sure no work still uses a range it unmaps.
/// Ownership: owns the address range and every physical allocation mapped into it; destruction
/// unmaps and releases them all, then frees the range.
/// Complexity: map and unmap are O(g log m) for g granules with m mapped, plus a driver call or
/// two per granule; the queries are O(1) or O(log m).
template <virtual_memory_operations Vmm>
class virtual_reservation {
public:
    using handle = typename Vmm::handle;
    using platform_type = typename Vmm::platform_type;

    /// Reserves `bytes` rounded up to the granule, aligned to the granule. Throws
    /// std::invalid_argument for a device without virtual memory, a zero size, a granule that is not
    /// a power-of-two multiple of the device's granularity, an unsupported export or a peer that
    /// does not exist; custody::out_of_memory when there is no address space left.
    virtual_reservation(int device, std::size_t bytes, reservation_options options = {})
        : device_(device), exportable_(options.exportable) {
        if (!Vmm::supported(device)) {
            throw std::invalid_argument("custody: device " + std::to_string(device) +
                                        " has no virtual memory management");
        }
        const std::size_t minimum = Vmm::granularity(device);
        granule_ = options.granule == 0 ? minimum : options.granule;
        if (!is_pow2(granule_) || granule_ < minimum || granule_ % minimum != 0) {
            throw std::invalid_argument("custody: granule " + std::to_string(options.granule) +
                                        " is not a power-of-two multiple of the device's " +
                                        std::to_string(minimum));
        }
        if (bytes == 0) throw std::invalid_argument("custody: a reservation of 0 bytes");
        if (exportable_ && !Vmm::exportable(device)) {
            throw std::invalid_argument("custody: device " + std::to_string(device) + " cannot export its memory");
        }
        access_.push_back(device);
        for (int peer : options.peers) {
            if (!Vmm::supported(peer)) {
                throw std::invalid_argument("custody: peer device " + std::to_string(peer) + " does not exist");
            }
            if (std::find(access_.begin(), access_.end(), peer) == access_.end()) access_.push_back(peer);
        }
        if (align_up_overflows(bytes, granule_)) throw_no_address_space(bytes);
        size_ = align_up(bytes, granule_);
        base_ = static_cast<std::byte*>(Vmm::reserve(device_, size_, granule_));
        if (base_ == nullptr) throw_no_address_space(bytes);
    }

    virtual_reservation(const virtual_reservation&) = delete;
    virtual_reservation& operator=(const virtual_reservation&) = delete;

    /// Unmaps and releases everything still mapped, then frees the range (which is kept, and
    /// reported, if some granule would not unmap).
    ~virtual_reservation() {
        bool all_unmapped = true;
        for (const auto& [index, h] : mapped_) {
            if (Vmm::unmap(device_, base_ + index * granule_, granule_)) {
                Vmm::release(h);
            } else {
                all_unmapped = false;
            }
        }
        if (all_unmapped) Vmm::free_reservation(device_, base_, size_);
    }

    [[nodiscard]] void* base() const noexcept { return base_; }
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] std::size_t granule() const noexcept { return granule_; }
    /// Address space held: reserved_bytes() = the size asked for, rounded up to the granule.
    [[nodiscard]] std::size_t reserved_bytes() const noexcept { return size_; }
    /// Physical memory held: mapped_bytes() = granule() * (granules mapped) <= reserved_bytes().
    [[nodiscard]] std::size_t mapped_bytes() const noexcept { return mapped_.size() * granule_; }
    [[nodiscard]] bool exportable() const noexcept { return exportable_; }
    /// The devices that can access the mapped memory, the owner first.
    [[nodiscard]] std::vector<int> access() const { return access_; }

    /// The granule at `offset` (a multiple of the granule, inside the range) is mapped.
    [[nodiscard]] bool is_mapped(std::size_t offset) const {
        check_range(offset, granule_);
        return mapped_.contains(offset / granule_);
    }

    /// Maps physical memory over [offset, offset+bytes), granule-aligned, inside the range and not
    /// mapped yet (else std::invalid_argument). Returns false, changing nothing, when the device has
    /// no physical memory left; any other failure throws and changes nothing.
    [[nodiscard]] bool map(std::size_t offset, std::size_t bytes) {
        check_range(offset, bytes);
        const std::size_t first = offset / granule_;
        const std::size_t last = first + bytes / granule_; // one past
        if (auto it = mapped_.lower_bound(first); it != mapped_.end() && it->first < last) {
            throw std::invalid_argument("custody: offset " + std::to_string(it->first * granule_) +
                                        " is already mapped");
        }
        std::vector<std::pair<std::size_t, handle>> done;
        done.reserve(last - first);
        try {
            for (std::size_t index = first; index != last; ++index) {
                const std::optional<handle> h = Vmm::create(device_, granule_, exportable_);
                if (!h) {
                    undo(done);
                    return false;
                }
                try {
                    Vmm::map(base_ + index * granule_, granule_, *h);
                } catch (...) {
                    Vmm::release(*h);
                    throw;
                }
                done.emplace_back(index, *h); // cannot throw: reserved above
            }
            Vmm::set_access(base_ + offset, bytes, std::span<const int>(access_));
            for (const auto& [index, h] : done) mapped_.emplace(index, h);
        } catch (...) {
            for (const auto& entry : done) mapped_.erase(entry.first);
            undo(done);
            throw;
        }
        return true;
    }

    /// Unmaps [offset, offset+bytes), granule-aligned, inside the range and all mapped (else
    /// std::invalid_argument), and gives its physical memory back. Returns false when some granule
    /// would not unmap: that granule stays mapped (and counted), the others are unmapped.
    [[nodiscard]] bool unmap(std::size_t offset, std::size_t bytes) {
        check_range(offset, bytes);
        const std::size_t first = offset / granule_;
        const std::size_t last = first + bytes / granule_;
        const auto begin = mapped_.lower_bound(first);
        const auto end = mapped_.lower_bound(last);
        if (static_cast<std::size_t>(std::distance(begin, end)) != last - first) {
            throw std::invalid_argument("custody: [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                                        ") is not all mapped");
        }
        bool all = true;
        for (auto it = begin; it != end;) {
            if (Vmm::unmap(device_, base_ + it->first * granule_, granule_)) {
                Vmm::release(it->second);
                it = mapped_.erase(it);
            } else {
                all = false;
                ++it;
            }
        }
        return all;
    }

    /// Lets `peer` read and write every granule mapped now and later. Throws (std::invalid_argument
    /// for a device that does not exist, or the driver's error) without recording the peer; ranges
    /// granted before the failure keep the access.
    void grant_access(int peer) {
        if (std::find(access_.begin(), access_.end(), peer) != access_.end()) return;
        if (!Vmm::supported(peer)) {
            throw std::invalid_argument("custody: peer device " + std::to_string(peer) + " does not exist");
        }
        std::vector<int> access = access_;
        access.push_back(peer);
        for_each_mapped_run([&](std::size_t first, std::size_t count) {
            Vmm::set_access(base_ + first * granule_, count * granule_, std::span<const int>(access));
        });
        access_ = std::move(access);
    }

    /// A POSIX file descriptor for the physical memory of the granule at `offset`, owned by the
    /// caller. Throws std::invalid_argument unless the reservation is exportable and the granule
    /// mapped.
    [[nodiscard]] int export_fd(std::size_t offset) const {
        if (!exportable_) throw std::invalid_argument("custody: the reservation was not made exportable");
        check_range(offset, granule_);
        const auto it = mapped_.find(offset / granule_);
        if (it == mapped_.end()) throw std::invalid_argument("custody: the granule is not mapped");
        return Vmm::export_fd(it->second);
    }

private:
    void check_range(std::size_t offset, std::size_t bytes) const {
        if (bytes == 0 || offset % granule_ != 0 || bytes % granule_ != 0 || offset > size_ ||
            bytes > size_ - offset) {
            throw std::invalid_argument("custody: [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                                        ") is not a granule-aligned part of a " + std::to_string(size_) +
                                        "-byte reservation with granule " + std::to_string(granule_));
        }
    }

    /// Unmaps and releases what a failed map did, last first.
    void undo(const std::vector<std::pair<std::size_t, handle>>& done) noexcept {
        for (auto it = done.rbegin(); it != done.rend(); ++it) {
            if (Vmm::unmap(device_, base_ + it->first * granule_, granule_)) Vmm::release(it->second);
        }
    }

    /// Calls f(first granule, count) for each maximal run of consecutive mapped granules.
    template <class F>
    void for_each_mapped_run(F&& f) const {
        for (auto it = mapped_.begin(); it != mapped_.end();) {
            const std::size_t first = it->first;
            std::size_t count = 0;
            while (it != mapped_.end() && it->first == first + count) {
                ++count;
                ++it;
            }
            f(first, count);
        }
    }

    [[noreturn]] void throw_no_address_space(std::size_t bytes) const {
        throw out_of_memory(bytes, granule_, device_, resource_statistics{}, "virtual_reservation",
                            "no address space left to reserve");
    }

    int device_;
    bool exportable_;
    std::size_t granule_ = 0;      // a power of two, a multiple of Vmm::granularity(device_)
    std::size_t size_ = 0;         // size_ % granule_ == 0
    std::byte* base_ = nullptr;    // base_ % granule_ == 0; [base_, base_ + size_) reserved
    std::vector<int> access_;      // access_[0] == device_; no duplicates
    std::map<std::size_t, handle> mapped_; // granule index i (< size_ / granule_) -> its memory, mapped at base_ + i * granule_
};

} // namespace custody::resource
