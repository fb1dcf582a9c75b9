// The allocators the pool benchmarks compare, behind one interface: allocate(stream, bytes,
// alignment) and deallocate(stream, p, bytes, alignment), the stream ignored by the peers that have
// none. Every one is asked for 256-byte alignment except glibc's malloc (asked for the bytes alone,
// as most code calls it).
//
//   pool                 custody's stream_ordered_pool over resource::host_memory, checked mode off
//   pool_checked         the same with pool_options::checked (a debug build's default)
//   pool_capture_calls   the same with check_capture = every_call (a capture query per call)
//   pool_graph_kept      the same with a capture-private block kept throughout (a graph kept)
//   malloc               glibc malloc/free
//   pmr_unsync, pmr_sync std::pmr's pool resources over aligned operator new, largest pooled block
//                        1 MiB (the pool's size-class threshold); pmr_unsync is single-threaded
//   jemalloc, mimalloc   loaded with dlopen(RTLD_LOCAL) when installed (libjemalloc.so.2,
//                        libmimalloc.so.2), so that the process's malloc stays glibc's; called
//                        through their fastest entry points, jemalloc's own malloc/free (looked up
//                        in its handle: mallocx and sdallocx take its slow path, 3x the
//                        instructions) and mi_malloc/mi_free, without an alignment (an aligned
//                        request costs both more): their figures are a floor. Absent: not registered.
//   lifo                 the floor: one lock-free LIFO of free blocks per power of two, blocks
//                        from aligned operator new, never given back; single-threaded only (no
//                        ABA protection)
#pragma once

#include "../support/host_streams.hpp"

#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory_resource>
#include <new>
#include <optional>
#include <string>

#include <dlfcn.h>
#include <unistd.h>

namespace custody_bench {

using stream = custody::host::stream_view;
using pool_type = custody::pool::stream_ordered_pool<custody::resource::host_memory>;
inline constexpr std::size_t alignment = 256;
inline constexpr std::size_t MiB = std::size_t{1} << 20;

// ---- custody's pool ------------------------------------------------------------------------------

enum class pool_variant { plain, checked, capture_calls, graph_kept };

inline custody::pool::pool_options pool_options_for(pool_variant v) {
    custody::pool::pool_options o;
    o.checked = v == pool_variant::checked;
    if (v == pool_variant::capture_calls) o.check_capture = custody::pool::capture_check::every_call;
    return o;
}

template <pool_variant Variant>
struct pool_peer {
    static constexpr const char* name = Variant == pool_variant::plain          ? "pool"
                                        : Variant == pool_variant::checked      ? "pool_checked"
                                        : Variant == pool_variant::capture_calls ? "pool_capture_calls"
                                                                                 : "pool_graph_kept";
    static constexpr bool has_streams = true;
    static constexpr bool thread_safe = true;
    static bool available() { return true; }

    pool_type pool{pool_options_for(Variant)};
    /// pool_graph_kept: a capture-private block kept for the whole run, as an engine keeps its
    /// graphs (routed on a stream of its own, which the workload never uses).
    struct kept_graph {
        explicit kept_graph(pool_type& pool) : pool_(pool) {
            if constexpr (Variant == pool_variant::graph_kept) {
                stream_.emplace();
                const custody::pool::capture_pool_id id = pool.make_capture_pool_id();
                pool.begin_allocate_to_pool(id, stream_->view());
                block_ = pool.allocate(stream_->view(), 4096, 256);
                pool.end_allocate_to_pool(id);
            }
        }
        ~kept_graph() {
            if (block_ != nullptr) pool_.deallocate(stream_->view(), block_, 4096, 256);
        }
        kept_graph(const kept_graph&) = delete;
        kept_graph& operator=(const kept_graph&) = delete;
        pool_type& pool_;
        std::optional<custody::host::stream> stream_; ///< pool_graph_kept only
        void* block_ = nullptr;
    } graph{pool};

