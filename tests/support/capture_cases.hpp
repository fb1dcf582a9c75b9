// The rules of graph capture, written once over a platform and run on both: the host platform in CI
// (tests/host/capture_host_test.cpp) and the cuda platform on a GPU (tests/cuda/platform_cuda_test.cpp),
// so that the host platform's capture behaves as CUDA's does. Each platform supplies capture_ops<P>:
// memory that captured work writes and the host reads, a host function node, and the CUDA error
// name of a failed call.
#pragma once

#include <custody/platform/capture.hpp>
#include <custody/platform/host.hpp>

#include "catch.hpp"

#include <atomic>
#include <cstddef>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace custody_test {

/// Primary template: specialized per platform.
template <class Platform>
struct capture_ops;

template <>
struct capture_ops<custody::host::platform> {
    using stream_view = custody::host::stream_view;

    /// `n` bytes that work on a stream writes (device()) and copies for the host to read (host()).
    class memory {
    public:
        explicit memory(std::size_t n) : device_(n, 0xEE), host_(n, 0xEE) {}
        [[nodiscard]] unsigned char* device() noexcept { return device_.data(); }
        [[nodiscard]] const unsigned char* host() const noexcept { return host_.data(); }
        [[nodiscard]] unsigned char* host_target() noexcept { return host_.data(); }
        [[nodiscard]] std::size_t size() const noexcept { return device_.size(); }

    private:
        std::vector<unsigned char> device_;
        std::vector<unsigned char> host_;
    };

    /// Enqueues a host function that adds one to `counter` (a host node when captured).
    static void bump(stream_view s, std::atomic<int>& counter) {
        s.enqueue([&counter] { counter.fetch_add(1); });
    }

    /// Runs `f`; returns "" when it succeeds, else the CUDA error name of the violation it threw.
    template <class F>
    static std::string violation(F&& f) {
        try {
            f();
        } catch (const custody::capture_violation& e) {
            return std::string(custody::capture_violation::cuda_name(e.why()));
        }
        return {};
    }
};

/// Runs `f` on a thread of its own (whose capture mode is `mode`) and returns violation(f).
template <class P, class F>
std::string violation_on_other_thread(custody::capture_mode mode, F&& f) {
    std::string result = "not run";
    std::thread([&] {
        P::exchange_capture_mode(mode);
        result = capture_ops<P>::violation(f);
    }).join();
    return result;
}

/// Captured work runs only when the graph is launched, once per launch, in order.
template <class P>
void case_capture_records_and_replays() {
    using ops = capture_ops<P>;
    typename P::stream s(0);
    typename ops::memory m(4096);
    std::atomic<int> runs{0};
    P::begin_capture(s, custody::capture_mode::global);
    P::memset_async(m.device(), 0, m.size(), s);
    ops::bump(s, runs);
    P::memset_async(m.device(), 7, m.size(), s);
    P::memcpy_async(m.host_target(), m.device(), m.size(), s);
    typename P::graph g = P::end_capture(s);
    P::synchronize(s);
    CHECK(runs.load() == 0);
    CHECK(m.host()[0] == 0xEE); // nothing ran at capture
    CHECK(g.node_count() == 4);
    for (int i = 0; i < 5; ++i) P::launch(g, s);
    P::synchronize(s);
    CHECK(runs.load() == 5);
    CHECK(m.host()[0] == 7);
    CHECK(m.host()[m.size() - 1] == 7);
    // A graph launched on another stream runs there as well.
    typename P::stream t(0);
    P::launch(g, t);
    P::synchronize(t);
    CHECK(runs.load() == 6);
}

/// query_capture: none, then active with an id that tells captures apart, then none again.
template <class P>
void case_query_capture() {
    using ops = capture_ops<P>;
    typename P::stream s(0);
    typename P::stream t(0);
    typename ops::memory m(256);
    CHECK(P::query_capture(s) == custody::capture_info{});
    CHECK_FALSE(P::is_capturing(s));
    P::begin_capture(s, custody::capture_mode::relaxed);
    const custody::capture_info in_s = P::query_capture(s);
    CHECK(in_s.status == custody::capture_status::active);
    CHECK(in_s.id != 0);
    CHECK(P::is_capturing(s));
    CHECK_FALSE(P::is_capturing(t));
    CHECK_FALSE(P::is_capturing(typename P::stream_view{})); // non-blocking streams leave the default stream out
    P::begin_capture(t, custody::capture_mode::relaxed);
    CHECK(P::query_capture(t).id != in_s.id);
    P::memset_async(m.device(), 1, m.size(), s);
    P::memset_async(m.device(), 2, m.size(), t);
    typename P::graph gs = P::end_capture(s);
    typename P::graph gt = P::end_capture(t);
    CHECK(P::query_capture(s) == custody::capture_info{});
    CHECK(P::query_capture(t) == custody::capture_info{});
    CHECK(ops::violation([&] { P::begin_capture(typename P::stream_view{}, custody::capture_mode::relaxed); }) ==
          "cudaErrorStreamCaptureUnsupported");
}

