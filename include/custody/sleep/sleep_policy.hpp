/// @file
/// `sleep_policy` and `owner_sleep`: what becomes of an owner's contents while it sleeps.
#pragma once

#include <string_view>

namespace custody::sleep {

/// What sleep does with the contents of an owner's blocks before their memory goes back.
enum class sleep_policy : unsigned char {
    /// Dropped: wake gives the blocks back filled with zeros (a KV cache, activations, scratch).
    discard,
    /// Copied to host memory first: wake gives them back byte for byte (weights).
    offload,
};

/// One owner of a sleep call and its policy. `owner` names an owner exactly as the owner scope
/// made it ("decoder/layer.3" for nested scopes; a nested scope is an owner of its own), or
/// debug::untagged_owner for memory allocated without one.
struct owner_sleep {
    std::string_view owner;
    sleep_policy policy = sleep_policy::discard;
};

} // namespace custody::sleep