    [[gnu::always_inline]] void* allocate(stream s, std::size_t n, std::size_t a) { return pool.allocate(s, n, a); }
    [[gnu::always_inline]] void deallocate(stream s, void* p, std::size_t n, std::size_t a) { pool.deallocate(s, p, n, a); }
    double fragmentation(std::size_t) const { return pool.detailed_statistics().fragmentation(); }
};

// ---- glibc and std::pmr --------------------------------------------------------------------------

struct malloc_peer {
    static constexpr const char* name = "malloc";
    static constexpr bool has_streams = false;
    static constexpr bool thread_safe = true;
    static bool available() { return true; }
    void* allocate(stream, std::size_t n, std::size_t) { return std::malloc(n); }
    void deallocate(stream, void* p, std::size_t, std::size_t) { std::free(p); }
    double fragmentation(std::size_t) const { return 0.0; } // not observable
};

/// The pmr pools' upstream: aligned operator new (what resource::host_memory is), with the bytes
/// it holds counted so that a pmr pool's reserve can be compared with custody's pool's.
class counting_upstream final : public std::pmr::memory_resource {
public:
    std::size_t peak() const noexcept { return peak_.load(); }

private:
    void* do_allocate(std::size_t bytes, std::size_t align) override {
        // pmr pools ask for chunks aligned to their block size, beyond host_memory's page maximum:
        // the same aligned operator new host_memory uses, called directly for those.
        void* p = ::operator new(bytes, std::align_val_t{std::max(align, alignment)});
        const std::size_t now = held_.fetch_add(bytes) + bytes;
        std::size_t seen = peak_.load();
        while (seen < now && !peak_.compare_exchange_weak(seen, now)) {
        }
        return p;
    }
    void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
        ::operator delete(p, std::align_val_t{std::max(align, alignment)});
        held_.fetch_sub(bytes);
    }
    bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

    std::atomic<std::size_t> held_{0};
    std::atomic<std::size_t> peak_{0};
};

inline std::pmr::pool_options pmr_options() {
    std::pmr::pool_options o;
    o.largest_required_pool_block = custody::pool::detail::small_threshold; // the pool's threshold
    return o;
}

template <class PmrPool, bool ThreadSafe>
struct pmr_peer {
    static constexpr const char* name = ThreadSafe ? "pmr_sync" : "pmr_unsync";
    static constexpr bool has_streams = false;
    static constexpr bool thread_safe = ThreadSafe;
    static bool available() { return true; }
    counting_upstream upstream;
    PmrPool pool{pmr_options(), &upstream};
    void* allocate(stream, std::size_t n, std::size_t a) { return pool.allocate(n, a); }
    void deallocate(stream, void* p, std::size_t n, std::size_t a) { pool.deallocate(p, n, a); }
    double fragmentation(std::size_t peak_live) const {
        return peak_live == 0 ? 0.0 : static_cast<double>(upstream.peak()) / static_cast<double>(peak_live);
    }
};
using pmr_unsync_peer = pmr_peer<std::pmr::unsynchronized_pool_resource, false>;
using pmr_sync_peer = pmr_peer<std::pmr::synchronized_pool_resource, true>;

// ---- jemalloc and mimalloc, loaded beside glibc's malloc -----------------------------------------

/// The entry points of jemalloc and mimalloc, looked up once. A library that is not installed, or
/// lacks a symbol, leaves its pointers null (its peer is then not registered) and says why in
/// `why`.
struct loaded_peers {
    using malloc_function = void* (*)(std::size_t);
    using free_function = void (*)(void*);
    malloc_function je_malloc = nullptr, mi_malloc = nullptr;
    free_function je_free = nullptr, mi_free = nullptr;
    std::string why_jemalloc, why_mimalloc;
};

/// jemalloc's TLS is initial-exec: dlopen refuses it ("cannot allocate memory in static TLS
/// block") unless glibc keeps room for it. That room is set at start-up only, by this tunable.
inline constexpr const char* static_tls_tunable = "glibc.rtld.optional_static_tls=16384";

inline loaded_peers& peers_loaded() {
    static loaded_peers l = [] {
        loaded_peers r;
        if (void* je = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL)) {
            r.je_malloc = reinterpret_cast<loaded_peers::malloc_function>(dlsym(je, "malloc"));
            r.je_free = reinterpret_cast<loaded_peers::free_function>(dlsym(je, "free"));
            if (r.je_malloc == nullptr || r.je_free == nullptr) r.why_jemalloc = "libjemalloc.so.2 lacks malloc/free";
        } else {
            r.why_jemalloc = dlerror();
        }
        if (void* mi = dlopen("libmimalloc.so.2", RTLD_NOW | RTLD_LOCAL)) {
            r.mi_malloc = reinterpret_cast<loaded_peers::malloc_function>(dlsym(mi, "mi_malloc"));
            r.mi_free = reinterpret_cast<loaded_peers::free_function>(dlsym(mi, "mi_free"));
            if (r.mi_malloc == nullptr || r.mi_free == nullptr) r.why_mimalloc = "libmimalloc.so.2 lacks mi_malloc/mi_free";
        } else {
            r.why_mimalloc = dlerror();
        }
        return r;
    }();
    return l;
}

