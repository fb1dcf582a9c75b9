// The pool's capture-private memory, written once over the platform and run on the host platform in
// CI (tests/pool/capture_test.cpp) and on the cuda platform on a GPU (tests/pool/pool_cuda_test.cpp).
// Captured work writes cookies (memset nodes); the host reads them back after each replay.
#pragma once

#include <custody/platform/capture.hpp>
#include <custody/pool/capture_scope.hpp>
#include <custody/pool/pool_statistics.hpp>

#include "catch.hpp"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace custody_test {

/// True when every byte of [p, p + n) reads `value` once the work enqueued on `s` so far has run.
template <class Platform>
bool holds_cookie(typename Platform::stream_view s, const void* p, std::size_t n, unsigned char value) {
    std::vector<unsigned char> host(n, static_cast<unsigned char>(~value));
    Platform::memcpy_async(host.data(), p, n, s);
    Platform::synchronize(s);
    for (unsigned char c : host) {
        if (c != value) return false;
    }
    return true;
}

/// [a, a + n) and [b, b + m) share a byte.
inline bool overlap(const void* a, std::size_t n, const void* b, std::size_t m) {
    const auto x = reinterpret_cast<std::uintptr_t>(a);
    const auto y = reinterpret_cast<std::uintptr_t>(b);
    return x < y + m && y < x + n;
}

/// The pool's accounting identity, with its capture-private part.
inline void check_identity(const custody::pool::pool_statistics& p) {
    CHECK(p.totals.reserved_bytes == p.live_block_bytes + p.stream_cached_bytes + p.shared_free_bytes +
                                         p.quarantined_bytes + p.capture_reserved_bytes);
    CHECK(p.capture_reserved_bytes == p.capture_live_block_bytes + p.capture_free_bytes);
}

/// Capture once, replay many times: the private blocks keep the cookies the replays write, a block
/// given back during the capture serves the capture's next allocation on that stream, and no
/// ordinary allocation (made between replays, on another stream) lands in private memory.
/// Destroying the graph and giving its blocks back returns the private memory.
template <class Pool>
void case_capture_replay_cookies(Pool& pool) {
    using P = typename Pool::platform_type;
    typename P::stream s(0);
    typename P::stream t(0);
    void* a = nullptr;
    void* c = nullptr;
    void* b = nullptr;
    custody::pool::capture_scope scope(pool, s);
    a = pool.allocate(s, 3000, 256);
    b = pool.allocate(s, 5000, 256);
    P::memset_async(a, 0xA1, 3000, s);
    P::memset_async(b, 0xB2, 5000, s);
    pool.deallocate(s, b, 5000, 256);
    c = pool.allocate(s, 5000, 256);
    CHECK(c == b); // capture order on one stream: the block given back serves the next request
    P::memset_async(c, 0xC3, 5000, s);
    CHECK(P::query_capture(s).status == custody::capture_status::active);
    custody::pool::captured_graph graph = scope.end();
    const auto captured = pool.detailed_statistics();
    CHECK(captured.capture_live_block_bytes >= 3000 + 5000);
    CHECK(captured.capture_pools == 1);
    check_identity(captured);

    std::vector<std::pair<void*, std::size_t>> ordinary;
    for (int round = 0; round < 20; ++round) {
        for (std::size_t n : {std::size_t{3000}, std::size_t{5000}, std::size_t{256}, std::size_t{3} << 20}) {
            void* q = pool.allocate(t, n, 256);
            CHECK_FALSE(overlap(q, n, a, 3000));
            CHECK_FALSE(overlap(q, n, c, 5000));
            P::memset_async(q, 0x5A, n, t);
            ordinary.emplace_back(q, n);
        }
        graph.launch(s);
        P::synchronize(t);
        CHECK(holds_cookie<P>(s, a, 3000, 0xA1));
        CHECK(holds_cookie<P>(s, c, 5000, 0xC3));
        if (round % 2 == 1) { // give back half, so that later rounds reuse ordinary memory
            for (auto& [q, n] : ordinary) pool.deallocate(t, q, n, 256);
            ordinary.clear();
        }
    }
    for (auto& [q, n] : ordinary) {
        CHECK(holds_cookie<P>(t, q, n, 0x5A));
        pool.deallocate(t, q, n, 256);
    }
    check_identity(pool.detailed_statistics());

    graph.reset();
    CHECK(pool.detailed_statistics().capture_reserved_bytes != 0); // a and c are still out
    pool.deallocate(s, a, 3000, 256);
    CHECK(pool.detailed_statistics().capture_reserved_bytes != 0);
    pool.deallocate(s, c, 5000, 256);
    const auto released = pool.detailed_statistics();
    CHECK(released.capture_reserved_bytes == 0);
    CHECK(released.capture_pools == 0);
    CHECK(released.totals.live_allocations == 0);
    check_identity(released);
}

