// plugins/torch, CUDA build: loaded with dlopen as PyTorch loads it. Without a device it must load,
// say so and refuse allocations cleanly; with one, it serves device 0 on a real stream.
#include "../../plugins/torch/custody_torch_allocator.h"

#include <custody/platform/cuda.hpp>

#include <cuda_runtime_api.h>

#include "../support/catch.hpp"
#include "../support/cuda_presence.hpp"
#include "../support/cuda_stream_gate.hpp"

#include <dlfcn.h>

#include <chrono>
#include <future>
#include <string>

#ifndef CUSTODY_TORCH_CUDA_PLUGIN_PATH
#error "CUSTODY_TORCH_CUDA_PLUGIN_PATH must name the CUDA build of custody_torch_allocator"
#endif

namespace {

template <class F>
F symbol(void* handle, const char* name) {
    auto* f = reinterpret_cast<F>(dlsym(handle, name));
    REQUIRE(f != nullptr);
    return f;
}

} // namespace

TEST_CASE("the CUDA build loads and serves the visible devices", "[interop][torch]") {
    void* handle = dlopen(CUSTODY_TORCH_CUDA_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    REQUIRE(handle != nullptr);
    const auto alloc = symbol<decltype(&custody_alloc)>(handle, "custody_alloc");
    const auto free = symbol<decltype(&custody_free)>(handle, "custody_free");
    const auto stats = symbol<decltype(&custody_stats)>(handle, "custody_stats");
    const auto trim = symbol<decltype(&custody_trim)>(handle, "custody_trim");
    const auto last_error = symbol<decltype(&custody_last_error)>(handle, "custody_last_error");
    const auto platform = symbol<decltype(&custody_platform)>(handle, "custody_platform");
    const auto device_count = symbol<decltype(&custody_device_count)>(handle, "custody_device_count");

    CHECK(std::string(platform()) == "cuda");
    // A broken CUDA stack (a driver older than the runtime) is a failure here, not "no device".
    const auto presence = custody_test::probe_cuda();
    if (presence.verdict == custody_test::cuda_verdict::fail) FAIL(presence.message);
    const int devices = presence.devices;
    REQUIRE(device_count() == devices);
    if (devices == 0) {
        CHECK(alloc(1024, 0, nullptr) == nullptr);
        CHECK_THAT(last_error(), custody_test::contains("device 0 out of range (0 devices)"));
        return;
    }
    custody::cuda::stream stream(0);
    void* p = alloc(1 << 20, 0, stream.view().get());
    REQUIRE(p != nullptr);
    REQUIRE(cudaMemsetAsync(p, 0, 1 << 20, stream.view().get()) == cudaSuccess);
    custody_torch_stats s{};
    REQUIRE(stats(0, &s) == 0);
    CHECK(s.live_bytes == (1 << 20));
    CHECK(s.reserved_bytes >= s.live_bytes);
    free(p, 1 << 20, 0, stream.view().get());
    custody::cuda::platform::synchronize(stream.view());
    CHECK(trim(-1) > 0);
    REQUIRE(stats(0, &s) == 0);
    CHECK(s.live_bytes == 0);
    CHECK(s.reserved_bytes == 0);
}

TEST_CASE("PyTorch's default stream (nullptr) is served stream-ordered, never by a host wait",
          "[interop][torch]") {
    const auto presence = custody_test::probe_cuda();
    if (presence.devices == 0) return; // checked by the case above
    void* handle = dlopen(CUSTODY_TORCH_CUDA_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    REQUIRE(handle != nullptr);
    const auto torch_malloc = symbol<decltype(&custody_torch_malloc)>(handle, "custody_torch_malloc");
    const auto free = symbol<decltype(&custody_free)>(handle, "custody_free");
    constexpr ssize_t n = ssize_t{64} << 20; // record_bytes: its free is covered by an event at once
    custody::cuda::stream side(0);
    void* p = torch_malloc(n, 0, side.view().get());
    REQUIRE(p != nullptr);
    custody::test::stream_gate<custody::cuda::platform> gate(side.view()); // p's free stays pending
    free(p, n, 0, side.view().get());
    // The default stream may take p behind side's event (a stream wait); as the synchronous pair it
    // would wait for that event on the host, which the gate holds back.
    auto taken = std::async(std::launch::async, [&] { return torch_malloc(n, 0, nullptr); });
    const bool returned = taken.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
    gate.open();
    CHECK(returned); // false: the allocation waited on the host for the gated stream
    void* q = taken.get();
    REQUIRE(q != nullptr);
    REQUIRE(cudaMemsetAsync(q, 0, static_cast<std::size_t>(n), nullptr) == cudaSuccess);
    free(q, n, 0, nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}
