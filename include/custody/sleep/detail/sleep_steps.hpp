/// @file
/// `sleep_steps`: the named steps a sleepable_memory's sleep and wake take, over the resource's
/// parts: contents copied out and back on its stream, memory released and mapped again, and each
/// step undone when a later one fails.
#pragma once

#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/platform/platform.hpp>
#include <custody/sleep/detail/kept_bytes.hpp>
#include <custody/sleep/detail/sleep_plan.hpp>
#include <custody/sleep/sleep_policy.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace custody::sleep::detail {

/// Alignment of the host memory that holds offloaded contents.
inline constexpr std::size_t backup_alignment = 256;

/// The steps of a sleep (save_contents, release_memory; undo_sleep) and of a wake (map_and_restore,
/// finish_wake; undo_wake) of one sleepable_memory, whose parts it refers to: the device, the
/// granule, the resource's stream (only these steps enqueue on it), the host memory for contents,
/// the copies and the ledger. sleepable_memory::sleep and wake call them in that order, each plan
/// checked first (sleep_plan.hpp).
/// Thread safety: none of its own; the resource calls it under its mutex.
template <class Platform, class Block, class Ledger, class Backing, class Copies>
class sleep_steps {
public:
    using platform_type = Platform;
    using block_type = Block;
    using sleep_plan = detail::sleep_plan<Platform, Block>;
    using wake_plan = detail::wake_plan<Block>;
    using stream_use = detail::stream_use<typename Platform::stream_view>;

    sleep_steps(int device, std::size_t granule, typename Platform::stream& stream, Backing& backing, Copies& copies,
                Ledger& ledger) noexcept
        : device_(device), granule_(granule), stream_(stream), backing_(backing), copies_(copies), ledger_(ledger) {}

    // ---- sleep ----

    /// The resource's stream after every stream of the plan, then the bytes the layers above keep
    /// in discarded blocks copied out (marks[0], the fence, recorded after them), then each
    /// offloaded block's contents copied out, each followed by a mark of its own.
    void save_contents(sleep_plan& plan, const std::vector<std::byte*>& backups) {
        plan.fence.order_before(stream_);
        for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
            if (backups[i] == nullptr) detail::save_kept<platform_type>(plan.blocks[i]->kept, plan.blocks[i]->base(), stream_);
        }
        mark(plan);
        for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
            const block_type& b = *plan.blocks[i];
            if (backups[i] == nullptr) continue;
            copies_.save(b.base(), backups[i], b.bytes, stream_);
            mark(plan);
        }
    }

    /// After a failed sleep, copies out may still be running on the resource's stream, reading the
    /// owners' blocks: waits for them, so that nothing of the sleep touches the blocks once it has
    /// thrown, and gives their host memory back. When that wait fails too (reported), abandons them.
    void undo_sleep(const sleep_plan& plan, const std::vector<std::byte*>& backups) noexcept {
        if (!run_exit_tolerant<platform_type>("sleepable_memory: waiting for a failed sleep's copies",
                                              [&] { platform_type::synchronize(stream_); })) {
            abandon_copies(plan, backups);
            return;
        }
        for (std::size_t i = 0; i < backups.size(); ++i) {
            if (backups[i] != nullptr) backing_.deallocate(stream_, backups[i], plan.blocks[i]->bytes, backup_alignment);
        }
    }

    /// Unmaps the blocks and makes the owners asleep: discarded blocks at once (the fence has
    /// passed), each offloaded one as soon as its copy is done, while the later copies still run.
    /// A block whose copy cannot be waited for (reported) stays mapped with its contents, and its
    /// host memory goes back in the stream's order: its wake keeps what it holds. A block that will
    /// not unmap stays mapped (stuck, reported by the platform).
    void release_memory(sleep_plan& plan, const std::vector<std::byte*>& backups) noexcept {
        const std::size_t before = detail::mapped_bytes_of(plan.blocks);
        const auto release = [&](std::size_t i) {
            block_type& b = *plan.blocks[i];
            const std::size_t held = b.range->mapped_bytes();
            static_cast<void>(b.range->unmap());
            plan.released[plan.slots[i]] += held - b.range->mapped_bytes();
        };
        for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
            if (backups[i] == nullptr) release(i);
        }
        std::size_t next_mark = 1;
        for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
            if (backups[i] == nullptr) continue;
            const typename platform_type::event& copied = plan.marks[next_mark++];
            if (run_exit_tolerant<platform_type>("sleepable_memory: waiting for a block's copy out",
                                                 [&] { copied.synchronize(); })) {
                release(i);
                ledger_.attach_backup(*plan.blocks[i], backups[i]);
            } else {
                abandon_copy(*plan.blocks[i], backups[i]);
            }
        }
        ledger_.remapped(before, detail::mapped_bytes_of(plan.blocks));
        for (std::size_t k = 0; k < plan.owners.size(); ++k) {
            ledger_.fell_asleep(*ledger_.find_owner(plan.owners[k].first), plan.owners[k].second, plan.released[k]);
        }
    }

    // ---- wake ----

    /// Maps each block of the plan that is not usable at the same address with the same access (a
    /// stuck one is usable as it is; one whose access a failed map left unknown is unmapped and
    /// mapped anew, never copied into as it is), and enqueues its contents on the resource's
    /// stream, so that the next block maps while the copies run; returns when they are all in
    /// place. out_of_memory when the device has too little (what was mapped stays noted in
    /// plan.mapped for the undo).
    void map_and_restore(wake_plan& plan) {
        for (block_type* b : plan.blocks) {
            if (!b->range->is_usable()) {
                if (!b->range->map()) throw_no_memory_to_wake(plan);
                plan.mapped.push_back(b);
            }
            restore(*b);
        }
        platform_type::synchronize(stream_);
    }

    /// Unmaps what a failed wake mapped, once nothing enqueued by it can still write there; if that
    /// cannot be known (the wait fails, reported), it stays mapped to the sleeping owners (stuck).
    void undo_wake(const wake_plan& plan) noexcept {
        if (!run_exit_tolerant<platform_type>("sleepable_memory: waiting for a failed wake's copies",
                                              [&] { platform_type::synchronize(stream_); })) {
            return;
        }
        for (auto it = plan.mapped.rbegin(); it != plan.mapped.rend(); ++it) static_cast<void>((*it)->range->unmap());
    }

    void finish_wake(const wake_plan& plan, std::size_t before) noexcept {
        for (block_type* b : plan.blocks) {
            if (std::byte* backup = ledger_.detach_backup(*b)) backing_.deallocate_sync(backup, b->bytes, backup_alignment);
        }
        ledger_.remapped(before, detail::mapped_bytes_of(plan.blocks));
        for (const debug::owner_id id : plan.owners) ledger_.woke(*ledger_.find_owner(id));
    }