/// Two graphs captured into one private pool (they never run concurrently): the second reuses what
/// the first gave back during its capture instead of taking more memory, the blocks both keep stay
/// intact across alternating replays, and the memory goes back only when neither graph is left.
template <class Pool>
void case_shared_pool(Pool& pool) {
    using P = typename Pool::platform_type;
    typename P::stream s(0);
    constexpr std::size_t big = std::size_t{3} << 19; // 1.5 MiB: two do not fit in one 2 MiB chunk
    custody::pool::capture_scope first(pool, s);
    void* scratch = pool.allocate(s, big, 256);
    P::memset_async(scratch, 0x11, big, s);
    pool.deallocate(s, scratch, big, 256);
    void* out1 = pool.allocate(s, 4096, 256);
    P::memset_async(out1, 0x21, 4096, s);
    custody::pool::captured_graph g1 = first.end();
    const std::size_t reserved_after_first = pool.detailed_statistics().capture_reserved_bytes;

    custody::pool::capture_scope second(pool, s, g1.pool_id());
    void* scratch2 = pool.allocate(s, big, 256);
    // Given back during the first capture: the second takes that memory instead of a new chunk.
    CHECK(overlap(scratch2, big, scratch, big));
    P::memset_async(scratch2, 0x12, big, s);
    void* out2 = pool.allocate(s, 4096, 256);
    CHECK_FALSE(overlap(out2, 4096, out1, 4096)); // out1 is still out: never shared
    P::memset_async(out2, 0x22, 4096, s);
    pool.deallocate(s, scratch2, big, 256);
    custody::pool::captured_graph g2 = second.end();
    CHECK(g2.pool_id() == g1.pool_id());
    CHECK(pool.detailed_statistics().capture_reserved_bytes == reserved_after_first);
    CHECK(pool.detailed_statistics().capture_pools == 1);

    for (int i = 0; i < 10; ++i) {
        g1.launch(s);
        g2.launch(s);
        CHECK(holds_cookie<P>(s, out1, 4096, 0x21));
        CHECK(holds_cookie<P>(s, out2, 4096, 0x22));
    }
    pool.deallocate(s, out1, 4096, 256);
    pool.deallocate(s, out2, 4096, 256);
    g1.reset();
    CHECK(pool.detailed_statistics().capture_reserved_bytes == reserved_after_first); // g2 still holds it
    g2.reset();
    CHECK(pool.detailed_statistics().capture_reserved_bytes == 0);
    check_identity(pool.detailed_statistics());
}

