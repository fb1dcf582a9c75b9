/// @file
/// `live_blocks`: the blocks a checked pool has handed out, by address, so that a deallocate that
/// matches none (a double free, an interior or foreign pointer, a wrong size) is found before it
/// changes anything.
#pragma once

#include <custody/core/failure_callback.hpp>
#include <custody/pool/pool_misuse.hpp>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace custody::pool::detail {

/// The live blocks of a checked pool.
///
/// Invariants: blocks_ holds one entry per block handed out and not yet given back, keyed by its
///   start; entries do not overlap ([start, start + size) are disjoint).
/// Thread safety: thread-safe (one mutex, taken with no other lock of the pool held).
/// Complexity: O(log live blocks) per call.
class live_blocks {
public:
private:
    struct entry {
        std::size_t size = 0;      ///< the block's rounded size
        std::size_t bytes = 0;     ///< as allocated
        std::size_t alignment = 0; ///< as allocated
    };
    using map = std::map<std::uintptr_t, entry>;

public:
    /// The memory of one record, made before the block is taken (what may throw comes first).
    using node = map::node_type;
    [[nodiscard]] static node make_node() {
        map m;
        m.emplace(0, entry{});
        return m.extract(m.begin());
    }

    /// Records, in `n`, a block of `size` bytes (its rounded size) handed out for (`bytes`,
    /// `alignment`). Allocates nothing.
    void add(node n, std::uintptr_t address, std::size_t size, std::size_t bytes, std::size_t alignment) noexcept {
        n.key() = address;
        n.mapped() = entry{size, bytes, alignment};
        std::lock_guard lock(mutex_);
        blocks_.insert(std::move(n));
    }

    /// What `take()` returns (a block of `size` bytes for `bytes` and `alignment`, or nullptr),
    /// recorded. The record's memory is taken first: a bad_alloc takes no block.
    template <class Take>
    [[nodiscard]] void* recorded(std::size_t size, std::size_t bytes, std::size_t alignment, Take&& take) {
        node n = make_node();
        void* p = take();
        if (p != nullptr) add(std::move(n), reinterpret_cast<std::uintptr_t>(p), size, bytes, alignment);
        return p;
    }

    /// remove(m, in_chunk), and the misuse found reported: to `on_misuse`, or else its describe()
    /// to custody::report_failure. True when the block was forgotten.
    template <class InChunk>
    bool forget(const misuse& m, InChunk&& in_chunk, misuse_callback on_misuse) noexcept {
        const std::optional<misuse> found = remove(m, in_chunk);
        if (!found) return true;
        if (on_misuse != nullptr) {
            on_misuse(*found);
            return false;
        }
        try {
            report_failure(found->describe());
        } catch (...) {
            report_failure("stream_ordered_pool: a deallocate that matches no live block was refused");
        }
        return false;
    }

    /// Forgets the block at `m.address` when `m` (bytes, alignment) matches its allocation, and
    /// returns nothing; else returns `m` completed with what is wrong, and forgets nothing.
    /// `in_chunk(address)` tells whether an address lies in one of the pool's chunks.
    template <class InChunk>
    [[nodiscard]] std::optional<misuse> remove(misuse m, InChunk&& in_chunk) noexcept {
        std::lock_guard lock(mutex_);
        auto it = blocks_.upper_bound(m.address);
        if (it != blocks_.begin()) {
            const auto& [start, e] = *std::prev(it);
            if (start == m.address) {
                if (e.bytes == m.bytes && e.alignment == m.alignment) {
                    blocks_.erase(std::prev(it));
                    return std::nullopt;
                }
                return with_block(m, misuse_kind::wrong_size, start, e);
            }
            if (m.address < start + e.size) return with_block(m, misuse_kind::interior_pointer, start, e);
        }
        m.kind = in_chunk(m.address) ? misuse_kind::double_free : misuse_kind::foreign_pointer;
        return m;
    }

    [[nodiscard]] std::size_t size() const {
        std::lock_guard lock(mutex_);
        return blocks_.size();
    }

private:
    static misuse with_block(misuse m, misuse_kind kind, std::uintptr_t start, const entry& e) noexcept {
        m.kind = kind;
        m.block = start;
        m.block_bytes = e.bytes;
        m.block_alignment = e.alignment;
        return m;
    }

    mutable std::mutex mutex_;
    map blocks_;
};

} // namespace custody::pool::detail
