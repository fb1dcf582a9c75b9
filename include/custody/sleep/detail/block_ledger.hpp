/// @file
/// The bookkeeping of a sleepable_memory, apart from mapping, copies and locks: its blocks, the
/// owner and the streams of each, each owner's sleep state, and the totals its statistics report.
#pragma once

#include <custody/core/statistics.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/sleep/detail/kept_bytes.hpp>
#include <custody/sleep/sleep_policy.hpp>
#include <custody/sleep/sleep_statistics.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::sleep::detail {

using owner_id = debug::owner_id;

/// A stream a block was used on, and the device it belongs to (the default stream is the current
/// device's when it is used, which may not be when it is waited for).
template <class Stream>
struct stream_use {
    Stream stream;
    int device;
    friend bool operator==(const stream_use&, const stream_use&) = default;
};

/// One live block: an address range of its own and what it was used for. `Owner`: what names its
/// owner (owner_id; a test may count the comparisons through a type of its own).
///
/// Invariants: 0 < bytes <= span() (bytes rounded up to whole granules);
///   uses distinct, uses[0] the stream it was allocated on, then the streams recorded for it;
///   owner awake  => range mapped, backup == nullptr;
///   owner asleep => backup != nullptr only if the owner sleeps under sleep_policy::offload
///                   (backup holds `bytes` of contents); a range still mapped is stuck (its unmap
///                   failed; or, offloaded without a backup, its contents are kept in place);
///                   offloaded, not mapped => backup != nullptr;
///   every kept span lies within [0, bytes).
template <class Range, class Stream, class Owner = owner_id>
struct block {
    using owner_type = Owner;
    std::unique_ptr<Range> range;
    std::size_t bytes = 0;
    Owner owner{};
    std::vector<stream_use<Stream>> uses;
    std::byte* backup = nullptr;
    std::vector<kept_bytes> kept; ///< what a discard keeps, in the order the layers above asked

    [[nodiscard]] std::size_t span() const noexcept { return range->span(); }
    [[nodiscard]] std::byte* base() const noexcept { return static_cast<std::byte*>(range->base()); }
};

/// Physical memory the blocks hold now.
template <class Block>
[[nodiscard]] std::size_t mapped_bytes_of(const std::vector<Block*>& blocks) noexcept {
    std::size_t n = 0;
    for (const Block* b : blocks) n += b->range->mapped_bytes();
    return n;
}

/// The owners a sleep or a wake names, each with its place in the request (its slot): a block's
/// owner is found among them in O(1), so that matching n blocks to k owners costs O(n + k).
/// Not thread-safe.
template <class Owner>
class owner_slots {
public:
    static constexpr std::size_t none = SIZE_MAX;

    /// Gives `owner` the next slot; false, adding nothing, when it has one already. Throws std::bad_alloc.
    bool add(const Owner& owner) { return slots_.emplace(owner, slots_.size()).second; }
    /// `owner`'s slot, or none.
    [[nodiscard]] std::size_t find(const Owner& owner) const {
        const auto it = slots_.find(owner);
        return it == slots_.end() ? none : it->second;
    }
    [[nodiscard]] std::size_t size() const noexcept { return slots_.size(); }

private:
    std::unordered_map<Owner, std::size_t> slots_; ///< values 0 .. size()-1, each once
};

/// An owner's sleep state and its share of the blocks.
/// Invariants: blocks = #{b : b.owner = o}; bytes = sum of their bytes; span_bytes = sum of their spans.
struct owner_state {
    bool asleep = false;
    sleep_policy policy = sleep_policy::discard; ///< meaningful while asleep
    std::size_t blocks = 0;
    std::size_t bytes = 0;
    std::size_t span_bytes = 0;
};

/// Blocks by address, owners by id, and the running totals. Not thread-safe: the resource guards it
/// with its lock. Every operation that can throw (std::bad_alloc) changes nothing when it does.
///
/// Invariants:
///   live_bytes_ = sum of b.bytes;  blocks_.size() = live allocations
///   mapped_bytes_ = sum of b.range->mapped_bytes() + withheld_bytes_
///   withheld_bytes_ = sum of mapped bytes of withheld_ (at the time each was withheld)
///   offloaded_bytes_ = sum of b.bytes over blocks with a backup
///   stats_.sleeping_owners = #{o : o.asleep}
/// Complexity: add, find and take O(log n) in the n live blocks; owners O(1); blocks_of O(n).
template <class Range, class Stream, class Owner = owner_id>
class block_ledger {
public:
    using owner_type = Owner;
    using block_type = block<Range, Stream, Owner>;

