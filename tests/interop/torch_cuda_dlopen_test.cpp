// plugins/torch, CUDA build: loaded with dlopen as PyTorch loads it. Without a device it must load,
// say so and refuse allocations cleanly; with one, it serves device 0 on a real stream.
#include "../../plugins/torch/custody_torch_allocator.h"

#include <custody/platform/cuda.hpp>

#include <cuda_runtime_api.h>

#include "../support/catch.hpp"
#include "../support/cuda_presence.hpp"

#include <dlfcn.h>

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