/// The hooks a framework calls (PyTorch's beginAllocateToPool/endAllocateToPool/releasePool):
/// release is deferred while blocks are out and refused when nothing is held; a pool being
/// allocated to cannot be begun twice; a released id is never begun again, its memory gone or not.
template <class Pool>
void case_release_rules(Pool& pool) {
    using P = typename Pool::platform_type;
    typename P::stream s(0);
    const custody::pool::capture_pool_id id = pool.make_capture_pool_id();
    CHECK(pool.make_capture_pool_id() != id);
    CHECK_THROWS_AS(pool.release_pool(id), std::invalid_argument);          // never begun
    CHECK_THROWS_AS(pool.end_allocate_to_pool(id), std::invalid_argument);  // not being allocated to
    pool.begin_allocate_to_pool(id, s);
    CHECK_THROWS_AS(pool.begin_allocate_to_pool(id, s), std::invalid_argument);
    P::begin_capture(s, custody::capture_mode::global);
    void* kept = pool.allocate(s, 8192, 256);
    P::memset_async(kept, 0x33, 8192, s);
    typename P::graph g = P::end_capture(s);
    pool.end_allocate_to_pool(id);
    P::launch(g, s);
    CHECK(holds_cookie<P>(s, kept, 8192, 0x33));

    const std::size_t reserved = pool.detailed_statistics().capture_reserved_bytes;
    CHECK(reserved != 0);
    pool.release_pool(id); // the last hold: deferred while `kept` is out
    CHECK(pool.detailed_statistics().capture_reserved_bytes == reserved);
    CHECK_THROWS_AS(pool.release_pool(id), std::invalid_argument); // nothing held any more
    CHECK_THROWS_AS(pool.begin_allocate_to_pool(id, s), std::invalid_argument);
    void* ordinary = pool.allocate(s, 8192, 256);
    CHECK_FALSE(overlap(ordinary, 8192, kept, 8192));
    pool.deallocate(s, ordinary, 8192, 256);
    pool.deallocate(s, kept, 8192, 256); // now the memory goes back
    CHECK(pool.detailed_statistics().capture_reserved_bytes == 0);
    CHECK(pool.detailed_statistics().capture_pools == 0);
    CHECK_THROWS_AS(pool.begin_allocate_to_pool(id, s), std::invalid_argument); // released for good
    CHECK_THROWS_AS(pool.release_pool(id), std::invalid_argument);

    // An id released before it took any memory is released for good too.
    const custody::pool::capture_pool_id empty = pool.make_capture_pool_id();
    pool.begin_allocate_to_pool(empty, s);
    pool.end_allocate_to_pool(empty);
    pool.release_pool(empty);
    CHECK_THROWS_AS(pool.begin_allocate_to_pool(empty, s), std::invalid_argument);
    check_identity(pool.detailed_statistics());
}

/// A capture abandoned without end_allocate_to_pool (the graph given up and its pool released
/// while the route is open): the release ends the route, the stream's allocations are ordinary
/// again, and trim() collects the private memory, which the open route held back for good.
template <class Pool>
void case_abandoned_route(Pool& pool) {
    using P = typename Pool::platform_type;
    typename P::stream s(0);
    const custody::pool::capture_pool_id id = pool.make_capture_pool_id();
    pool.begin_allocate_to_pool(id, s);
    P::begin_capture(s, custody::capture_mode::global);
    void* scratch = pool.allocate(s, 8192, 256);
    pool.deallocate(s, scratch, 8192, 256);
    static_cast<void>(P::end_capture(s)); // the graph is dropped, never replayed
    CHECK(pool.detailed_statistics().capture_reserved_bytes != 0);
    pool.release_pool(id); // no end_allocate_to_pool: the route is abandoned with it
    pool.trim();
    CHECK(pool.detailed_statistics().capture_reserved_bytes == 0);
    CHECK(pool.detailed_statistics().capture_pools == 0);
    void* ordinary = pool.allocate(s, 8192, 256);
    CHECK(pool.detailed_statistics().capture_live_block_bytes == 0);
    pool.deallocate(s, ordinary, 8192, 256);
    CHECK_THROWS_AS(pool.end_allocate_to_pool(id), std::invalid_argument);
    CHECK_THROWS_AS(pool.begin_allocate_to_pool(id, s), std::invalid_argument);
    check_identity(pool.detailed_statistics());
}

