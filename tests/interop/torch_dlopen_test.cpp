// plugins/torch: loads the host build of the PyTorch allocator library with dlopen, as PyTorch's
// CUDAPluggableAllocator does, and drives its C interface. Each case uses its own virtual device,
// since the library's state lives as long as the process.
#include "../../plugins/torch/custody_torch_allocator.h"

#include "../support/catch.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#ifndef CUSTODY_TORCH_PLUGIN_PATH
#error "CUSTODY_TORCH_PLUGIN_PATH must name the host build of custody_torch_allocator"
#endif

namespace {

constexpr std::size_t cap = std::size_t{64} << 20; // CUSTODY_TORCH_MAX_BYTES for this test

struct plugin {
    void* handle = nullptr;
    decltype(&custody_alloc) alloc = nullptr;
    decltype(&custody_free) free = nullptr;
    decltype(&custody_stats) stats = nullptr;
    decltype(&custody_trim) trim = nullptr;
    decltype(&custody_report) report = nullptr;
    decltype(&custody_last_error) last_error = nullptr;
    decltype(&custody_platform) platform = nullptr;
    decltype(&custody_device_count) device_count = nullptr;

    template <class F>
    void bind(F& f, const char* name) {
        f = reinterpret_cast<F>(dlsym(handle, name));
        if (f == nullptr) FAIL("dlsym(" << name << ") failed: " << dlerror());
    }

    plugin() {
        // Read by the library when it makes a device's pool, i.e. after loading.
        setenv("CUSTODY_TORCH_MAX_BYTES", std::to_string(cap).c_str(), 1); // NOLINT(concurrency-mt-unsafe)
        handle = dlopen(CUSTODY_TORCH_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) FAIL("dlopen failed: " << dlerror());
        bind(alloc, "custody_alloc");
        bind(free, "custody_free");
        bind(stats, "custody_stats");
        bind(trim, "custody_trim");
        bind(report, "custody_report");
        bind(last_error, "custody_last_error");
        bind(platform, "custody_platform");
        bind(device_count, "custody_device_count");
    }

    custody_torch_stats stats_of(int device) const {
        custody_torch_stats s{};
        REQUIRE(stats(device, &s) == 0);
        return s;
    }
};

// Loaded once and never closed: the library keeps its allocator for the life of the process.
const plugin& lib() {
    static const plugin p;
    return p;
}

void* const opaque_stream = reinterpret_cast<void*>(std::uintptr_t{0x1234}); // any cudaStream_t value

} // namespace

TEST_CASE("the library exports PyTorch's entry points and serves the host platform", "[interop][torch]") {
    CHECK(std::string(lib().platform()) == "host");
    CHECK(lib().device_count() == 8);
}

TEST_CASE("alloc and free move each device's counters", "[interop][torch]") {
    void* a = lib().alloc(1 << 20, 0, opaque_stream);
    void* b = lib().alloc(1000, 1, nullptr);
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(a) % 256 == 0);
    std::memset(a, 0xab, 1 << 20); // the memory is really there
    CHECK(std::string(lib().last_error()).empty());
    auto s0 = lib().stats_of(0);
    CHECK(s0.live_bytes == (1 << 20));
    CHECK(s0.live_allocations == 1);
    CHECK(lib().stats_of(1).live_bytes == 1000);
    lib().free(a, 1 << 20, 0, opaque_stream);
    lib().free(b, 1000, 1, nullptr);
    s0 = lib().stats_of(0);
    CHECK(s0.live_bytes == 0);
    CHECK(s0.peak_live_bytes == (1 << 20));
    CHECK(s0.allocations == 1);
    CHECK(s0.deallocations == 1);
    CHECK(lib().stats_of(1).live_bytes == 0);
    CHECK(lib().stats_of(5).allocations == 0); // a device never used
}