/// Call first in main: when jemalloc is installed but cannot be loaded for want of static TLS,
/// runs the program again (once) with glibc's tunable that makes room for it. Returns otherwise.
inline void make_room_for_jemalloc(char** argv) {
    const loaded_peers& l = peers_loaded();
    if (l.je_malloc != nullptr || l.why_jemalloc.find("static TLS") == std::string::npos) return;
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if (tunables != nullptr && std::strstr(tunables, "optional_static_tls") != nullptr) return; // tried already
    std::string value = tunables == nullptr ? static_tls_tunable : std::string(tunables) + ":" + static_tls_tunable;
    setenv("GLIBC_TUNABLES", value.c_str(), 1);
    execv("/proc/self/exe", argv);
    std::fprintf(stderr, "could not run again with GLIBC_TUNABLES=%s; jemalloc is left out\n", value.c_str());
}

/// Says on stderr which optional peers are left out, and why.
inline void say_missing_peers() {
    const loaded_peers& l = peers_loaded();
    if (l.je_malloc == nullptr) std::fprintf(stderr, "jemalloc left out: %s\n", l.why_jemalloc.c_str());
    if (l.mi_malloc == nullptr) std::fprintf(stderr, "mimalloc left out: %s\n", l.why_mimalloc.c_str());
}

struct jemalloc_peer {
    static constexpr const char* name = "jemalloc";
    static constexpr bool has_streams = false;
    static constexpr bool thread_safe = true;
    static bool available() { return peers_loaded().je_malloc != nullptr; }
    loaded_peers::malloc_function allocate_ = peers_loaded().je_malloc;
    loaded_peers::free_function free_ = peers_loaded().je_free;
    void* allocate(stream, std::size_t n, std::size_t) { return allocate_(n); }
    void deallocate(stream, void* p, std::size_t, std::size_t) { free_(p); }
    double fragmentation(std::size_t) const { return 0.0; } // not observable here
};

struct mimalloc_peer {
    static constexpr const char* name = "mimalloc";
    static constexpr bool has_streams = false;
    static constexpr bool thread_safe = true;
    static bool available() { return peers_loaded().mi_malloc != nullptr; }
    loaded_peers::malloc_function allocate_ = peers_loaded().mi_malloc;
    loaded_peers::free_function free_ = peers_loaded().mi_free;
    void* allocate(stream, std::size_t n, std::size_t) { return allocate_(n); }
    void deallocate(stream, void* p, std::size_t, std::size_t) { free_(p); }
    double fragmentation(std::size_t) const { return 0.0; } // not observable here
};

// ---- the floor ---------------------------------------------------------------------------------

/// What an allocator cannot beat: a pop and a push of one lock-free stack per power of two.
class lifo_peer {
public:
    static constexpr const char* name = "lifo";
    static constexpr bool has_streams = false;
    static constexpr bool thread_safe = false; // no ABA protection
    static bool available() { return true; }

    lifo_peer() = default;
    lifo_peer(const lifo_peer&) = delete;
    lifo_peer& operator=(const lifo_peer&) = delete;
    ~lifo_peer() {
        for (auto& top : stacks_) {
            for (node* n = top.load(); n != nullptr;) {
                node* next = n->next.load();
                ::operator delete(static_cast<void*>(n), std::align_val_t{alignment});
                n = next;
            }
        }
    }

    void* allocate(stream, std::size_t n, std::size_t) {
        auto& top = stacks_[std::bit_width(n - 1)];
        node* head = top.load(std::memory_order_acquire);
        while (head != nullptr && !top.compare_exchange_weak(head, head->next.load(std::memory_order_relaxed),
                                                             std::memory_order_acquire)) {
        }
        if (head != nullptr) return head;
        return ::operator new(std::bit_ceil(std::max(n, sizeof(node))), std::align_val_t{alignment});
    }
    void deallocate(stream, void* p, std::size_t n, std::size_t) {
        auto& top = stacks_[std::bit_width(n - 1)];
        node* block = ::new (p) node;
        node* head = top.load(std::memory_order_relaxed);
        do {
            block->next.store(head, std::memory_order_relaxed);
        } while (!top.compare_exchange_weak(head, block, std::memory_order_release, std::memory_order_relaxed));
    }
    double fragmentation(std::size_t) const { return 0.0; }

private:
    struct node {
        std::atomic<node*> next{nullptr};
    };
    std::array<std::atomic<node*>, 65> stacks_{};
};

} // namespace custody_bench