/// Synchronizing a capturing stream is refused and invalidates the capture: ending it then fails,
/// and the stream is usable again.
template <class P>
void case_synchronize_invalidates() {
    using ops = capture_ops<P>;
    typename P::stream s(0);
    typename ops::memory m(256);
    P::begin_capture(s, custody::capture_mode::relaxed);
    P::memset_async(m.device(), 1, m.size(), s);
    CHECK(ops::violation([&] { P::synchronize(s); }) == "cudaErrorStreamCaptureUnsupported");
    CHECK(P::query_capture(s).status == custody::capture_status::invalidated);
    CHECK(ops::violation([&] { static_cast<void>(P::end_capture(s)); }) == "cudaErrorStreamCaptureInvalidated");
    CHECK(P::query_capture(s) == custody::capture_info{});
    P::synchronize(s); // out of capture: fine again
}

/// An event recorded in a capture cannot be queried nor synchronized (even by a relaxed capture).
template <class P>
void case_captured_event() {
    using ops = capture_ops<P>;
    typename P::stream s(0);
    typename P::event e(0);
    typename ops::memory m(256);
    P::begin_capture(s, custody::capture_mode::relaxed);
    P::memset_async(m.device(), 1, m.size(), s);
    e.record(s);
    CHECK(ops::violation([&] { static_cast<void>(e.ready()); }) == "cudaErrorCapturedEvent");
    CHECK(ops::violation([&] { e.synchronize(); }) == "cudaErrorCapturedEvent");
    static_cast<void>(ops::violation([&] { static_cast<void>(P::end_capture(s)); }));
    e.record(s); // recorded outside a capture again: an ordinary event
    e.synchronize();
    CHECK(e.ready());
}

/// A capturing stream cannot wait on an event recorded outside the capture.
template <class P>
void case_isolation() {
    using ops = capture_ops<P>;
    typename P::stream s(0);
    typename P::stream t(0);
    typename P::event e(0);
    typename ops::memory m(256);
    P::memset_async(m.device(), 1, m.size(), t);
    e.record(t);
    P::begin_capture(s, custody::capture_mode::relaxed);
    CHECK(ops::violation([&] { P::wait(s, e); }) == "cudaErrorStreamCaptureIsolation");
    CHECK(P::query_capture(s).status == custody::capture_status::invalidated);
    CHECK(ops::violation([&] { static_cast<void>(P::end_capture(s)); }) == "cudaErrorStreamCaptureInvalidated");
    P::synchronize(t);
}

/// A stream that waits on an event recorded in a capture joins it (a fork); once joined back, the
/// graph holds the work of both streams and both leave capture at its end.
template <class P>
void case_fork_and_join() {
    using ops = capture_ops<P>;
    typename P::stream s(0);
    typename P::stream t(0);
    typename P::event fork(0);
    typename P::event join(0);
    typename ops::memory a(512);
    typename ops::memory b(512);
    P::begin_capture(s, custody::capture_mode::global);
    P::memset_async(a.device(), 3, a.size(), s);
    fork.record(s);
    P::wait(t, fork);
    CHECK(P::query_capture(t).status == custody::capture_status::active);
    CHECK(P::query_capture(t).id == P::query_capture(s).id);
    P::memset_async(b.device(), 4, b.size(), t);
    P::memcpy_async(b.host_target(), b.device(), b.size(), t);
    join.record(t);
    P::wait(s, join);
    P::memcpy_async(a.host_target(), a.device(), a.size(), s);
    typename P::graph g = P::end_capture(s);
    CHECK_FALSE(P::is_capturing(t));
    CHECK(a.host()[0] == 0xEE);
    CHECK(b.host()[0] == 0xEE);
    P::launch(g, s);
    P::synchronize(s);
    CHECK(a.host()[0] == 3);
    CHECK(b.host()[511] == 4);
}

/// Work forked into a capture and never joined back makes the end fail; every stream leaves capture.
template <class P>
void case_unjoined_fork() {
    using ops = capture_ops<P>;
    typename P::stream s(0);
    typename P::stream t(0);
    typename P::event fork(0);
    typename ops::memory m(256);
    P::begin_capture(s, custody::capture_mode::global);
    P::memset_async(m.device(), 1, m.size(), s);
    fork.record(s);
    P::wait(t, fork);
    P::memset_async(m.device(), 2, m.size(), t);
    CHECK(ops::violation([&] { static_cast<void>(P::end_capture(s)); }) == "cudaErrorStreamCaptureUnjoined");
    CHECK_FALSE(P::is_capturing(s));
    CHECK_FALSE(P::is_capturing(t));
}

