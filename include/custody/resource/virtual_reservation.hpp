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
#include <memory>
#include <optional>
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
/// Complexity: map and unmap are O(g) for g granules, plus a driver call or two per granule; the
/// queries are O(1). Memory: a slot per granule up to the highest one mapped so far.
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
        // The granularity of memory made as map() makes it (exportable or not), where the
        // platform tells them apart (cuda::vmm).
        std::size_t minimum = 0;
        if constexpr (requires { Vmm::granularity(device, true); }) {
            minimum = Vmm::granularity(device, exportable_);
        } else {
            minimum = Vmm::granularity(device);
        }
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
        for (std::size_t index = 0; index < slots_.size(); ++index) {
            if (!slots_.mapped(index)) continue;
            if (Vmm::unmap(device_, base_ + index * granule_, granule_)) {
                Vmm::release(slots_[index].memory);
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
    [[nodiscard]] std::size_t mapped_bytes() const noexcept { return mapped_ * granule_; }
    [[nodiscard]] bool exportable() const noexcept { return exportable_; }
    /// The devices that can access the mapped memory, the owner first.
    [[nodiscard]] std::vector<int> access() const { return access_; }

    /// The granule at `offset` (a multiple of the granule, inside the range) is mapped.
    [[nodiscard]] bool is_mapped(std::size_t offset) const {
        check_range(offset, granule_);
        return slots_.mapped(offset / granule_);
    }

    /// Maps physical memory over [offset, offset+bytes), granule-aligned, inside the range and not
    /// mapped yet (else std::invalid_argument). Returns false, changing nothing, when the device has
    /// no physical memory left (create answers nothing, or map or set_access throws
    /// custody::out_of_memory); any other failure throws and changes nothing.
    [[nodiscard]] bool map(std::size_t offset, std::size_t bytes) {
        check_range(offset, bytes);
        const std::size_t first = offset / granule_;
        const std::size_t last = first + bytes / granule_; // one past
        for (std::size_t index = first; index < last; ++index) {
            if (slots_.mapped(index)) {
                throw std::invalid_argument("custody: offset " + std::to_string(index * granule_) + " is already mapped");
            }
        }
        slots_.make(first, last); // may throw: nothing is mapped yet
        std::vector<std::pair<std::size_t, handle>> done;
        done.reserve(last - first);
        // A platform that finds the memory short only at map or set_access (the host's kernel
        // charges its commit there) says so with out_of_memory: exhaustion, as from create.
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
        } catch (const out_of_memory&) {
            undo(done);
            return false;
        } catch (...) {
            undo(done);
            throw;
        }
        for (const auto& [index, h] : done) slots_[index] = {h, true};
        mapped_ += done.size();
        return true;
    }

    /// Unmaps [offset, offset+bytes), granule-aligned, inside the range and all mapped (else
    /// std::invalid_argument), and gives its physical memory back. Returns false when some granule
    /// would not unmap: that granule stays mapped (and counted), the others are unmapped.
    [[nodiscard]] bool unmap(std::size_t offset, std::size_t bytes) {
        check_range(offset, bytes);
        const std::size_t first = offset / granule_;
        const std::size_t last = first + bytes / granule_;
        for (std::size_t index = first; index < last; ++index) {
            if (!slots_.mapped(index)) {
                throw std::invalid_argument("custody: [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                                            ") is not all mapped");
            }
        }
        bool all = true;
        for (std::size_t index = first; index < last; ++index) {
            if (Vmm::unmap(device_, base_ + index * granule_, granule_)) {
                Vmm::release(slots_[index].memory);
                slots_[index].mapped = false;
                --mapped_;
            } else {
                all = false;
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
        if (!is_mapped(offset)) throw std::invalid_argument("custody: the granule is not mapped");
        return Vmm::export_fd(slots_[offset / granule_].memory);
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
        for (std::size_t index = 0; index < slots_.size();) {
            if (!slots_.mapped(index)) {
                ++index;
                continue;
            }
            std::size_t count = 0;
            while (index + count < slots_.size() && slots_.mapped(index + count)) ++count;
            f(index, count);
            index += count;
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
    /// The memory of a granule, while it is mapped.
    struct slot {
        handle memory{};
        bool mapped = false;
    };
    /// A slot per granule, in pages made when a granule of theirs is first mapped (a range reserved
    /// far larger than what is mapped costs nothing for its unused parts).
    class slot_table {
    public:
        static constexpr std::size_t page = 512;
        [[nodiscard]] std::size_t size() const noexcept { return pages_.size() * page; }
        [[nodiscard]] bool mapped(std::size_t i) const noexcept {
            return i / page < pages_.size() && pages_[i / page] != nullptr && pages_[i / page][i % page].mapped;
        }
        [[nodiscard]] slot& operator[](std::size_t i) noexcept { return pages_[i / page][i % page]; }
        [[nodiscard]] const slot& operator[](std::size_t i) const noexcept { return pages_[i / page][i % page]; }
        /// Makes the slots [first, last). Strong: a bad_alloc changes nothing that is seen.
        void make(std::size_t first, std::size_t last) {
            if (pages_.size() < (last + page - 1) / page) pages_.resize((last + page - 1) / page);
            for (std::size_t p = first / page; p < (last + page - 1) / page; ++p) {
                if (pages_[p] == nullptr) pages_[p] = std::make_unique<slot[]>(page);
            }
        }

    private:
        std::vector<std::unique_ptr<slot[]>> pages_;
    };
    slot_table slots_;       // slots_[i]: granule i, at base_ + i * granule_
    std::size_t mapped_ = 0; // the slots mapped
};

} // namespace custody::resource
