// plugins/torch: loads the host build of the PyTorch allocator library with dlopen, as PyTorch's
// CUDAPluggableAllocator does, and drives its C interface. Each case uses its own virtual device,
// since the library's state lives as long as the process.
#include "../../plugins/torch/custody_torch_allocator.h"

#include <custody/platform/host.hpp>

#include "../support/catch.hpp"
#include "../support/stream_gate.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
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
    decltype(&custody_torch_malloc) torch_malloc = nullptr;
    decltype(&custody_free) free = nullptr;
    decltype(&custody_record_stream) record_stream = nullptr;
    decltype(&custody_configure) configure = nullptr;
    decltype(&custody_empty_cache) empty_cache = nullptr;
    decltype(&custody_begin_allocate_to_pool) begin_allocate_to_pool = nullptr;
    decltype(&custody_end_allocate_to_pool) end_allocate_to_pool = nullptr;
    decltype(&custody_release_pool) release_pool = nullptr;
    decltype(&custody_stats) stats = nullptr;
    decltype(&custody_trim) trim = nullptr;
    decltype(&custody_report) report = nullptr;
    decltype(&custody_last_error) last_error = nullptr;
    decltype(&custody_platform) platform = nullptr;
    decltype(&custody_device_count) device_count = nullptr;
    decltype(&custody_backing) backing = nullptr;
    decltype(&custody_segments) segments = nullptr;
    decltype(&custody_set_max_bytes) set_max_bytes = nullptr;
    decltype(&custody_mempool_vmm_alloc) mempool_vmm_alloc = nullptr;
    decltype(&custody_mempool_vmm_free) mempool_vmm_free = nullptr;

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
        bind(torch_malloc, "custody_torch_malloc");
        bind(free, "custody_free");
        bind(record_stream, "custody_record_stream");
        bind(configure, "custody_configure");
        bind(empty_cache, "custody_empty_cache");
        bind(begin_allocate_to_pool, "custody_begin_allocate_to_pool");
        bind(end_allocate_to_pool, "custody_end_allocate_to_pool");
        bind(release_pool, "custody_release_pool");
        bind(stats, "custody_stats");
        bind(trim, "custody_trim");
        bind(report, "custody_report");
        bind(last_error, "custody_last_error");
        bind(platform, "custody_platform");
        bind(device_count, "custody_device_count");
        bind(backing, "custody_backing");
        bind(segments, "custody_segments");
        bind(set_max_bytes, "custody_set_max_bytes");
        bind(mempool_vmm_alloc, "custody_mempool_vmm_alloc");
        bind(mempool_vmm_free, "custody_mempool_vmm_free");
    }

    custody_torch_stats stats_of(int device) const {
        custody_torch_stats s{};
        REQUIRE(stats(device, &s) == 0);
        return s;
    }
    custody_torch_segments segments_of(int device) const {
        custody_torch_segments s{};
        REQUIRE(segments(device, &s) == 0);
        return s;
    }
    std::string backing_of(int device) const {
        char text[256];
        REQUIRE(backing(device, text, sizeof text) > 0);
        return text;
    }
    std::string report_text() const {
        std::string text(report(nullptr, 0) + 1, '\0');
        text.resize(report(text.data(), text.size()));
        return text;
    }
};

// Loaded once and never closed: the library keeps its allocator for the life of the process.
const plugin& lib() {
    static const plugin p;
    return p;
}

/// What the host build takes as a stream: a custody host stream's state.
void* stream_arg(const custody::host::stream& s) { return s.view().state(); }

} // namespace

TEST_CASE("the library exports PyTorch's entry points and serves the host platform", "[interop][torch]") {
    CHECK(std::string(lib().platform()) == "host");
    CHECK(lib().device_count() == 8);
}

