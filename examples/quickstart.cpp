// custody in one minute: a stream, a device buffer, a copy there and back, nothing leaked.
//
// Runs on the first CUDA device when there is one, otherwise on the host platform (worker-thread
// streams, a virtual device), and says which. The last line says what the run proved; the exit
// status is 1 when it did not.
#include <custody/buffer/buffer.hpp>
#include <custody/platform/host.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>
#ifdef CUSTODY_WITH_CUDA
#include <custody/buffer/device_buffer.hpp>
#include <custody/resource/cuda_async.hpp>
#include <custody/resource/pinned_host.hpp>
#endif

#include <cstdio>
#include <numeric>

template <class Platform, class DeviceMemory, class HostMemory>
int run(DeviceMemory& device_memory, HostMemory& host_memory) {
    constexpr std::size_t n = 1 << 20;
    typename Platform::stream stream(device_memory.device()); // a stream on the memory's device

    // Host-visible staging buffers, and a device buffer that remembers its device, stream and
    // resource: when it goes out of scope it is given back on that stream, on that device.
    custody::buffer<float, Platform, custody::host_accessible> in(n, stream, host_memory);
    custody::buffer<float, Platform, custody::host_accessible> out(n, stream, host_memory);
    std::iota(in.span().begin(), in.span().end(), 0.0F);
    {
        custody::buffer<float, Platform> on_device(n, stream, device_memory);
        Platform::memcpy_async(on_device.data(), in.data(), in.size_bytes(), stream);
        Platform::memcpy_async(out.data(), on_device.data(), out.size_bytes(), stream);
    } // freed here, ordered after the copies on `stream`: no synchronization needed to free
    Platform::synchronize(stream);

    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += out[i] != in[i] ? 1 : 0;
    const auto stats = device_memory.statistics();
    std::printf("copied %zu floats to device %d and back: %zu wrong\n", n, device_memory.device(), wrong);
    std::printf("device memory: %zu bytes live now, peak %zu bytes, %llu allocations, %llu frees\n",
                stats.live_bytes, stats.peak_live_bytes, static_cast<unsigned long long>(stats.allocations),
                static_cast<unsigned long long>(stats.deallocations));
    const bool proved = wrong == 0 && stats.live_bytes == 0 && stats.allocations == stats.deallocations;
    std::printf("%s a device buffer given back at the end of its scope, ordered after the copies on its stream "
                "with no synchronization: every float came back intact and no byte is left live\n",
                proved ? "quickstart proved:" : "quickstart did NOT prove:");
    return proved ? 0 : 1;
}

int main() {
#ifdef CUSTODY_WITH_CUDA
    if (custody::cuda::device_count() > 0) {
        std::puts("custody quickstart on the cuda platform (device 0)");
        custody::resource::cuda_async device_memory(0);
        custody::resource::pinned_host pinned(0);
        return run<custody::cuda::platform>(device_memory, pinned);
    }
    std::puts("custody quickstart: no CUDA device found, running on the host platform");
#else
    std::puts("custody quickstart: built without CUDA, running on the host platform");
#endif
    custody::host::simulated_device_memory device_memory(0, std::size_t{1} << 30);
    custody::resource::host_memory host_memory;
    return run<custody::host::platform>(device_memory, host_memory);
}
