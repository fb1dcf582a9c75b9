/// @file
/// `ledger`: the tracking resource's bookkeeping: every live block by its user pointer, the last
/// freed ones (to tell a double free), the totals per owner and per device, and the statistics.
/// Bookkeeping only: no locks, no memory of the blocks, no platform calls.
#pragma once

#include <custody/core/statistics.hpp>
#include <custody/debug/detail/call_stack.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/report.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::debug::detail {

/// One side of a block's life as the ledger keeps it (an interned owner and integers): what an
/// allocation_site is made from, when a report needs one.
struct site_record {
    owner_id owner = nullptr;
    int device = -1;
    std::uintptr_t stream = 0; ///< the platform's stream key; 0 for a synchronous call
    bool synchronous = false;
    std::uint64_t sequence = 0; ///< the tracker's allocation (or free) number, from 1
    std::int64_t time_ns = 0;
};

/// The one way an allocation_site is made: `side` of a block of `bytes` and `alignment` on `rank`.
[[nodiscard]] inline allocation_site make_site(const site_record& side, int rank, std::size_t bytes,
                                               std::size_t alignment, std::vector<std::string> stack = {}) {
    allocation_site s;
    s.owner = std::string(owner_name(side.owner));
    s.rank = rank;
    s.device = side.device;
    s.stream = side.stream;
    s.synchronous = side.synchronous;
    s.sequence = side.sequence;
    s.time_ns = side.time_ns;
    s.bytes = bytes;
    s.alignment = alignment;
    s.stack = std::move(stack);
    return s;
}

/// The live memory of one owner. Invariants: low <= bytes <= peak.
struct owner_totals {
    std::size_t bytes = 0;
    std::size_t count = 0;
    std::size_t peak = 0; ///< max over time of bytes
    std::size_t low = 0;  ///< min of bytes since the last trend sample (take_extremes)
};

/// The live memory of one device. Invariant: low <= bytes <= high.
struct device_totals {
    std::size_t bytes = 0;
    std::size_t count = 0;
    std::size_t low = 0;  ///< min of bytes since the last trend sample (take_extremes)
    std::size_t high = 0; ///< max of bytes since the last trend sample
};

/// The streams a live block is used on, and an ordering the caller declared before its free.
/// Invariants: 0 <= count <= max_uses; a stream allocation starts with streams[0] = its stream;
/// `ordered` holds only until the next use is added.
template <class Stream>
struct stream_uses {
    static constexpr int max_uses = 4;
    std::array<Stream, max_uses> streams{};
    int count = 0;
    bool ordered = false;          ///< declared ordered before a free on the stream keyed ordered_onto
    std::uintptr_t ordered_onto = 0;

    [[nodiscard]] bool contains(Stream s) const noexcept {
        for (int i = 0; i < count; ++i)
            if (streams[static_cast<std::size_t>(i)] == s) return true;
        return false;
    }
    /// Adds `s` (beyond max_uses, the latest takes the last slot); a declared ordering lapses.
    void add(Stream s) noexcept {
        if (!contains(s)) streams[static_cast<std::size_t>(count == max_uses ? max_uses - 1 : count++)] = s;
        ordered = false;
    }
    /// The first use that a free on `free_stream` (whose key is `free_key`) is not ordered after;
    /// nullptr when there is none.
    [[nodiscard]] const Stream* unordered_before(Stream free_stream, std::uintptr_t free_key) const noexcept {
        if (ordered && ordered_onto == free_key) return nullptr;
        for (int i = 0; i < count; ++i)
            if (!(streams[static_cast<std::size_t>(i)] == free_stream)) return &streams[static_cast<std::size_t>(i)];
        return nullptr;
    }
};

/// Where a block lies: the upstream's block, and the user's bytes in it.
/// Invariants: inner() = outer + front; total (taken from the upstream) >= front + bytes.
struct block_shape {
    void* outer = nullptr;
    std::size_t bytes = 0; ///< the user's
    std::size_t alignment = 0;
    std::size_t total = 0;
    std::size_t front = 0;

    [[nodiscard]] const void* inner() const noexcept { return static_cast<const unsigned char*>(outer) + front; }
};

/// One block: live, or freed and still remembered (to tell a double free).
/// Invariant: `freed` is meaningful only when !live.
template <class Stream>
struct block_record : block_shape {
    bool live = true;
    owner_totals* totals = nullptr; ///< of allocated.owner: a node-based map, the address is stable
    site_record allocated;
    site_record freed;
    stream_uses<Stream> uses;
    call_stack stack;
};

