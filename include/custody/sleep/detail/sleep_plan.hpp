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

/// The blocks of a sleep, each with its owner's policy, and the streams they were used on.
/// Invariants: owners distinct and awake; blocks = the owners' live blocks, in address order;
/// policies.size() == blocks.size(); released.size() == owners.size(); every block's uses has room
/// for one more stream.
template <class Platform, class Block>
struct sleep_plan {
    std::vector<std::pair<owner_id, sleep_policy>> owners;
    std::vector<Block*> blocks;
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
    std::vector<owner_id> owners;
    std::vector<Block*> blocks;
    std::vector<Block*> mapped;
};

/// The sleep of `owners` after the work on their blocks' streams and on `after`. Throws
/// std::invalid_argument (an owner named twice), sleep_error (an owner asleep, a stream capturing)
/// or std::bad_alloc. Changes nothing the resource reports: it may make empty, awake owner states
/// (the commit needs them) and room in the blocks' stream lists.
template <class Platform, class Ledger>
sleep_plan<Platform, typename Ledger::block_type> plan_sleep(Ledger& ledger, std::span<const owner_sleep> owners,
                                                             std::span<const typename Platform::stream_view> after) {
    using block_type = typename Ledger::block_type;
    sleep_plan<Platform, block_type> plan;
    for (const owner_sleep& o : owners) {
        const owner_id id = owner_named(o.owner);
        if (std::any_of(plan.owners.begin(), plan.owners.end(), [&](const auto& p) { return p.first == id; })) {
            throw std::invalid_argument("custody: sleepable_memory::sleep: owner '" + std::string(o.owner) + "' named twice");
        }
        if (ledger.asleep(id)) throw sleep_error(sleep_error::reason::owner_asleep, o.owner, "wake it first");
        plan.owners.emplace_back(id, o.policy);
    }
    plan.released.assign(plan.owners.size(), 0);
    std::vector<owner_id> ids;
    for (const auto& [id, policy] : plan.owners) {
        static_cast<void>(ledger.owner(id));
        ids.push_back(id);
    }
    plan.blocks = ledger.blocks_of(ids);
    for (block_type* b : plan.blocks) {
        b->uses.reserve(b->uses.size() + 1); // room for the resource's own stream, should the copies fail
        const auto it = std::find_if(plan.owners.begin(), plan.owners.end(), [&](const auto& p) { return p.first == b->owner; });
        plan.policies.push_back(it->second);
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
/// awake) or std::bad_alloc; changes nothing.
template <class Ledger>
wake_plan<typename Ledger::block_type> plan_wake(Ledger& ledger, std::span<const std::string_view> owners) {
    wake_plan<typename Ledger::block_type> plan;
    for (std::string_view name : owners) {
        const owner_id id = owner_named(name);
        if (std::find(plan.owners.begin(), plan.owners.end(), id) != plan.owners.end()) {
            throw std::invalid_argument("custody: sleepable_memory::wake: owner '" + std::string(name) + "' named twice");
        }
        if (!ledger.asleep(id)) throw sleep_error(sleep_error::reason::owner_awake, name);
        plan.owners.push_back(id);
    }
    plan.blocks = ledger.blocks_of(plan.owners);
    plan.mapped.reserve(plan.blocks.size());
    return plan;
}

} // namespace custody::sleep::detail