    /// The state of `owner`, made (awake, no blocks) if it has none yet. Throws std::bad_alloc.
    owner_state& owner(const Owner& id) { return owners_[id]; }
    [[nodiscard]] owner_state* find_owner(const Owner& id) noexcept {
        const auto it = owners_.find(id);
        return it == owners_.end() ? nullptr : &it->second;
    }
    [[nodiscard]] const owner_state* find_owner(const Owner& id) const noexcept {
        const auto it = owners_.find(id);
        return it == owners_.end() ? nullptr : &it->second;
    }
    [[nodiscard]] bool asleep(const Owner& id) const noexcept {
        const owner_state* o = find_owner(id);
        return o != nullptr && o->asleep;
    }

    /// Records a new block, mapped whole. Throws std::bad_alloc, recording nothing (`b` is then
    /// destroyed by the caller's copy, which gives its range back).
    void add(block_type&& b) {
        owner_state& o = owner(b.owner);
        const auto key = reinterpret_cast<std::uintptr_t>(b.range->base());
        const std::size_t bytes = b.bytes;
        const std::size_t span = b.span();
        blocks_.emplace(key, std::move(b));
        ++o.blocks;
        o.bytes += bytes;
        o.span_bytes += span;
        live_bytes_ += bytes;
        mapped_bytes_ += span;
        ++allocations_;
        peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
        peak_mapped_bytes_ = std::max(peak_mapped_bytes_, mapped_bytes_);
    }

