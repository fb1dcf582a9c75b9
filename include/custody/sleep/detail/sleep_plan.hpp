/// @file
/// What a sleep or a wake will do, decided before it changes anything: the owners named (each
/// checked), their blocks, each block's policy and the streams they were used on. A request that
/// the owners' state forbids is refused here, so the steps that follow start from a valid plan.
#pragma once

#include <custody/debug/owner_scope.hpp>
#include <custody/sleep/detail/block_ledger.hpp>
#include <custody/sleep/detail/stream_fence.hpp>
#include <custody/sleep/sleep_error.hpp>
#include <custody/sleep/sleep_policy.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace custody::sleep::detail {

/// The blocks of a sleep, each with its owner's place in the request, and the streams they were
/// used on.
/// Invariants: owners distinct and awake; blocks = the owners' live blocks, in address order;
/// owners[slots[i]].first == blocks[i]->owner; policies[i] == owners[slots[i]].second;
/// released.size() == owners.size(); every block's uses has room for one more stream.
template <class Platform, class Block>
struct sleep_plan {
    using owner_type = typename Block::owner_type;
    std::vector<std::pair<owner_type, sleep_policy>> owners;
    std::vector<Block*> blocks;
    std::vector<std::size_t> slots;     ///< slots[i]: the index in owners of blocks[i]'s owner
    std::vector<sleep_policy> policies; ///< policies[i]: blocks[i]'s owner's
    std::vector<std::size_t> released;  ///< released[k]: bytes owners[k] gave back (filled by the commit)
    stream_fence<Platform> fence;
    /// Recorded on the resource's stream: marks[0] after the fence, marks[1 + j] after the copy out
    /// of the j-th offloaded block.
    std::vector<typename Platform::event> marks;
};

/// The blocks of a wake, and those of them it has mapped so far (to undo if it fails).
/// Invariants: owners distinct and asleep; mapped: the blocks this wake mapped, in the order it
/// mapped them, with capacity for all of blocks (noting one cannot throw).
template <class Block>
struct wake_plan {
    std::vector<typename Block::owner_type> owners;
    std::vector<Block*> blocks;
    std::vector<Block*> mapped;
};

/// The owner `name` names in `Ledger`'s terms ("" and "<untagged>": untagged).
template <class Ledger>
[[nodiscard]] typename Ledger::owner_type owner_named(std::string_view name) {
    return typename Ledger::owner_type(debug::intern_owner(name));
}

/// The sleep of `owners` after the work on their blocks' streams and on `after`. Throws
/// std::invalid_argument (an owner named twice), sleep_error (an owner asleep, a stream capturing)
/// or std::bad_alloc. Changes nothing the resource reports: it may make empty, awake owner states
/// (the commit needs them) and room in the blocks' stream lists. O(n + k + s m) for n live blocks,
/// k owners named, and m uses of their blocks on s distinct streams (few: the streams of a sleep).
template <class Platform, class Ledger>
sleep_plan<Platform, typename Ledger::block_type> plan_sleep(Ledger& ledger, std::span<const owner_sleep> owners,
                                                             std::span<const typename Platform::stream_view> after) {
    using block_type = typename Ledger::block_type;
    sleep_plan<Platform, block_type> plan;
    owner_slots<typename Ledger::owner_type> slots;
    for (const owner_sleep& o : owners) {
        const auto id = owner_named<Ledger>(o.owner);
        if (!slots.add(id)) {
            throw std::invalid_argument("custody: sleepable_memory::sleep: owner '" + std::string(o.owner) + "' named twice");
        }
        if (ledger.asleep(id)) throw sleep_error(sleep_error::reason::owner_asleep, o.owner, "wake it first");
        plan.owners.emplace_back(id, o.policy);
    }
    plan.released.assign(plan.owners.size(), 0);
    for (const auto& [id, policy] : plan.owners) static_cast<void>(ledger.owner(id));
    plan.blocks = ledger.blocks_of(slots);
    plan.slots.reserve(plan.blocks.size());
    plan.policies.reserve(plan.blocks.size());
    for (block_type* b : plan.blocks) {
        b->uses.reserve(b->uses.size() + 1); // room for the resource's own stream, should the copies fail
        plan.slots.push_back(slots.find(b->owner));
        plan.policies.push_back(plan.owners[plan.slots.back()].second);
        plan.fence.add(b->uses);
    }
    for (const auto s : after) {
        const stream_use<typename Platform::stream_view> use{s, Platform::stream_device(s)};
        plan.fence.add(std::span(&use, 1));
    }
    if (const auto capturing = plan.fence.capturing()) {
        std::string_view owner = "(a stream the caller named)";
        for (const block_type* b : plan.blocks) {
            if (std::find(b->uses.begin(), b->uses.end(), *capturing) != b->uses.end()) owner = debug::owner_name(b->owner);
        }
        throw sleep_error(sleep_error::reason::capture_open, owner, "end the capture before the sleep");
    }
    return plan;
}

/// The wake of `owners`. Throws std::invalid_argument (an owner named twice), sleep_error (an owner
/// awake) or std::bad_alloc; changes nothing. O(n + k) for n live blocks and k owners named.
template <class Ledger>
wake_plan<typename Ledger::block_type> plan_wake(Ledger& ledger, std::span<const std::string_view> owners) {
    wake_plan<typename Ledger::block_type> plan;
    owner_slots<typename Ledger::owner_type> slots;
    for (std::string_view name : owners) {
        const auto id = owner_named<Ledger>(name);
        if (!slots.add(id)) {
            throw std::invalid_argument("custody: sleepable_memory::wake: owner '" + std::string(name) + "' named twice");
        }
        if (!ledger.asleep(id)) throw sleep_error(sleep_error::reason::owner_awake, name);
        plan.owners.push_back(id);
    }
    plan.blocks = ledger.blocks_of(slots);
    plan.mapped.reserve(plan.blocks.size());
    return plan;
}

} // namespace custody::sleep::detail
