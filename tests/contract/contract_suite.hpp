// The resource contract (include/custody/core/concepts.hpp), written once and run over every
// resource on every platform. A test file defines `contract_cases`, a std::tuple of case types,
// then includes this file. A case type provides:
//
//   using resource = R;                         the resource under test
//   static std::unique_ptr<R> make();           a fresh instance
//   static constexpr std::size_t max_alignment; the largest alignment R accepts
//   static constexpr bool exhaustible;          a 1 PiB request must fail (true for every leaf)
//   static constexpr bool blocking_free;        optional: deallocate on a stream waits for the stream
//                                               (cudaFree does), so a stream cannot be held busy
//                                               across it; the ordering check then runs unheld
//
// Every check goes through the platform's copies, so it holds for device memory too.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/error.hpp>
#include <custody/core/resource_ref.hpp>

#include "../support/stream_gate.hpp"

#include "../support/catch.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace custody::test {

template <class R>
using platform_of = typename R::stream_type::platform_type;

/// Writes `value` over n bytes at p through the platform and waits for it.
template <class R>
void fill(void* p, std::size_t n, unsigned char value, typename R::stream_type s) {
    platform_of<R>::memset_async(p, value, n, s);
    platform_of<R>::synchronize(s);
}

/// Reads n bytes at p back through the platform; true when all equal `value`.
template <class R>
bool holds(const void* p, std::size_t n, unsigned char value, typename R::stream_type s) {
    std::vector<unsigned char> host(n);
    platform_of<R>::memcpy_async(host.data(), p, n, s);
    platform_of<R>::synchronize(s);
    for (unsigned char c : host)
        if (c != value) return false;
    return true;
}

template <class Case>
inline constexpr bool blocking_free = [] {
    if constexpr (requires { Case::blocking_free; }) {
        return Case::blocking_free;
    } else {
        return false;
    }
}();

inline constexpr std::size_t absurd_size = std::size_t{1} << 50; // 1 PiB: no machine has it

} // namespace custody::test

TEMPLATE_LIST_TEST_CASE("contract: returned memory honours every alignment up to the maximum",
                        "[contract]", contract_cases) {
    using R = typename TestType::resource;
    auto r = TestType::make();
    typename R::stream_type s{};
    for (std::size_t a = 1; a <= TestType::max_alignment; a *= 2) {
        for (std::size_t n : {std::size_t{1}, std::size_t{3}, a, a + 1, std::size_t{4097}}) {
            void* p = r->allocate(s, n, a);
            REQUIRE(p != nullptr);
            CHECK(custody::is_aligned(p, a));
            custody::test::fill<R>(p, n, 0x5a, s);
            CHECK(custody::test::holds<R>(p, n, 0x5a, s));
            r->deallocate(s, p, n, a);
            void* q = r->allocate_sync(n, a);
            REQUIRE(q != nullptr);
            CHECK(custody::is_aligned(q, a));
            r->deallocate_sync(q, n, a);
        }
    }
}

TEMPLATE_LIST_TEST_CASE("contract: zero bytes is a null pointer and a null pointer frees nothing",
                        "[contract]", contract_cases) {
    using R = typename TestType::resource;
    auto r = TestType::make();
    typename R::stream_type s{};
    const auto before = r->statistics();
    CHECK(r->allocate(s, 0, 256) == nullptr);
    CHECK(r->allocate_sync(0, 256) == nullptr);
    r->deallocate(s, nullptr, 0, 256);
    r->deallocate(s, nullptr, 128, 256);
    r->deallocate_sync(nullptr, 64, 256);
    CHECK(r->statistics() == before);
}

TEMPLATE_LIST_TEST_CASE("contract: a bad alignment is std::invalid_argument and changes nothing",
                        "[contract]", contract_cases) {
    using R = typename TestType::resource;
    auto r = TestType::make();
    typename R::stream_type s{};
    void* held = r->allocate(s, 1000, 256); // the resource is not empty when the bad call comes
    const auto before = r->statistics();
    for (std::size_t a : {std::size_t{0}, std::size_t{3}, std::size_t{48}, std::size_t{257}, TestType::max_alignment * 2}) {
        INFO("alignment " << a);
        CHECK_THROWS_AS(r->allocate(s, 64, a), std::invalid_argument);
        CHECK_THROWS_AS(r->allocate_sync(64, a), std::invalid_argument);
    }
    CHECK(r->statistics() == before);
    r->deallocate(s, held, 1000, 256);
}

TEMPLATE_LIST_TEST_CASE("contract: exhaustion is out_of_memory with the request and the resource unchanged",
                        "[contract]", contract_cases) {
    using R = typename TestType::resource;
    if constexpr (TestType::exhaustible) {
        auto r = TestType::make();
        typename R::stream_type s{};
        void* held = r->allocate(s, 4096, 256);
        const auto before = r->statistics();
        try {
            static_cast<void>(r->allocate(s, custody::test::absurd_size, 256));
            FAIL("a 1 PiB allocation succeeded");
        } catch (const custody::out_of_memory& e) {
            CHECK(e.requested() == custody::test::absurd_size);
            CHECK(e.alignment() == 256);
            CHECK(e.device() == r->device());
            CHECK(e.statistics().live_bytes == before.live_bytes);
            CHECK(std::string(e.what()).find("out of memory") != std::string::npos);
        }
        CHECK_THROWS_AS(r->allocate_sync(custody::test::absurd_size, 256), std::bad_alloc);
        CHECK(r->statistics() == before);
        // Still fully usable afterwards.
        void* p = r->allocate(s, 4096, 256);
        CHECK(p != nullptr);
        r->deallocate(s, p, 4096, 256);
        r->deallocate(s, held, 4096, 256);
    }
}

