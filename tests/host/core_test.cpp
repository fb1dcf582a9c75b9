// core/: errors, alignment, statistics, resource_ref.
#include <custody/core/align.hpp>
#include <custody/core/error.hpp>
#include <custody/core/resource_ref.hpp>
#include <custody/core/statistics.hpp>
#include <custody/resource/host_memory.hpp>

#include "../support/catch.hpp"

#include <string>
#include <thread>
#include <vector>

TEST_CASE("alignment helpers", "[core]") {
    CHECK(custody::is_pow2(1));
    CHECK(custody::is_pow2(4096));
    CHECK_FALSE(custody::is_pow2(0));
    CHECK_FALSE(custody::is_pow2(12));
    CHECK(custody::align_up(1, 256) == 256);
    CHECK(custody::align_up(256, 256) == 256);
    CHECK(custody::align_up(257, 256) == 512);
    CHECK(custody::align_down(511, 256) == 256);
    CHECK(custody::align_up_overflows(SIZE_MAX, 2));
    CHECK_FALSE(custody::align_up_overflows(SIZE_MAX - 255, 256));
    CHECK_NOTHROW(custody::check_alignment(4096));
    CHECK_THROWS_AS(custody::check_alignment(0), std::invalid_argument);
    CHECK_THROWS_AS(custody::check_alignment(24), std::invalid_argument);
    CHECK_THROWS_AS(custody::check_alignment(8192), std::invalid_argument);
    CHECK_THROWS_WITH(custody::check_alignment(24), custody_test::contains("not a power of two"));
}

TEST_CASE("cuda_error carries the call, the error's name and code, and file:line", "[core]") {
    const custody::cuda_error e(2, "cudaErrorMemoryAllocation", "cudaMalloc(&p, n)");
    CHECK(e.code() == 2);
    CHECK(e.error_name() == "cudaErrorMemoryAllocation");
    CHECK(e.call() == "cudaMalloc(&p, n)");
    CHECK(std::string(e.file()).find("core_test.cpp") != std::string::npos);
    CHECK(e.line() > 0);
    const std::string what = e.what();
    CHECK(what.find("cudaErrorMemoryAllocation (2) from cudaMalloc(&p, n) at ") == 0);
    CHECK(what.find("core_test.cpp:") != std::string::npos);
    const custody::error& base = e;
    CHECK(std::string(base.what()) == what);
}

TEST_CASE("out_of_memory is a bad_alloc carrying the request, device and statistics", "[core]") {
    custody::resource_statistics s;
    s.live_bytes = 100;
    s.live_allocations = 2;
    s.reserved_bytes = 300;
    const custody::out_of_memory e(1 << 20, 512, 3, s, "pool", "largest free block 64 B");
    const std::bad_alloc& as_bad_alloc = e;
    const std::string what = as_bad_alloc.what();
    CHECK(e.requested() == (1 << 20));
    CHECK(e.alignment() == 512);
    CHECK(e.device() == 3);
    CHECK(e.statistics() == s);
    CHECK(what.find("1048576 bytes") != std::string::npos);
    CHECK(what.find("device 3") != std::string::npos);
    CHECK(what.find("reserved 300 B") != std::string::npos);
    CHECK(what.find("largest free block 64 B") != std::string::npos);
}

TEST_CASE("the failure callback receives noexcept-path failures and can be restored", "[core]") {
    static std::vector<std::string> seen;
    seen.clear();
    const auto previous = custody::set_failure_callback([](std::string_view m) noexcept { seen.emplace_back(m); });
    custody::report_noexcept_failure("cudaFree(p)", "cudaErrorIllegalAddress");
    custody::set_failure_callback(previous);
    REQUIRE(seen.size() == 1);
    CHECK(seen[0].find("cudaFree(p) failed with cudaErrorIllegalAddress at ") == 0);
}

TEST_CASE("statistics_counter keeps exact peaks under concurrency", "[core]") {
    custody::statistics_counter c;
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 10000; ++i) {
                c.on_allocate(10, 10);
                c.on_deallocate(10, 10);
            }
        });
    }
    for (auto& t : threads) t.join();
    const auto s = c.snapshot();
    CHECK(s.live_bytes == 0);
    CHECK(s.live_allocations == 0);
    CHECK(s.allocations == 80000);
    CHECK(s.deallocations == 80000);
    CHECK(s.peak_live_bytes >= 10);
    CHECK(s.peak_live_bytes <= 80);
}

TEST_CASE("resource_ref: equality follows the referenced resources", "[core]") {
    custody::resource::host_memory a;
    custody::resource::host_memory b;
    custody::synchronous_resource_ref ra(a);
    custody::synchronous_resource_ref rb(b);
    CHECK(ra == rb); // host_memory is interchangeable
    void* p = ra.allocate_sync(64, 64);
    rb.deallocate_sync(p, 64, 64);
    CHECK(a.statistics().live_bytes == 64); // each keeps its own count
    CHECK(b.statistics().deallocations == 1);
}
