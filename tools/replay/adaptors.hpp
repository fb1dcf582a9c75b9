/// @file
/// The allocators a replay drives, each behind the small interface of replay::replay_allocator:
/// any custody resource, glibc malloc, and the std::pmr pools.
#pragma once

#include "replay.hpp"

#include <custody/core/concepts.hpp>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <memory_resource>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <malloc.h>

namespace custody::replay {

/// The bytes a custody resource holds from below: its statistics' reserved_bytes.
struct statistics_reserved {
    template <class R>
    std::uint64_t operator()(const R& r) const {
        return r.statistics().reserved_bytes;
    }
};

/// A custody stream-ordered resource, driven on the streams `streams` (index 0: the default
/// stream). Failures (out_of_memory, or any other exception) answer nullptr and keep the message.
/// `Reserved` reads what the resource holds (statistics_reserved unless the resource's own
/// statistics do not say, as for cudaMallocAsync's pool).
template <stream_ordered_resource R, class Reserved = statistics_reserved>
class custody_adaptor {
public:
    using stream_type = typename R::stream_type;

    template <class... Args>
    explicit custody_adaptor(const std::vector<stream_type>& streams, Args&&... args)
        : streams_(streams), r_(std::make_unique<R>(std::forward<Args>(args)...)) {}

    void* allocate(std::uint16_t stream, std::uint64_t bytes, std::size_t alignment) noexcept {
        try {
            return r_->allocate(streams_[stream], bytes, alignment);
        } catch (const std::exception& e) {
            failure_ = e.what();
        } catch (...) {
            failure_ = "an unknown exception";
        }
        return nullptr;
    }
    void deallocate(std::uint16_t stream, void* p, std::uint64_t bytes, std::size_t alignment) noexcept {
        r_->deallocate(streams_[stream], p, bytes, alignment);
    }
    [[nodiscard]] std::uint64_t reserved() const { return Reserved{}(*r_); }
    [[nodiscard]] std::optional<std::uint64_t> largest_free() const {
        if constexpr (requires { r_->detailed_statistics().largest_free_block; }) {
            return r_->detailed_statistics().largest_free_block;
        } else {
            return std::nullopt;
        }
    }
    [[nodiscard]] std::optional<std::uint64_t> peak_live() const {
        if constexpr (resource_with_statistics<R>) {
            return r_->statistics().peak_live_bytes;
        } else {
            return std::nullopt;
        }
    }
    void settle() {
        if constexpr (requires { R::platform_type::synchronize_device(0); }) {
            if constexpr (device_bound_resource<R>) {
                if (r_->device() >= 0) R::platform_type::synchronize_device(r_->device());
            }
        }
    }
    [[nodiscard]] const std::string& failure() const noexcept { return failure_; }
    [[nodiscard]] R& resource() noexcept { return *r_; }

    /// For a pool that grows by mapping: its address range, its map and unmap calls so far, and what
    /// it keeps mapped once trimmed (this trims it). Nothing for any other resource.
    [[nodiscard]] std::optional<mapping_figures> mapping() {
        if constexpr (requires { r_->detailed_statistics().address_space_bytes; r_->trim(); }) {
            const auto before = r_->detailed_statistics();
            if (before.address_space_bytes == 0) return std::nullopt;
            mapping_figures f;
            f.address_space = before.address_space_bytes;
            f.peak_span = before.peak_address_span_bytes;
            f.granule = before.map_granule;
            f.map_calls = before.upstream_allocations;
            f.unmap_calls = before.upstream_deallocations;
            f.live_at_end = before.live_block_bytes;
            r_->trim();
            f.mapped_after_trim = r_->statistics().reserved_bytes;
            return f;
        } else {
            return std::nullopt;
        }
    }

private:
    const std::vector<stream_type>& streams_;
    std::unique_ptr<R> r_;
    std::string failure_;
};

namespace detail {

/// What glibc's malloc holds from the system now (its heap and its mmapped chunks: `held`) and
/// how much of it is handed out (`in_use`).
struct malloc_bytes {
    std::uint64_t held = 0;
    std::uint64_t in_use = 0;
};
inline malloc_bytes malloc_now() noexcept {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    const struct mallinfo2 m = ::mallinfo2();
    return {static_cast<std::uint64_t>(m.arena) + static_cast<std::uint64_t>(m.hblkhd),
            static_cast<std::uint64_t>(m.uordblks) + static_cast<std::uint64_t>(m.hblkhd)};
#else
    return {};
#endif
}

} // namespace detail

/// glibc malloc (posix_memalign above 16-byte alignment). Streams are ignored. Reserved: what
/// malloc holds from the system (mallinfo2's arena + mmapped bytes) less what was handed out when
/// the adaptor was built, so the replay tool's own memory is left out while the free heap malloc
/// already held counts as what it is, malloc's cache (reserved >= live).
class malloc_adaptor {
public:
    malloc_adaptor() noexcept : baseline_(detail::malloc_now().in_use) {}

