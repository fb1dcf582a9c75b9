/// @file
/// `reservation<T, Ring>`: a typed region of a staging ring handed to one producer, to fill then commit.
#pragma once

#include <cstddef>
#include <span>
#include <utility>

namespace custody::staging {

/// A contiguous typed region of a staging ring, handed to one producer: fill it, then give it to
/// the ring's commit. Move-only. Destroyed (or reset) without a commit, it goes back to the ring
/// unused. An empty reservation (from try_reserve, or moved from) owns nothing.
///
/// Thread safety: one owner at a time, like any value. Ownership: refers to its ring, which must
/// outlive it. The span is valid until the reservation is committed or destroyed.
template <class T, class Ring>
class reservation {
public:
    reservation() noexcept = default;
    reservation(reservation&& other) noexcept
        : ring_(std::exchange(other.ring_, nullptr)), slot_(other.slot_), offset_(other.offset_),
          span_(std::exchange(other.span_, {})) {}
    reservation& operator=(reservation&& other) noexcept {
        if (this != &other) {
            reset();
            ring_ = std::exchange(other.ring_, nullptr);
            slot_ = other.slot_;
            offset_ = other.offset_;
            span_ = std::exchange(other.span_, {});
        }
        return *this;
    }
    reservation(const reservation&) = delete;
    reservation& operator=(const reservation&) = delete;
    ~reservation() { reset(); }

    [[nodiscard]] bool empty() const noexcept { return ring_ == nullptr; }
    explicit operator bool() const noexcept { return ring_ != nullptr; }
    [[nodiscard]] std::span<T> span() const noexcept { return span_; }
    [[nodiscard]] T* data() const noexcept { return span_.data(); }
    [[nodiscard]] std::size_t size() const noexcept { return span_.size(); }
    [[nodiscard]] std::size_t size_bytes() const noexcept { return span_.size_bytes(); }
    [[nodiscard]] T* begin() const noexcept { return span_.data(); }
    [[nodiscard]] T* end() const noexcept { return span_.data() + span_.size(); }
    [[nodiscard]] T& operator[](std::size_t i) const noexcept { return span_[i]; }
    /// Byte offset of the region in the ring (for diagnostics and tests).
    [[nodiscard]] std::size_t offset() const noexcept { return offset_; }

    /// Gives the region back unused. Idempotent.
    void reset() noexcept {
        if (ring_ != nullptr) std::exchange(ring_, nullptr)->cancel(slot_);
        span_ = {};
    }

private:
    friend Ring;
    reservation(Ring* ring, std::size_t slot, std::size_t offset, std::span<T> span) noexcept
        : ring_(ring), slot_(slot), offset_(offset), span_(span) {}

    Ring* ring_ = nullptr; ///< nullptr: empty
    std::size_t slot_ = 0;
    std::size_t offset_ = 0;
    std::span<T> span_;
};

} // namespace custody::staging
