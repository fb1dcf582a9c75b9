/// @file
/// `capture_pool_id`: the name a caller gives to a pool's capture-private memory (PyTorch's
/// MempoolId_t), and `capture_check`: how the pool learns that a stream is being captured.
#pragma once

#include <compare>
#include <cstdint>

namespace custody::pool {

/// Names one capture-private pool of a stream_ordered_pool. The caller chooses it (as PyTorch's
/// `MempoolId_t`, a pair of integers): graphs captured with one id share that memory, so they must
/// never run concurrently. stream_ordered_pool::make_capture_pool_id() hands out ids {0, n} that
/// no other call of it returns. A plain value.
struct capture_pool_id {
    std::uint64_t first = 0;
    std::uint64_t second = 0;
    // Both spelled out: nvcc's front end does not derive == from a defaulted <=>.
    friend constexpr bool operator==(const capture_pool_id&, const capture_pool_id&) noexcept = default;
    friend constexpr auto operator<=>(const capture_pool_id&, const capture_pool_id&) noexcept = default;
};

/// How a stream_ordered_pool learns that a stream is being captured into a graph.
enum class capture_check : unsigned char {
    /// Through the captures it is told of (a capture_scope, or begin_allocate_to_pool): no query
    /// per call while none is open; while one is, streams other than the scopes' own are asked
    /// (Platform::query_capture). A capture the pool is not told of is the caller's error, as
    /// with PyTorch's caching allocator.
    scopes,
    /// Asks the platform at every allocate and deallocate (cudaStreamGetCaptureInfo on CUDA): an
    /// allocation on a stream captured without the pool's knowledge is refused (capture_error)
    /// rather than served from memory a replay could share with later allocations.
    every_call,
};

} // namespace custody::pool