TEST_CASE("alloc and free move each device's counters", "[interop][torch]") {
    custody::host::stream on0(0);
    void* a = lib().alloc(1 << 20, 0, stream_arg(on0));
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
    lib().free(a, 1 << 20, 0, stream_arg(on0));
    custody::host::platform::synchronize(on0);
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
    CHECK(after.num_ooms == before.num_ooms + 1);
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
    CHECK_THAT(full, custody_test::contains("custody device 7 (mapped: ") &&
                         custody_test::contains("): live 4096 B in 1 blocks"));
    CHECK_THAT(full, custody_test::contains("custody device 0 ("));
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

TEST_CASE("PyTorch's allocation function never returns null: exhaustion throws custody's diagnostics", "[interop][torch]") {
    void* a = lib().torch_malloc(static_cast<ssize_t>(cap / 2), 3, nullptr);
    REQUIRE(a != nullptr);
    const auto before = lib().stats_of(3);
    void* returned = nullptr;
    std::string message;
    try {
        returned = lib().torch_malloc(static_cast<ssize_t>(cap), 3, nullptr);
    } catch (const std::exception& e) {
        message = e.what();
    }
    CHECK(returned == nullptr);
    CHECK_THAT(message, custody_test::contains("custody: out of memory") && custody_test::contains("device 3") &&
                            custody_test::contains("reserved"));
    const auto after = lib().stats_of(3);
    CHECK(after.num_ooms == before.num_ooms + 1);
    CHECK(after.live_bytes == before.live_bytes);
    std::string bad_device;
    try {
        static_cast<void>(lib().torch_malloc(64, 99, nullptr));
    } catch (const std::exception& e) {
        bad_device = e.what();
    }
    CHECK_THAT(bad_device, custody_test::contains("device 99 out of range"));
    lib().free(a, static_cast<ssize_t>(cap / 2), 3, nullptr);
}

TEST_CASE("record_stream holds a freed block until the recorded stream's work is done", "[interop][torch]") {
    constexpr ssize_t block = 8192;
    custody::host::stream main_stream(4);
    custody::host::stream side(4);
    void* p = lib().torch_malloc(block, 4, stream_arg(main_stream));
    REQUIRE(p != nullptr);
    lib().free(p, block, 4, stream_arg(main_stream));
    void* same = lib().torch_malloc(block, 4, stream_arg(main_stream));
    REQUIRE(same == p); // unrecorded, the block is reused on its stream at once
    {
        custody::test::stream_gate<custody::host::platform> gate(side); // the side stream still reads p
        CHECK(lib().record_stream(p, stream_arg(side)) == 0);
        lib().free(p, block, 4, stream_arg(main_stream));
        CHECK(lib().stats_of(4).held_bytes == static_cast<std::uint64_t>(block));
        void* next = lib().torch_malloc(block, 4, stream_arg(main_stream));
        CHECK(next != p);
        lib().free(next, block, 4, stream_arg(main_stream));
    }
    custody::host::platform::synchronize(side);
    void* later = lib().torch_malloc(block, 4, stream_arg(main_stream)); // finds p's work done
    CHECK(lib().stats_of(4).held_bytes == 0);
    lib().free(later, block, 4, stream_arg(main_stream));
    custody::host::platform::synchronize(main_stream);
}

TEST_CASE("empty_cache gives every cached and held byte back to the device", "[interop][torch]") {
    constexpr ssize_t block = ssize_t{2} << 20;
    custody::host::stream main_stream(4);
    custody::host::stream side(4);
    void* p = lib().torch_malloc(block, 4, stream_arg(main_stream));
    REQUIRE(p != nullptr);
    REQUIRE(lib().record_stream(p, stream_arg(side)) == 0);
    lib().free(p, block, 4, stream_arg(main_stream));
    CHECK(lib().stats_of(4).reserved_bytes > 0);
    CHECK(lib().empty_cache() > 0);
    custody::host::platform::synchronize(main_stream);
    const auto s = lib().stats_of(4);
    CHECK(s.held_bytes == 0);
    CHECK(s.reserved_bytes == 0);
}

TEST_CASE("graph capture: the capture's blocks come from a private pool, kept for replays until released",
          "[interop][torch][capture]") {
    using custody::host::platform;
    constexpr int device = 2;
    constexpr ssize_t block = 4096;
    custody::host::stream captured(device);
    custody::host::stream other(device);
    const custody_torch_stats before = lib().stats_of(device);

    // As PyTorch's CUDAGraph::capture_begin: the route opens on the stream about to be captured,
    // then the capture begins.
    REQUIRE(lib().begin_allocate_to_pool(device, 11, 3, stream_arg(captured)) == 0);
    platform::begin_capture(captured, custody::capture_mode::global);
    void* first = lib().torch_malloc(block, device, stream_arg(captured));
    REQUIRE(first != nullptr);
    // Freed and asked again within the capture: the same block, reused in stream order.
    lib().free(first, block, device, stream_arg(captured));
    void* output = lib().torch_malloc(block, device, stream_arg(captured));
    CHECK(output == first);
    platform::memset_async(output, 0x5a, static_cast<std::size_t>(block), captured);
    // A stream outside the capture is served from the ordinary pool, never from the private one.
    void* ordinary = lib().alloc(block, device, stream_arg(other));
    REQUIRE(ordinary != nullptr);
    CHECK(ordinary != output);
    custody::host::graph graph = platform::end_capture(captured);
    REQUIRE(lib().end_allocate_to_pool(device, 11, 3) == 0);
    CHECK(std::string(lib().last_error()).empty());

    // The graph's replays write the private block; nothing ran before the launch.
    std::memset(output, 0, static_cast<std::size_t>(block));
    platform::launch(graph, captured);
    platform::synchronize(captured);
    CHECK(static_cast<unsigned char*>(output)[0] == 0x5a);
    CHECK(static_cast<unsigned char*>(output)[block - 1] == 0x5a);

    // Given back after the capture, the block stays the graph's: ordinary allocations on the
    // captured stream do not get it.
    lib().free(output, block, device, stream_arg(captured));
    void* after = lib().alloc(block, device, stream_arg(captured));
    REQUIRE(after != nullptr);
    CHECK(after != output);
    platform::launch(graph, captured); // still the graph's memory to write
    platform::synchronize(captured);
    CHECK(static_cast<unsigned char*>(output)[0] == 0x5a);

    // Released (the graph is gone): the private pool's memory goes back to the device.
    const std::uint64_t reserved_held = lib().stats_of(device).reserved_bytes;
    graph = custody::host::graph{};
    REQUIRE(lib().release_pool(device, 11, 3) == 0);
    CHECK(lib().stats_of(device).reserved_bytes < reserved_held);
    // Released once per begin: a second release has nothing to drop.
    CHECK(lib().release_pool(device, 11, 3) == -1);
    CHECK_THAT(lib().last_error(), custody_test::contains("custody"));

    lib().free(after, block, device, stream_arg(captured));
    lib().free(ordinary, block, device, stream_arg(other));
    platform::synchronize(captured);
    platform::synchronize(other);
    CHECK(lib().stats_of(device).live_bytes == before.live_bytes);
}

TEST_CASE("graph capture hooks refuse the default stream and an id not begun, changing nothing",
          "[interop][torch][capture]") {
    constexpr int device = 3;
    custody::host::stream idle(device);
    const custody_torch_stats before = lib().stats_of(device);
    CHECK(lib().begin_allocate_to_pool(device, 12, 0, nullptr) == -1);
    CHECK_THAT(lib().last_error(), custody_test::contains("not the default stream"));
    CHECK(lib().end_allocate_to_pool(device, 12, 0) == -1);
    CHECK(std::string(lib().last_error()).size() > 0);
    CHECK(lib().release_pool(device, 12, 0) == -1);
    CHECK(std::string(lib().last_error()).size() > 0);
    CHECK(lib().begin_allocate_to_pool(99, 12, 0, nullptr) == -1);
    const custody_torch_stats after = lib().stats_of(device);
    CHECK(after.reserved_bytes == before.reserved_bytes);
    CHECK(after.allocations == before.allocations);
    // The stream is usable as before.
    void* p = lib().alloc(256, device, stream_arg(idle));
    CHECK(p != nullptr);
    lib().free(p, 256, device, stream_arg(idle));
}

TEST_CASE("empty_cache inside a captured region gives nothing back and leaves the capture valid",
          "[interop][torch][capture]") {
    using custody::host::platform;
    constexpr int device = 6;
    constexpr ssize_t block = 8192;
    custody::host::stream captured(device);
    custody::host::stream side(device);
    // A block held for a side stream's work: what empty_cache would wait for.
    void* held = lib().torch_malloc(block, device, stream_arg(captured));
    REQUIRE(held != nullptr);
    custody::test::stream_gate<platform> gate(side);
    REQUIRE(lib().record_stream(held, stream_arg(side)) == 0);
    lib().free(held, block, device, stream_arg(captured));
    REQUIRE(lib().stats_of(device).held_bytes == static_cast<std::uint64_t>(block));

    REQUIRE(lib().begin_allocate_to_pool(device, 13, 0, stream_arg(captured)) == 0);
    platform::begin_capture(captured, custody::capture_mode::global);
    void* inside = lib().torch_malloc(block, device, stream_arg(captured));
    REQUIRE(inside != nullptr);
    const custody_torch_stats during = lib().stats_of(device);
    // The side stream's work may finish now; waiting for it would still break the capture under
    // CUDA. (The library's host platform does not see this test's captures, so a wait would not
    // fail here: the held block must simply stay held.)
    gate.open();
    lib().empty_cache(); // a library's defensive torch.cuda.empty_cache() (other devices may give back)
    CHECK(lib().trim(device) == 0);
    CHECK(lib().stats_of(device).reserved_bytes == during.reserved_bytes);
    CHECK(lib().stats_of(device).held_bytes == static_cast<std::uint64_t>(block));
    lib().free(inside, block, device, stream_arg(captured));
    custody::host::graph graph = platform::end_capture(captured); // throws if the capture was broken
    REQUIRE(lib().end_allocate_to_pool(device, 13, 0) == 0);
    CHECK(graph.node_count() == 0);

    platform::synchronize(side);
    graph = custody::host::graph{};
    REQUIRE(lib().release_pool(device, 13, 0) == 0);
    CHECK(lib().empty_cache() > 0); // after the capture: the held block and the pools go back
    CHECK(lib().stats_of(device).held_bytes == 0);
    CHECK(lib().stats_of(device).reserved_bytes == 0);
}

TEST_CASE("options are refused by name when unknown, and once a pool exists", "[interop][torch]") {
    CHECK(lib().configure("no_such_option", 1) == -1);
    CHECK_THAT(lib().last_error(), custody_test::contains("unknown option 'no_such_option'"));
    void* p = lib().alloc(256, 7, nullptr);
    REQUIRE(p != nullptr);
    CHECK(lib().configure("max_bytes", 1 << 20) == -1);
    CHECK_THAT(lib().last_error(), custody_test::contains("after the first allocation"));
    lib().free(p, 256, 7, nullptr);
}

TEST_CASE("the pools grow by mapping granules by default, and the report says so with custody_stats' numbers",
          "[interop][torch]") {
    constexpr int device = 7;
    CHECK(lib().backing_of(device) == "mapped (the default)");
    void* a = lib().alloc(3 << 20, device, nullptr); // a large block: two 2 MiB granules mapped
    void* b = lib().alloc(1000, device, nullptr);
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    const custody_torch_stats s = lib().stats_of(device);
    const custody_torch_segments g = lib().segments_of(device);
    CHECK(s.reserved_bytes % (2 << 20) == 0);        // whole granules of the GPU's 2 MiB
    CHECK(g.segments == s.reserved_bytes / (2 << 20)); // one segment per granule mapped
    CHECK(g.device_allocations > 0);                   // map calls
    const std::string report = lib().report_text();
    const std::string line = report.substr(report.find("custody device 7 "));
    CHECK_THAT(line, custody_test::contains("reserved " + std::to_string(s.reserved_bytes) + " B (peak " +
                                            std::to_string(s.peak_reserved_bytes) + " B)"));
    CHECK_THAT(line, custody_test::contains(std::to_string(g.segments) + " granules of 2097152 B mapped"));
    CHECK_THAT(line, custody_test::contains("B cached on streams") && custody_test::contains("B free to all") &&
                         custody_test::contains("largest free block"));
    lib().free(b, 1000, device, nullptr);
    lib().free(a, 3 << 20, device, nullptr);
    static_cast<void>(lib().trim(device));
    CHECK(lib().stats_of(device).reserved_bytes == 0); // unmapped: back to the device
    CHECK(lib().segments_of(device).device_frees > 0);  // unmap calls
}

TEST_CASE("set_max_bytes(d, 0) caps the device at 0 once it has allocated, as before", "[interop][torch]") {
    constexpr int device = 5;
    void* a = lib().alloc(4096, device, nullptr);
    REQUIRE(a != nullptr);
    lib().free(a, 4096, device, nullptr);
    static_cast<void>(lib().trim(device));
    REQUIRE(lib().set_max_bytes(device, 0) == 0);
    CHECK(lib().alloc(4 << 20, device, nullptr) == nullptr); // nothing more may be taken from the device
    CHECK_THAT(lib().last_error(), custody_test::contains("out of memory"));
    REQUIRE(lib().set_max_bytes(device, cap) == 0);
    void* b = lib().alloc(4 << 20, device, nullptr);
    CHECK(b != nullptr);
    lib().free(b, 4 << 20, device, nullptr);
}

TEST_CASE("a capture routed on one device keeps empty_cache and trim from every device", "[interop][torch][capture]") {
    constexpr int captured_device = 1;
    constexpr int other_device = 0;
    custody::host::stream captured(captured_device);
    // Cached memory on another device: what empty_cache would trim, waiting and unmapping there.
    void* cached = lib().alloc(4 << 20, other_device, nullptr);
    REQUIRE(cached != nullptr);
    lib().free(cached, 4 << 20, other_device, nullptr);
    const std::uint64_t reserved = lib().stats_of(other_device).reserved_bytes;
    REQUIRE(reserved >= (4u << 20));
    REQUIRE(lib().begin_allocate_to_pool(captured_device, 21, 0, stream_arg(captured)) == 0);
    CHECK(lib().empty_cache() == 0);
    CHECK(lib().trim(other_device) == 0);
    CHECK(lib().trim(-1) == 0);
    CHECK(lib().stats_of(other_device).reserved_bytes == reserved);
    REQUIRE(lib().end_allocate_to_pool(captured_device, 21, 0) == 0);
    REQUIRE(lib().release_pool(captured_device, 21, 0) == 0);
    CHECK(lib().empty_cache() > 0); // no capture anywhere: the cache goes back
    CHECK(lib().stats_of(other_device).reserved_bytes < reserved);
}

TEST_CASE("a MemPool segment given back is unmapped only after the work queued on the stream PyTorch names",
          "[interop][torch]") {
    constexpr int device = 6;
    constexpr ssize_t size = ssize_t{2} << 20;
    custody::host::stream side(device);
    auto* segment = static_cast<unsigned char*>(lib().mempool_vmm_alloc(size, device, stream_arg(side)));
    REQUIRE(segment != nullptr);
    bool written = false;
    {
        custody::test::stream_gate<custody::host::platform> gate(side); // the side stream is still busy
        side.view().enqueue([segment, &written] {
            segment[size - 1] = 0x5a; // unmapped memory would fault here
            written = true;
        });
        // PyTorch frees a segment naming the stream it was taken on, and synchronizes nothing itself.
        std::thread give_back([&] { lib().mempool_vmm_free(segment, size, device, stream_arg(side)); });
        gate.open();
        give_back.join();
    }
    CHECK(written);
}