/// What the ledger is told about a block the upstream just gave.
template <class Stream>
struct admission {
    block_shape shape;
    site_record site;              ///< the ledger numbers it (site.sequence)
    Stream stream{};
    const call_stack* stack = nullptr; ///< nullptr: not captured
};

/// The ledger of one tracker.
///
/// Invariants: the live records number statistics().live_allocations and sum to its live_bytes
/// (user bytes) and reserved_bytes (bytes taken from the upstream); owner_totals and
/// device_totals sum the live records of each owner and device. The freed records are the last
/// `remembered_frees` frees, at most.
/// Thread safety: none; the tracker's mutex guards every call. Complexity: O(1) expected per
/// block; listing is linear in the records.
template <class Stream>
class ledger {
public:
    using record = block_record<Stream>;
    using entry = std::pair<const void* const, record>;
    static_assert(std::is_trivially_copyable_v<record> && std::is_trivially_destructible_v<record>);

    explicit ledger(std::size_t remembered_frees) : freed_ring_(remembered_frees) { blocks_.reserve(1024); }

    /// Records and counts the block at user pointer `inner`. Strong guarantee: what may throw (no
    /// memory) comes first, so on an exception nothing is recorded (an empty owner or device total
    /// may remain). A remembered free at this address (the upstream reused it) is overwritten.
    record& admit(const void* inner, const admission<Stream>& a) {
        owner_totals& o = owners_.try_emplace(a.site.owner).first->second;
        device_totals& d = device_slot(a.site.device);
        record& r = blocks_.try_emplace(inner).first->second;
        // Field by field, not `r = record{}`: that would zero the whole call stack on every call.
        r.live = true;
        static_cast<block_shape&>(r) = a.shape;
        r.totals = &o;
        r.allocated = a.site;
        r.allocated.sequence = ++sequence_;
        r.uses.count = 0;
        r.uses.ordered = false;
        r.uses.ordered_onto = 0;
        if (!a.site.synchronous) r.uses.add(a.stream);
        if (a.stack != nullptr) {
            r.stack = *a.stack;
        } else {
            r.stack.depth = 0; // frames past depth are never read
        }
        stats_.allocations += 1;
        stats_.live_allocations += 1;
        stats_.live_bytes += a.shape.bytes;
        stats_.reserved_bytes += a.shape.total;
        stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
        stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
        o.bytes += a.shape.bytes;
        ++o.count;
        o.peak = std::max(o.peak, o.bytes);
        d.bytes += a.shape.bytes;
        ++d.count;
        d.high = std::max(d.high, d.bytes);
        return r;
    }

    /// The record of `p`, live or remembered freed; nullptr when the ledger does not know it.
    [[nodiscard]] entry* find(const void* p) noexcept {
        const auto it = blocks_.find(p);
        return it == blocks_.end() ? nullptr : &*it;
    }
    [[nodiscard]] const record* find_live(const void* p) const noexcept {
        const auto it = blocks_.find(p);
        return it == blocks_.end() || !it->second.live ? nullptr : &it->second;
    }
    [[nodiscard]] record* find_live(const void* p) noexcept {
        return const_cast<record*>(static_cast<const ledger*>(this)->find_live(p));
    }

    /// The live block `p` lies inside, past its start; nullptr when none. O(records): only a bad
    /// free asks.
    [[nodiscard]] const entry* containing(const void* p) const noexcept {
        const auto address = reinterpret_cast<std::uintptr_t>(p);
        for (const entry& e : blocks_) {
            const auto begin = reinterpret_cast<std::uintptr_t>(e.first);
            if (e.second.live && begin < address && address < begin + e.second.bytes) return &e;
        }
        return nullptr;
    }

    /// The number of the next free (every free is numbered, good or bad).
    [[nodiscard]] std::uint64_t next_free_sequence() noexcept { return ++free_sequence_; }

    /// Takes the live block of `e` out of the counts and remembers it as freed by `freed`,
    /// forgetting the oldest remembered free beyond remembered_frees.
    void release(entry& e, const site_record& freed) noexcept {
        record& r = e.second;
        stats_.deallocations += 1;
        stats_.live_allocations -= 1;
        stats_.live_bytes -= r.bytes;
        stats_.reserved_bytes -= r.total;
        r.totals->bytes -= r.bytes;
        --r.totals->count;
        r.totals->low = std::min(r.totals->low, r.totals->bytes);
        device_totals& d = devices_[static_cast<std::size_t>(r.allocated.device + 1)];
        d.bytes -= r.bytes;
        --d.count;
        d.low = std::min(d.low, d.bytes);
        if (freed_ring_.empty()) {
            blocks_.erase(e.first);
            return;
        }
        r.live = false;
        r.freed = freed;
        auto& slot = freed_ring_[ring_next_];
        if (slot.first != nullptr) {
            // Forget the oldest remembered free, unless its address was reused (or freed again)
            // since. The element is still there: only its latest slot, which comes later, erases it.
            const auto& [key, old] = *slot.first;
            if (!old.live && old.freed.sequence == slot.second) blocks_.erase(key);
        }
        slot = {&e, freed.sequence};
        ring_next_ = ring_next_ + 1 == freed_ring_.size() ? 0 : ring_next_ + 1;
    }

