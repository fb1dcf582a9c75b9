// interop/pluggable_allocator.hpp: the state behind the pluggable-allocator entry points, tested as a
// class (the dlopen test drives the built library).
#include <custody/interop/pluggable_allocator.hpp>
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/fault_injecting.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/catch.hpp"

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using custody::interop::pluggable_allocator;
using custody::host::simulated_device_memory;
using host_platform = custody::host::platform;

TEST_CASE("each call runs on its device and restores the caller's", "[interop][torch]") {
    pluggable_allocator<simulated_device_memory> alloc(
        4, [](int device) { return std::make_unique<simulated_device_memory>(device, 1 << 20); });
    custody::host::device_guard caller(1);
    void* p = alloc.alloc(512, 3, {});
    REQUIRE(p != nullptr);
    CHECK(alloc.resource(3).device_seen_by_last_allocation() == 3);
    CHECK(host_platform::current_device() == 1);
    alloc.free(p, 512, 3, {});
    CHECK(host_platform::current_device() == 1);
    CHECK(alloc.statistics(3).live_bytes == 0);
}

TEST_CASE("a device's resource is made once, even when threads race for it", "[interop][torch]") {
    std::atomic<int> made{0};
    pluggable_allocator<simulated_device_memory> alloc(2, [&](int device) {
        made.fetch_add(1);
        return std::make_unique<simulated_device_memory>(device, 1 << 20);
    });
    {
        std::vector<std::jthread> threads;
        for (int t = 0; t < 4; ++t) {
            threads.emplace_back([&] {
                void* p = alloc.alloc(256, 1, {});
                if (p != nullptr) alloc.free(p, 256, 1, {});
            });
        }
    }
    CHECK(made.load() == 1);
    CHECK(alloc.statistics(1).allocations == 4);
    CHECK(alloc.statistics(0).allocations == 0); // never made
}

TEST_CASE("a factory that fails leaves the device unmade, to be tried again", "[interop][torch]") {
    int calls = 0;
    pluggable_allocator<simulated_device_memory> alloc(1, [&](int device) -> std::unique_ptr<simulated_device_memory> {
        if (++calls == 1) throw std::runtime_error("device busy");
        return std::make_unique<simulated_device_memory>(device, 1 << 20);
    });
    CHECK(alloc.alloc(64, 0, {}) == nullptr);
    CHECK(std::string(alloc.last_error()) == "device busy");
    void* p = alloc.alloc(64, 0, {});
    CHECK(p != nullptr);
    CHECK(std::string(alloc.last_error()).empty());
    alloc.free(p, 64, 0, {});
    CHECK(calls == 2);
}

TEST_CASE("the last error is kept per thread", "[interop][torch]") {
    pluggable_allocator<simulated_device_memory> alloc(
        1, [](int device) { return std::make_unique<simulated_device_memory>(device, 1 << 20); });
    CHECK(alloc.alloc(64, 5, {}) == nullptr);
    std::string other;
    std::thread([&] { other = alloc.last_error(); }).join();
    CHECK(other.empty());
    CHECK_THAT(alloc.last_error(), custody_test::contains("device 5 out of range (1 devices)"));
}

TEST_CASE("injected exhaustion reaches the caller as null and changes nothing", "[interop][torch]") {
    using faulty = custody::resource::fault_injecting<simulated_device_memory>;
    pluggable_allocator<faulty> alloc(1, [](int device) { return std::make_unique<faulty>(device, 1 << 20); });
    void* a = alloc.alloc(1024, 0, {});
    REQUIRE(a != nullptr);
    const auto before = alloc.statistics(0);
    alloc.resource(0).fail_at(1);
    CHECK(alloc.alloc(1024, 0, {}) == nullptr);
    CHECK_THAT(alloc.last_error(), custody_test::contains("out of memory"));
    CHECK(alloc.statistics(0) == before);
    CHECK(alloc.trim(-1) == 0); // nothing to trim: the resource keeps no cache
    alloc.free(a, 1024, 0, {});
    CHECK(alloc.statistics(0).live_bytes == 0);
}

TEST_CASE("graph capture through the hooks PyTorch calls: a filter routes the capture's allocations", "[interop][torch][capture]") {
    using pool_type = custody::pool::stream_ordered_pool<simulated_device_memory>;
    pluggable_allocator<pool_type> alloc(1, [](int device) {
        return std::make_unique<pool_type>(custody::pool::pool_options{}, device, std::size_t{1} << 30);
    });
    custody::host::stream s;
    const custody::pool::capture_pool_id id{7, 1};
    // As torch.cuda.graph: begin the capture, then route the streams of that capture to the pool.
    host_platform::begin_capture(s, custody::capture_mode::global);
    const std::uint64_t capture = host_platform::query_capture(s).id;
    REQUIRE(alloc.begin_allocate_to_pool(0, id, [capture](custody::host::stream_view v) {
        return host_platform::query_capture(v).id == capture;
    }));
    CHECK_FALSE(alloc.begin_allocate_to_pool(0, id, custody::host::stream_view{})); // already being allocated to
    CHECK(std::string(alloc.last_error()).find("already") != std::string::npos);
    void* p = alloc.alloc(4096, 0, s);
    REQUIRE(p != nullptr);
    host_platform::memset_async(p, 0x5C, 4096, s);
    custody::host::stream other;
    void* q = alloc.alloc(4096, 0, other); // another stream: ordinary memory
    REQUIRE(q != nullptr);
    CHECK(alloc.resource(0).detailed_statistics().capture_live_block_bytes == 4096);
    const custody::host::graph g = host_platform::end_capture(s);
    REQUIRE(alloc.end_allocate_to_pool(0, id));
    host_platform::launch(g, s);
    host_platform::synchronize(s);
    CHECK(static_cast<unsigned char*>(p)[4095] == 0x5C);
    alloc.free(p, 4096, 0, s);
    alloc.free(q, 4096, 0, other);
    CHECK(alloc.release_pool(0, id));
    CHECK(alloc.resource(0).detailed_statistics().capture_reserved_bytes == 0);
    CHECK_FALSE(alloc.release_pool(0, id)); // nothing held any more
}

TEST_CASE("the capture hooks fail cleanly for a resource without capture pools", "[interop][torch][capture]") {
    pluggable_allocator<simulated_device_memory> alloc(
        1, [](int device) { return std::make_unique<simulated_device_memory>(device, 1 << 20); });
    CHECK_FALSE(alloc.begin_allocate_to_pool(0, {1, 2}, custody::host::stream_view{}));
    CHECK(std::string(alloc.last_error()).find("capture") != std::string::npos);
    CHECK_FALSE(alloc.release_pool(0, {1, 2}));
}