TEST_CASE("bad requests return null with a reason and change nothing", "[interop][torch]") {
    CHECK(lib().alloc(0, 2, nullptr) == nullptr);
    CHECK(std::string(lib().last_error()).empty()); // zero bytes is not an error
    CHECK(lib().alloc(100, 99, nullptr) == nullptr);
    CHECK_THAT(lib().last_error(), custody_test::contains("device 99 out of range"));
    CHECK(lib().alloc(-5, 2, nullptr) == nullptr);
    CHECK_THAT(lib().last_error(), custody_test::contains("negative allocation size"));
    custody_torch_stats s{};
    CHECK(lib().stats(99, &s) == -1);
    CHECK(lib().stats(2, nullptr) == -1);
    lib().free(reinterpret_cast<void*>(0x1000), 64, 6, nullptr); // device 6 never allocated anything
    CHECK_THAT(lib().last_error(), custody_test::contains("did not allocate"));
    CHECK(lib().stats_of(2).allocations == 0);
}

TEST_CASE("exhaustion returns null with the out-of-memory message, and the device recovers", "[interop][torch]") {
    void* a = lib().alloc(static_cast<ssize_t>(cap / 2), 3, nullptr);
    REQUIRE(a != nullptr);
    const auto before = lib().stats_of(3);
    CHECK(lib().alloc(static_cast<ssize_t>(cap), 3, nullptr) == nullptr);
    CHECK_THAT(lib().last_error(), custody_test::contains("out of memory") && custody_test::contains("device 3"));
    const auto after = lib().stats_of(3);
    CHECK(after.live_bytes == before.live_bytes);
    CHECK(after.allocations == before.allocations);
    lib().free(a, static_cast<ssize_t>(cap / 2), 3, nullptr);
    void* b = lib().alloc(static_cast<ssize_t>(cap - 4096), 3, nullptr);
    CHECK(b != nullptr);
    lib().free(b, static_cast<ssize_t>(cap - 4096), 3, nullptr);
}

TEST_CASE("trim leaves nothing reserved beyond what is live", "[interop][torch]") {
    void* a = lib().alloc(4 << 20, 4, nullptr);
    REQUIRE(a != nullptr);
    lib().free(a, 4 << 20, 4, nullptr);
    static_cast<void>(lib().trim(-1));
    const auto s = lib().stats_of(4);
    CHECK(s.live_bytes == 0);
    CHECK(s.reserved_bytes == 0);
}

TEST_CASE("the report names every device in use and truncates safely", "[interop][torch]") {
    void* a = lib().alloc(4096, 7, nullptr);
    REQUIRE(a != nullptr);
    const std::size_t length = lib().report(nullptr, 0);
    std::string full(length + 1, '\0');
    CHECK(lib().report(full.data(), full.size()) == length);
    full.resize(length);
    CHECK_THAT(full, custody_test::contains("custody device 7: live 4096 B in 1 blocks"));
    CHECK_THAT(full, custody_test::contains("custody device 0:"));
    char small[16];
    CHECK(lib().report(small, sizeof small) == length);
    CHECK(std::strlen(small) == sizeof small - 1);
    CHECK(std::string(small) == full.substr(0, sizeof small - 1));
    lib().free(a, 4096, 7, nullptr);
}

TEST_CASE("threads allocate and free concurrently with exact counters", "[interop][torch]") {
    constexpr int threads = 4;
    constexpr int rounds = 200;
    static_cast<void>(lib()); // load before the threads start
    const auto before = lib().stats_of(5);
    {
        std::vector<std::jthread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([t] {
                for (int i = 0; i < rounds; ++i) {
                    const ssize_t size = 256 * (1 + (t * rounds + i) % 17);
                    void* p = lib().alloc(size, 5, nullptr);
                    if (p == nullptr) continue; // counted below: allocations would not match
                    static_cast<unsigned char*>(p)[0] = static_cast<unsigned char>(i);
                    lib().free(p, size, 5, nullptr);
                }
            });
        }
    }
    const auto after = lib().stats_of(5);
    CHECK(after.allocations - before.allocations == threads * rounds);
    CHECK(after.deallocations - before.deallocations == threads * rounds);
    CHECK(after.live_bytes == 0);
}