    /// Calls f(record) for every live block, in no particular order.
    template <class F>
    void for_each_live(F&& f) const {
        for (const entry& e : blocks_)
            if (e.second.live) f(e.second);
    }
    /// The live blocks as snapshot entries, in no particular order.
    [[nodiscard]] std::vector<snapshot_entry> live_entries() const {
        std::vector<snapshot_entry> entries;
        entries.reserve(stats_.live_allocations);
        for_each_live([&](const record& r) { entries.push_back(entry_of(r)); });
        return entries;
    }
    [[nodiscard]] static snapshot_entry entry_of(const record& r) {
        return snapshot_entry{r.inner(), r.allocated.sequence, r.bytes, r.allocated.owner, r.allocated.device, r.stack};
    }

    [[nodiscard]] const resource_statistics& statistics() const noexcept { return stats_; }
    /// The highest allocation number handed out so far.
    [[nodiscard]] std::uint64_t last_sequence() const noexcept { return sequence_; }
    [[nodiscard]] owner_totals owner(owner_id id) const noexcept {
        const auto it = owners_.find(id);
        return it == owners_.end() ? owner_totals{} : it->second;
    }
    [[nodiscard]] const std::unordered_map<owner_id, owner_totals>& owners() const noexcept { return owners_; }
    [[nodiscard]] device_totals device(int device) const noexcept {
        const auto slot = static_cast<std::size_t>(device + 1);
        return slot < devices_.size() ? devices_[slot] : device_totals{};
    }
    /// Calls owner(id, low, bytes) for every owner, with its least live bytes since the previous
    /// call and its bytes now, and device(device, low, high) for every device slot (some may never
    /// have held memory: all zeros) with its least and most live bytes since the previous call
    /// (only a device's most bytes count: the device's room), and starts the next interval at their
    /// bytes now. O(owners + devices).
    template <class Owner, class Device>
    void take_extremes(Owner&& owner, Device&& device) {
        for (auto& [id, o] : owners_) {
            owner(id, o.low, o.bytes);
            o.low = o.bytes;
        }
        for (std::size_t i = 0; i < devices_.size(); ++i) {
            device_totals& d = devices_[i];
            device(static_cast<int>(i) - 1, d.low, d.high);
            d.low = d.high = d.bytes;
        }
    }

    /// The devices with live memory (or a count), by device.
    [[nodiscard]] std::vector<device_usage> device_usages() const {
        std::vector<device_usage> usages;
        for (std::size_t i = 0; i < devices_.size(); ++i) {
            if (devices_[i].count != 0 || devices_[i].bytes != 0) {
                usages.push_back(device_usage{static_cast<int>(i) - 1, devices_[i].bytes, devices_[i].count});
            }
        }
        return usages;
    }

private:
    device_totals& device_slot(int device) {
        const auto slot = static_cast<std::size_t>(device + 1);
        if (slot >= devices_.size()) devices_.resize(slot + 1);
        return devices_[slot];
    }

    // User pointer -> block: the live ones, and the last remembered_frees freed ones.
    std::unordered_map<const void*, record> blocks_;
    // The remembered frees as (element, free sequence), a ring; ring_next_ is the oldest slot. An
    // element is erased only by the slot of its latest free (the one whose sequence it holds), and
    // slots are evicted in order, so every slot's element exists (unordered_map elements keep their
    // address across rehashes). freed_ring_.size() == remembered_frees.
    std::vector<std::pair<const entry*, std::uint64_t>> freed_ring_;
    std::size_t ring_next_ = 0;
    resource_statistics stats_;                         // of the live blocks (user bytes)
    std::uint64_t sequence_ = 0;                        // allocations handed out so far
    std::uint64_t free_sequence_ = 0;                   // frees asked for so far
    std::unordered_map<owner_id, owner_totals> owners_; // node-based: record::totals stays valid
    std::vector<device_totals> devices_;                // index device + 1
};

} // namespace custody::debug::detail
