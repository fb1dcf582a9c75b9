/// @file
/// Questions about a stack of adaptors that one layer alone can answer: each adaptor exposes the
/// resource under it as `upstream()`, and the question walks down to the layer that knows.
#pragma once

#include <concepts>

namespace custody::detail {

/// Whether a graph capture is routed into the capture-private pools of some layer of `r` now: the
/// first layer (r itself, then down through upstream()) that answers `capture_underway()`. False
/// when no layer can tell. While it is true, a layer above must neither query nor synchronize
/// events, nor record one on a stream that may be captured: CUDA invalidates a capture begun in
/// its global mode at an event query from any thread, and an event recorded inside a capture
/// cannot be queried at all. Costs what the answering layer's query costs (the pool: one atomic
/// load).
template <class R>
[[nodiscard]] bool capture_underway(const R& r) noexcept {
    if constexpr (requires {
                      { r.capture_underway() } noexcept -> std::convertible_to<bool>;
                  }) {
        return r.capture_underway();
    } else if constexpr (requires { r.upstream(); }) {
        return capture_underway(r.upstream());
    } else {
        return false;
    }
}

} // namespace custody::detail