TEMPLATE_LIST_TEST_CASE("contract: statistics are exact", "[contract]", contract_cases) {
    using R = typename TestType::resource;
    auto r = TestType::make();
    typename R::stream_type s{};
    const auto before = r->statistics();
    std::vector<std::pair<void*, std::size_t>> blocks;
    std::size_t total = 0;
    for (std::size_t i = 1; i <= 10; ++i) {
        const std::size_t n = i * 1000;
        blocks.emplace_back(r->allocate(s, n, 256), n);
        total += n;
    }
    auto mid = r->statistics();
    CHECK(mid.live_bytes == before.live_bytes + total);
    CHECK(mid.live_allocations == before.live_allocations + 10);
    CHECK(mid.allocations == before.allocations + 10);
    CHECK(mid.peak_live_bytes >= mid.live_bytes);
    CHECK(mid.reserved_bytes >= mid.live_bytes);
    for (auto [p, n] : blocks) r->deallocate(s, p, n, 256);
    auto after = r->statistics();
    CHECK(after.live_bytes == before.live_bytes);
    CHECK(after.live_allocations == before.live_allocations);
    CHECK(after.deallocations == before.deallocations + 10);
    CHECK(after.peak_live_bytes >= before.live_bytes + total);
}

TEMPLATE_LIST_TEST_CASE("contract: 8 threads allocate and free concurrently without overlap",
                        "[contract]", contract_cases) {
    using R = typename TestType::resource;
    auto r = TestType::make();
    const auto before = r->statistics();
    constexpr int threads = 8;
    constexpr int rounds = 300;
    std::vector<std::thread> pool;
    std::vector<int> failures(threads, 0);
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            std::mt19937 rng(1234u + static_cast<unsigned>(t));
            typename R::stream_type s{};
            std::vector<std::pair<void*, std::size_t>> live;
            for (int i = 0; i < rounds; ++i) {
                if (live.size() < 16 && (live.empty() || rng() % 3 != 0)) {
                    const std::size_t n = 1 + rng() % 8192;
                    void* p = r->allocate(s, n, 256);
                    // A cookie per block: the thread id in every byte.
                    custody::test::fill<R>(p, n, static_cast<unsigned char>(t + 1), s);
                    live.emplace_back(p, n);
                } else {
                    const std::size_t k = rng() % live.size();
                    auto [p, n] = live[k];
                    if (!custody::test::holds<R>(p, n, static_cast<unsigned char>(t + 1), s)) ++failures[t];
                    r->deallocate(s, p, n, 256);
                    live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
                }
            }
            for (auto [p, n] : live) {
                if (!custody::test::holds<R>(p, n, static_cast<unsigned char>(t + 1), s)) ++failures[t];
                r->deallocate(s, p, n, 256);
            }
        });
    }
    for (auto& th : pool) th.join();
    for (int t = 0; t < threads; ++t) CHECK(failures[t] == 0);
    const auto after = r->statistics();
    CHECK(after.live_bytes == before.live_bytes);
    CHECK(after.live_allocations == before.live_allocations);
}

TEMPLATE_LIST_TEST_CASE("contract: memory given back on a busy stream is reused only after its pending work",
                        "[contract]", contract_cases) {
    using R = typename TestType::resource;
    using P = custody::test::platform_of<R>;
    auto r = TestType::make();
    typename P::stream stream;
    typename R::stream_type s = stream.view();
    constexpr std::size_t n = 4096;
    for (int round = 0; round < 20; ++round) {
        void* p = r->allocate(s, n, 256);
        {
            custody::test::stream_gate<P> gate(s); // s is now busy until the gate opens
            P::memset_async(p, 0xAA, n, s);        // pending work that still uses p
            if constexpr (custody::test::blocking_free<TestType>) gate.open();
            r->deallocate(s, p, n, 256);           // given back while that work is pending
            void* q = r->allocate(s, n, 256);      // may be p again
            P::memset_async(q, 0x55, n, s);        // ordered after the pending work
            gate.open();
            CHECK(custody::test::holds<R>(q, n, 0x55, s));
            r->deallocate(s, q, n, 256);
        }
    }
    P::synchronize(s);
    CHECK(r->statistics().live_allocations == 0);
}

TEMPLATE_LIST_TEST_CASE("contract: a resource_ref forwards every operation", "[contract]", contract_cases) {
    using R = typename TestType::resource;
    auto r = TestType::make();
    custody::resource_ref<typename R::stream_type> ref(*r);
    custody::resource_ref<typename R::stream_type> same(*r);
    CHECK(ref == same);
    typename R::stream_type s{};
    const auto before = r->statistics();
    void* p = ref.allocate(s, 512, 256);
    CHECK(ref.statistics().live_bytes == before.live_bytes + 512);
    CHECK(ref.device() == r->device());
    ref.deallocate(s, p, 512, 256);
    void* q = ref.allocate_sync(512, 256);
    ref.deallocate_sync(q, 512, 256);
    CHECK(r->statistics().live_bytes == before.live_bytes);
    CHECK_THROWS_AS(ref.allocate(s, 64, 3), std::invalid_argument);
}
