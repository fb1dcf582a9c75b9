/// @file
/// The typed errors of the staging layer: a reservation that waited past its deadline, and a
/// download ticket read after it was released.
///
/// Map of every error the staging ring throws (the ring is unchanged after each):
///   timeout_error          : custody::error        reserve/stage waited longer than the caller allowed
///   released_ticket_error  : custody::error        a released (or empty) ticket was read
///   std::length_error                              a request larger than the ring, or whose size overflows
///   std::invalid_argument                          zero elements, a null or too small destination,
///                                                  an empty reservation, a bad alignment
#pragma once

#include <custody/core/error.hpp>

#include <chrono>
#include <cstddef>
#include <string>

namespace custody::staging {

/// A reservation (or a download) waited longer than its timeout for the ring to have room.
/// Carries the request and the timeout; the ring is unchanged.
class timeout_error final : public custody::error {
public:
    timeout_error(std::size_t requested_bytes, std::chrono::nanoseconds timeout)
        : error("custody: staging ring: no room for " + std::to_string(requested_bytes) + " bytes within " +
                std::to_string(timeout.count()) + " ns"),
          requested_(requested_bytes), timeout_(timeout) {}

    [[nodiscard]] std::size_t requested_bytes() const noexcept { return requested_; }
    [[nodiscard]] std::chrono::nanoseconds timeout() const noexcept { return timeout_; }

private:
    std::size_t requested_;
    std::chrono::nanoseconds timeout_;
};

/// A download ticket was read after it had been released (or moved from): its region may already
/// hold another transfer's bytes, so no span can be given.
class released_ticket_error final : public custody::error {
public:
    released_ticket_error() : error("custody: staging ring: ticket read after it was released") {}
};

} // namespace custody::staging