private:
    void mark(sleep_plan& plan) {
        plan.marks.emplace_back(device_);
        plan.marks.back().record(stream_);
    }

    /// Copies out that may still be running on the resource's stream: their host memory is given
    /// back in that stream's order, and the stream becomes a use of each block of the plan, so that
    /// freeing one waits for them too (room was reserved by plan_sleep).
    void abandon_copies(const sleep_plan& plan, const std::vector<std::byte*>& backups) noexcept {
        for (std::size_t i = 0; i < backups.size(); ++i) abandon_copy(*plan.blocks[i], backups[i]);
    }
    void abandon_copy(block_type& b, std::byte* backup) noexcept {
        const stream_use own{stream_, device_};
        if (std::find(b.uses.begin(), b.uses.end(), own) == b.uses.end()) b.uses.push_back(own);
        if (backup != nullptr) backing_.deallocate(stream_, backup, b.bytes, backup_alignment);
    }

    /// Offloaded contents copied back, discarded ones zeroed but for what the layers above keep;
    /// an offloaded block that kept its contents in place (its copy out could not be waited for)
    /// needs nothing.
    void restore(block_type& b) {
        if (b.backup != nullptr) {
            copies_.restore(b.backup, b.base(), b.bytes, stream_);
        } else if (ledger_.find_owner(b.owner)->policy == sleep_policy::discard) {
            platform_type::memset_async(b.base(), 0, b.bytes, stream_);
            detail::restore_kept<platform_type>(b.kept, b.base(), stream_);
        }
    }

    [[noreturn]] void throw_no_memory_to_wake(const wake_plan& plan) const {
        std::size_t spans = 0;
        for (const block_type* b : plan.blocks) spans += b->span();
        throw out_of_memory(spans, granule_, device_, ledger_.statistics(), "sleepable_memory",
                            "the device has no physical memory to wake " + std::to_string(spans) + " bytes");
    }

    int device_;
    std::size_t granule_;
    typename Platform::stream& stream_;
    Backing& backing_;
    Copies& copies_;
    Ledger& ledger_;
};

} // namespace custody::sleep::detail