/// A capture ends on the stream that began it, not on one forked into it; nor where none is open.
template <class P>
void case_end_where_not_begun() {
    using ops = capture_ops<P>;
    typename P::stream s(0);
    typename P::stream t(0);
    typename P::event fork(0);
    typename ops::memory m(256);
    CHECK(ops::violation([&] { static_cast<void>(P::end_capture(s)); }) == "cudaErrorIllegalState");
    P::begin_capture(s, custody::capture_mode::global);
    CHECK(ops::violation([&] { P::begin_capture(s, custody::capture_mode::global); }) == "cudaErrorIllegalState");
    P::memset_async(m.device(), 1, m.size(), s);
    fork.record(s);
    P::wait(t, fork);
    CHECK(ops::violation([&] { static_cast<void>(P::end_capture(t)); }) == "cudaErrorStreamCaptureUnmatched");
    static_cast<void>(ops::violation([&] { static_cast<void>(P::end_capture(s)); }));
    CHECK_FALSE(P::is_capturing(s));
    CHECK_FALSE(P::is_capturing(t));
}

/// The capture modes decide who may make a potentially unsafe call (an event query here) while a
/// capture is open.
template <class P>
void case_capture_modes() {
    using ops = capture_ops<P>;
    using custody::capture_mode;
    typename P::stream s(0);
    typename P::stream t(0);
    typename P::event done(0); // recorded outside any capture
    typename ops::memory m(256);
    P::memset_async(m.device(), 1, m.size(), t);
    done.record(t);
    P::synchronize(t);
    const auto query = [&] { static_cast<void>(done.ready()); };

    // global: another thread in global mode is prohibited (and breaks the capture) ...
    P::begin_capture(s, capture_mode::global);
    P::memset_async(m.device(), 2, m.size(), s);
    CHECK(violation_on_other_thread<P>(capture_mode::global, query) == "cudaErrorStreamCaptureUnsupported");
    CHECK(P::query_capture(s).status == custody::capture_status::invalidated);
    static_cast<void>(ops::violation([&] { static_cast<void>(P::end_capture(s)); }));
    // ... one in relaxed or per_thread mode is not.
    P::begin_capture(s, capture_mode::global);
    P::memset_async(m.device(), 2, m.size(), s);
    CHECK(violation_on_other_thread<P>(capture_mode::relaxed, query).empty());
    CHECK(violation_on_other_thread<P>(capture_mode::per_thread, query).empty());
    CHECK(P::query_capture(s).status == custody::capture_status::active);
    static_cast<void>(P::end_capture(s));

    // per_thread: other threads are free; the capturing thread is not, unless its own mode is relaxed.
    P::begin_capture(s, capture_mode::per_thread);
    P::memset_async(m.device(), 2, m.size(), s);
    CHECK(violation_on_other_thread<P>(capture_mode::global, query).empty());
    {
        const auto previous = P::exchange_capture_mode(capture_mode::relaxed);
        CHECK(ops::violation(query).empty());
        P::exchange_capture_mode(previous);
    }
    CHECK(P::query_capture(s).status == custody::capture_status::active);
    CHECK(ops::violation(query) == "cudaErrorStreamCaptureUnsupported");
    CHECK(P::query_capture(s).status == custody::capture_status::invalidated);
    static_cast<void>(ops::violation([&] { static_cast<void>(P::end_capture(s)); }));

    // relaxed: nobody is prohibited.
    P::begin_capture(s, capture_mode::relaxed);
    P::memset_async(m.device(), 2, m.size(), s);
    CHECK(ops::violation(query).empty());
    CHECK(violation_on_other_thread<P>(capture_mode::global, query).empty());
    CHECK(P::query_capture(s).status == custody::capture_status::active);
    static_cast<void>(P::end_capture(s));
}

/// A capture not begun relaxed is ended by the thread that began it.
template <class P>
void case_end_from_another_thread() {
    using ops = capture_ops<P>;
    typename P::stream s(0);
    typename ops::memory m(256);
    P::begin_capture(s, custody::capture_mode::per_thread);
    P::memset_async(m.device(), 5, m.size(), s);
    CHECK(violation_on_other_thread<P>(custody::capture_mode::global, [&] { static_cast<void>(P::end_capture(s)); }) ==
          "cudaErrorStreamCaptureWrongThread");
    typename P::graph g = P::end_capture(s);
    CHECK(g.node_count() == 1);
    // Relaxed: any thread may end it.
    P::begin_capture(s, custody::capture_mode::relaxed);
    P::memset_async(m.device(), 5, m.size(), s);
    typename P::graph h;
    std::thread([&] { h = P::end_capture(s); }).join();
    CHECK(h.node_count() == 1);
}

} // namespace custody_test