/// While a graph is captured on s, ordinary allocations elsewhere (another stream of the capturing
/// thread, and another thread in the default global mode), growth included, are served as usual
/// from ordinary memory, and the capture stays valid: the pool made no call that breaks it.
template <class Pool>
void case_ordinary_during_capture(Pool& pool) {
    using P = typename Pool::platform_type;
    typename P::stream s(0);
    typename P::stream t(0);
    typename P::stream u(0); // made (and destroyed) outside the capture: CUDA may forbid that during one
    custody::pool::capture_scope scope(pool, s);
    void* priv = pool.allocate(s, 4096, 256);
    P::memset_async(priv, 0x44, 4096, s);
    const std::size_t private_live = pool.detailed_statistics().capture_live_block_bytes;

    void* here = pool.allocate(t, std::size_t{5} << 20, 256); // grows: a chunk of its own
    P::memset_async(here, 0x66, std::size_t{5} << 20, t);
    std::vector<void*> there;
    std::thread([&] {
        for (int i = 0; i < 16; ++i) there.push_back(pool.allocate(u, std::size_t{3} << 20, 256));
        for (void* q : there) pool.deallocate(u, q, std::size_t{3} << 20, 256);
    }).join();
    CHECK(pool.detailed_statistics().capture_live_block_bytes == private_live);
    for (void* q : there) CHECK_FALSE(overlap(q, std::size_t{3} << 20, priv, 4096));
    CHECK_FALSE(overlap(here, std::size_t{5} << 20, priv, 4096));
    CHECK(P::query_capture(s).status == custody::capture_status::active);
    custody::pool::captured_graph g = scope.end();
    CHECK(holds_cookie<P>(t, here, std::size_t{5} << 20, 0x66));
    pool.deallocate(t, here, std::size_t{5} << 20, 256);
    g.launch(s);
    CHECK(holds_cookie<P>(s, priv, 4096, 0x44));
    pool.deallocate(s, priv, 4096, 256);
    check_identity(pool.detailed_statistics());
}

/// A stream forked into the capture (it waited on an event recorded in it) allocates from the same
/// private pool, and a stream capturing without the pool's knowledge is refused while another
/// capture is open (capture_error), changing nothing.
template <class Pool>
void case_forked_and_unknown_streams(Pool& pool) {
    using P = typename Pool::platform_type;
    typename P::stream s(0);
    typename P::stream t(0);
    typename P::stream other(0);
    typename P::event fork(0);
    typename P::event join(0);
    custody::pool::capture_scope scope(pool, s);
    void* on_s = pool.allocate(s, 4096, 256);
    P::memset_async(on_s, 0x01, 4096, s);
    fork.record(s);
    P::wait(t, fork);
    void* on_t = pool.allocate(t, 4096, 256);
    P::memset_async(on_t, 0x02, 4096, t);
    join.record(t);
    P::wait(s, join);
    CHECK(pool.detailed_statistics().capture_live_block_bytes == 2 * 4096);

    P::begin_capture(other, custody::capture_mode::relaxed);
    const auto before = pool.detailed_statistics();
    CHECK_THROWS_AS(pool.allocate(other, 4096, 256), custody::pool::capture_error);
    CHECK(pool.detailed_statistics().totals.allocations == before.totals.allocations);
    static_cast<void>(P::end_capture(other));

    custody::pool::captured_graph g = scope.end();
    g.launch(s);
    CHECK(holds_cookie<P>(s, on_s, 4096, 0x01));
    CHECK(holds_cookie<P>(s, on_t, 4096, 0x02));
    pool.deallocate(s, on_s, 4096, 256);
    pool.deallocate(s, on_t, 4096, 256);
}

/// With check_capture = every_call the pool asks the platform at each call: an allocation on a
/// stream captured without its knowledge is refused, and an ordinary block given back there is
/// quarantined (a replay may use it).
template <class Pool>
void case_every_call_check(Pool& pool) {
    using P = typename Pool::platform_type;
    typename P::stream s(0);
    void* before_capture = pool.allocate(s, 4096, 256);
    const auto before = pool.detailed_statistics();
    P::begin_capture(s, custody::capture_mode::relaxed);
    CHECK_THROWS_AS(pool.allocate(s, 4096, 256), custody::pool::capture_error);
    pool.deallocate(s, before_capture, 4096, 256);
    CHECK(P::query_capture(s).status == custody::capture_status::active);
    static_cast<void>(P::end_capture(s));
    const auto after = pool.detailed_statistics();
    CHECK(after.totals.allocations == before.totals.allocations);
    CHECK(after.quarantined_bytes == before.quarantined_bytes + 4096);
    void* p = pool.allocate(s, 4096, 256);
    CHECK(p != before_capture);
    pool.deallocate(s, p, 4096, 256);
}

} // namespace custody_test
