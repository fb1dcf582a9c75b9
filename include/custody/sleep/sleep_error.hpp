/// @file
/// `sleep_error`: what a sleepable_memory throws for a request its owners' sleep forbids.
#pragma once

#include <custody/core/error.hpp>

#include <string>
#include <string_view>

namespace custody::sleep {

/// A request that the sleep state of an owner forbids. Thrown before anything changed: the
/// resource, its owners and their memory are as they were (strong guarantee).
class sleep_error final : public custody::error {
public:
    enum class reason : unsigned char {
        owner_asleep, ///< allocating for an owner that is asleep, or putting it to sleep again
        owner_awake,  ///< waking an owner that is not asleep
        capture_open, ///< sleeping while a stream an owner's blocks were used on is capturing a graph
    };

    sleep_error(reason r, std::string_view owner, std::string_view detail = {})
        : error(message(r, owner, detail)), reason_(r), owner_(owner) {}

    [[nodiscard]] reason why() const noexcept { return reason_; }
    /// The owner the request was refused for ("<untagged>" for memory allocated without one).
    [[nodiscard]] const std::string& owner() const noexcept { return owner_; }

private:
    static std::string message(reason r, std::string_view owner, std::string_view detail) {
        std::string m = "custody: sleepable_memory: owner '";
        m += owner;
        switch (r) {
        case reason::owner_asleep: m += "' is asleep"; break;
        case reason::owner_awake: m += "' is not asleep"; break;
        case reason::capture_open: m += "' has blocks used on a stream that is capturing a graph"; break;
        }
        if (!detail.empty()) {
            m += ": ";
            m += detail;
        }
        return m;
    }

    reason reason_;
    std::string owner_;
};

} // namespace custody::sleep
