/// @file
/// `capture_error`: what the pool throws when asked for memory on a stream that is being captured
/// into a CUDA graph.
#pragma once

#include <custody/core/detail/format.hpp>
#include <custody/core/error.hpp>

#include <cstdint>
#include <string>

namespace custody::pool {

/// An allocation was requested on a stream under graph capture. The pool refuses rather than
/// record events or synchronize inside a capture (either would break it or make the graph reuse
/// memory unsafely on replay). Nothing was changed. Allocate the graph's memory before capture, or
/// use a resource that serves capture (cudaMallocAsync's graph memory nodes).
class capture_error final : public custody::error {
public:
    capture_error(std::uintptr_t stream_key, std::size_t bytes)
        : error("custody: stream_ordered_pool refuses to allocate " + std::to_string(bytes) +
                " bytes on stream " + custody::detail::to_hex(stream_key) +
                " while it is being captured into a graph; allocate before capture"),
          stream_key_(stream_key), bytes_(bytes) {}

    [[nodiscard]] std::uintptr_t stream_key() const noexcept { return stream_key_; }
    [[nodiscard]] std::size_t requested() const noexcept { return bytes_; }

private:
    std::uintptr_t stream_key_;
    std::size_t bytes_;
};

} // namespace custody::pool
