/// @file
/// `ticket<T, Ring>`: a download staged into a staging ring; wait() gives a read-only span of it.
#pragma once

#include <custody/staging/errors.hpp>

#include <cstddef>
#include <span>
#include <utility>

namespace custody::staging {

/// A download staged into a staging ring. wait() blocks until the copy has landed and gives a
/// read-only span of it, valid until the ticket is released (release() or destruction). Move-only.
/// Reading a released (or moved-from, or empty) ticket throws released_ticket_error.
///
/// Thread safety: one owner at a time. Ownership: refers to its ring, which must outlive it.
/// A held ticket keeps its region, and every region placed after it, from being reused: release
/// tickets promptly, or the ring fills up behind them.
template <class T, class Ring>
class ticket {
public:
    ticket() noexcept = default;
    ticket(ticket&& other) noexcept
        : ring_(std::exchange(other.ring_, nullptr)), slot_(other.slot_), span_(std::exchange(other.span_, {})) {}
    ticket& operator=(ticket&& other) noexcept {
        if (this != &other) {
            release();
            ring_ = std::exchange(other.ring_, nullptr);
            slot_ = other.slot_;
            span_ = std::exchange(other.span_, {});
        }
        return *this;
    }
    ticket(const ticket&) = delete;
    ticket& operator=(const ticket&) = delete;
    ~ticket() { release(); }

    [[nodiscard]] bool empty() const noexcept { return ring_ == nullptr; }
    explicit operator bool() const noexcept { return ring_ != nullptr; }
    [[nodiscard]] std::size_t size() const noexcept { return span_.size(); }

    /// Whether the copy has landed (non-blocking). Throws released_ticket_error if released.
    [[nodiscard]] bool ready() const {
        if (ring_ == nullptr) throw released_ticket_error();
        return ring_->ticket_ready(slot_);
    }

    /// Blocks until the copy has landed; the span stays valid until release().
    /// Throws released_ticket_error if released.
    [[nodiscard]] std::span<const T> wait() const {
        if (ring_ == nullptr) throw released_ticket_error();
        ring_->ticket_wait(slot_);
        return span_;
    }

    /// Hands the region back to the ring (once its copy has finished, whether or not anyone
    /// waited). Idempotent.
    void release() noexcept {
        if (ring_ != nullptr) std::exchange(ring_, nullptr)->ticket_release(slot_);
        span_ = {};
    }

private:
    friend Ring;
    ticket(Ring* ring, std::size_t slot, std::span<const T> span) noexcept : ring_(ring), slot_(slot), span_(span) {}

    Ring* ring_ = nullptr; ///< nullptr: released or empty
    std::size_t slot_ = 0;
    std::span<const T> span_;
};

} // namespace custody::staging