    [[nodiscard]] block_type* find(const void* ptr) noexcept {
        const auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(ptr));
        return it == blocks_.end() ? nullptr : &it->second;
    }

    /// The live block whose bytes hold `ptr` (its start or inside it), or nullptr.
    [[nodiscard]] block_type* containing(const void* ptr) noexcept {
        const auto at = reinterpret_cast<std::uintptr_t>(ptr);
        auto it = blocks_.upper_bound(at);
        if (it == blocks_.begin()) return nullptr;
        --it;
        return at - it->first < it->second.bytes ? &it->second : nullptr;
    }
    [[nodiscard]] const block_type* containing(const void* ptr) const noexcept {
        return const_cast<block_ledger*>(this)->containing(ptr);
    }

    /// Removes the block at `ptr` (which must be live) and returns it; the caller gives its memory
    /// back and then calls released() with what that gave back.
    [[nodiscard]] block_type take(const void* ptr) noexcept {
        auto node = blocks_.extract(reinterpret_cast<std::uintptr_t>(ptr));
        block_type b = std::move(node.mapped());
        owner_state& o = owners_.find(b.owner)->second; // every block's owner has a state
        --o.blocks;
        o.bytes -= b.bytes;
        o.span_bytes -= b.span();
        live_bytes_ -= b.bytes;
        if (b.backup != nullptr) offloaded_bytes_ -= b.bytes; // its backup goes with it
        ++deallocations_;
        return b;
    }

    /// The live blocks of `owners`, in address order. O(n) in the live blocks. Throws std::bad_alloc.
    [[nodiscard]] std::vector<block_type*> blocks_of(const owner_slots<Owner>& owners) {
        std::vector<block_type*> found;
        for (auto& [key, b] : blocks_) {
            if (owners.find(b.owner) != owner_slots<Owner>::none) found.push_back(&b);
        }
        return found;
    }

    /// Calls f(block&) for every live block.
    template <class F>
    void for_each(F&& f) {
        for (auto& [key, b] : blocks_) f(b);
    }

    // ---- accounting: each records a change the resource has made ----

    /// Physical memory went from `before` to `after` bytes over some blocks (a sleep, a wake, a free).
    void remapped(std::size_t before, std::size_t after) noexcept {
        mapped_bytes_ = mapped_bytes_ - before + after;
        peak_mapped_bytes_ = std::max(peak_mapped_bytes_, mapped_bytes_);
    }
    /// `b` (asleep now) holds `backup` for its contents.
    void attach_backup(block_type& b, std::byte* backup) noexcept {
        b.backup = backup;
        offloaded_bytes_ += b.bytes;
    }
    /// `b`'s backup was given back.
    [[nodiscard]] std::byte* detach_backup(block_type& b) noexcept {
        if (b.backup != nullptr) offloaded_bytes_ -= b.bytes;
        return std::exchange(b.backup, nullptr);
    }
    void fell_asleep(owner_state& o, sleep_policy policy, std::size_t released) noexcept {
        o.asleep = true;
        o.policy = policy;
        ++sleeping_owners_;
        ++sleeps_;
        released_bytes_ += released;
    }
    void woke(owner_state& o) noexcept {
        o.asleep = false;
        --sleeping_owners_;
        ++wakes_;
    }
    /// A freed block's range that would not unmap: kept mapped, never reused, given back (tried
    /// again) when the ledger goes. With no room to keep it, its destructor tries at once.
    void withhold(std::unique_ptr<Range> range) noexcept {
        const std::size_t bytes = range->mapped_bytes();
        try {
            withheld_.push_back(std::move(range));
            withheld_bytes_ += bytes;
        } catch (...) {
        }
    }

    /// The streams to wait for before the block at `ptr` is freed on `stream`: that one and those
    /// recorded for the block (not the one it was allocated on: the free's stream is ordered after
    /// it by the contract), or only `own` (the resource's stream) for a sleeping block, whose sleep
    /// waited for the others. Empty for a pointer that is not a live block's start.
    [[nodiscard]] std::vector<Stream> streams_before_free(const void* ptr, Stream stream, Stream own) const {
        const auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(ptr));
        if (it == blocks_.end()) return {};
        const block_type& b = it->second;
        if (asleep(b.owner)) return {own};
        std::vector<Stream> streams{stream};
        for (std::size_t i = 1; i < b.uses.size(); ++i) streams.push_back(b.uses[i].stream);
        return streams;
    }

    // ---- statistics ----

    [[nodiscard]] resource_statistics statistics() const noexcept {
        resource_statistics s;
        s.live_bytes = live_bytes_;
        s.peak_live_bytes = peak_live_bytes_;
        s.reserved_bytes = mapped_bytes_;
        s.peak_reserved_bytes = peak_mapped_bytes_;
        s.live_allocations = blocks_.size();
        s.allocations = allocations_;
        s.deallocations = deallocations_;
        return s;
    }

    /// Everything but the granule, which the resource knows.
    [[nodiscard]] sleep_statistics sleep_totals() const noexcept {
        sleep_statistics s;
        for (const auto& [id, o] : owners_) (o.asleep ? s.asleep_bytes : s.awake_bytes) += o.span_bytes;
        s.mapped_bytes = mapped_bytes_;
        s.offloaded_bytes = offloaded_bytes_;
        s.withheld_bytes = withheld_bytes_;
        s.stuck_bytes = mapped_bytes_ - withheld_bytes_ - s.awake_bytes;
        s.sleeping_owners = sleeping_owners_;
        s.sleeps = sleeps_;
        s.wakes = wakes_;
        s.released_bytes = released_bytes_;
        return s;
    }

    /// `id`'s share: its blocks are scanned for what they map and hold offloaded.
    [[nodiscard]] owner_memory owner_totals(const Owner& id) const noexcept {
        owner_memory m;
        const owner_state* o = find_owner(id);
        if (o == nullptr) return m;
        m.blocks = o->blocks;
        m.bytes = o->bytes;
        m.span_bytes = o->span_bytes;
        m.asleep = o->asleep;
        m.policy = o->policy;
        for (const auto& [key, b] : blocks_) {
            if (b.owner != id) continue;
            m.mapped_bytes += b.range->mapped_bytes();
            if (b.backup != nullptr) m.offloaded_bytes += b.bytes;
        }
        return m;
    }

private:
    std::map<std::uintptr_t, block_type> blocks_;     ///< base address -> block
    std::vector<std::unique_ptr<Range>> withheld_;     ///< freed ranges that would not unmap
    std::unordered_map<Owner, owner_state> owners_;    ///< never erased: an owner's state outlives its blocks
    std::size_t live_bytes_ = 0;
    std::size_t peak_live_bytes_ = 0;
    std::size_t mapped_bytes_ = 0;
    std::size_t peak_mapped_bytes_ = 0;
    std::size_t offloaded_bytes_ = 0;
    std::size_t withheld_bytes_ = 0;
    std::size_t sleeping_owners_ = 0;
    std::uint64_t allocations_ = 0;
    std::uint64_t deallocations_ = 0;
    std::uint64_t sleeps_ = 0;
    std::uint64_t wakes_ = 0;
    std::uint64_t released_bytes_ = 0;
};

} // namespace custody::sleep::detail