    void* allocate(std::uint16_t, std::uint64_t bytes, std::size_t alignment) noexcept {
        void* p = nullptr;
        if (alignment <= alignof(std::max_align_t)) {
            p = std::malloc(bytes);
        } else if (::posix_memalign(&p, alignment, bytes) != 0) {
            p = nullptr;
        }
        if (p == nullptr) failure_ = "malloc returned null for " + std::to_string(bytes) + " bytes";
        return p;
    }
    void deallocate(std::uint16_t, void* p, std::uint64_t, std::size_t) noexcept { std::free(p); }
    [[nodiscard]] std::uint64_t reserved() const noexcept {
        const std::uint64_t held = detail::malloc_now().held;
        return held > baseline_ ? held - baseline_ : 0;
    }
    [[nodiscard]] std::optional<std::uint64_t> largest_free() const noexcept { return std::nullopt; }
    [[nodiscard]] std::optional<std::uint64_t> peak_live() const noexcept { return std::nullopt; }
    void settle() noexcept {}
    [[nodiscard]] const std::string& failure() const noexcept { return failure_; }

private:
    std::uint64_t baseline_; // bytes handed out when the adaptor was built
    std::string failure_;
};

/// The global operator new with the bytes it hands out counted: the std::pmr pools' upstream.
class counted_new_delete final : public std::pmr::memory_resource {
public:
    [[nodiscard]] std::uint64_t held() const noexcept { return held_; }

private:
    void* do_allocate(std::size_t bytes, std::size_t alignment) override {
        void* p = ::operator new(bytes, std::align_val_t{alignment});
        held_ += bytes;
        return p;
    }
    void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override {
        ::operator delete(p, std::align_val_t{alignment});
        held_ -= bytes;
    }
    [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
        return this == &other;
    }

    std::uint64_t held_ = 0; // single-threaded: the replay's thread
};

/// A std::pmr pool (`Pool` = unsynchronized_pool_resource or synchronized_pool_resource) over
/// counted_new_delete. Streams are ignored. Reserved: the bytes the pool holds from its upstream.
template <class Pool>
class pmr_adaptor {
public:
    explicit pmr_adaptor(const std::pmr::pool_options& options) : pool_(options, &upstream_) {}

    void* allocate(std::uint16_t, std::uint64_t bytes, std::size_t alignment) noexcept {
        try {
            return pool_.allocate(bytes, alignment);
        } catch (const std::exception& e) {
            failure_ = e.what();
        }
        return nullptr;
    }
    void deallocate(std::uint16_t, void* p, std::uint64_t bytes, std::size_t alignment) noexcept {
        pool_.deallocate(p, bytes, alignment);
    }
    [[nodiscard]] std::uint64_t reserved() const noexcept { return upstream_.held(); }
    [[nodiscard]] std::optional<std::uint64_t> largest_free() const noexcept { return std::nullopt; }
    [[nodiscard]] std::optional<std::uint64_t> peak_live() const noexcept { return std::nullopt; }
    void settle() noexcept {}
    [[nodiscard]] const std::string& failure() const noexcept { return failure_; }

private:
    counted_new_delete upstream_;
    Pool pool_;
    std::string failure_;
};

} // namespace custody::replay
