// A decode step captured into one graph per batch size, all in one capture-private pool, then
// replayed token after token: the activations the step allocates keep their addresses across
// replays, ordinary allocations made between tokens never land in them, and the graphs' memory goes
// back when the graphs are destroyed.
//
// Runs on the first CUDA device when there is one, otherwise on the host platform (whose streams
// capture and replay for real), and says which. The last line says what the run proved; the exit
// status is 1 when it did not.
#include <custody/platform/host.hpp>
#include <custody/pool/capture_scope.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/simulated_device_memory.hpp>
#ifdef CUSTODY_WITH_CUDA
#include <custody/platform/cuda.hpp>
#include <custody/resource/cuda_malloc.hpp>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <vector>

namespace {

constexpr std::size_t hidden_bytes_per_token = 64 << 10; // one token's activations
constexpr int buckets[] = {1, 2, 4, 8};

/// One decode step on `stream` for `batch` tokens: reads `input`, writes `output` (both allocated
/// outside the capture), with activations the step allocates and gives back itself. Stands in for
/// the kernels with copies, so that the output is the input when the step ran.
template <class Pool>
void decode_step(Pool& pool, typename Pool::stream_type stream, int batch, const void* input, void* output) {
    using P = typename Pool::platform_type;
    const std::size_t n = hidden_bytes_per_token * static_cast<std::size_t>(batch);
    void* hidden = pool.allocate(stream, n, 256);
    P::memcpy_async(hidden, input, n, stream);          // embedding
    void* mlp = pool.allocate(stream, 4 * n, 256);      // a wide activation, given back in the step
    P::memcpy_async(mlp, hidden, n, stream);
    P::memcpy_async(hidden, mlp, n, stream);
    pool.deallocate(stream, mlp, 4 * n, 256);
    void* logits = pool.allocate(stream, n, 256);       // may reuse mlp's memory: same capture
    P::memcpy_async(logits, hidden, n, stream);
    P::memcpy_async(output, logits, n, stream);
    pool.deallocate(stream, hidden, n, 256);
    pool.deallocate(stream, logits, n, 256);
}

template <class Platform, class Upstream, class... UpstreamArgs>
int run(UpstreamArgs... upstream_args) {
    using pool_type = custody::pool::stream_ordered_pool<Upstream>;
    pool_type pool(custody::pool::pool_options{}, upstream_args...);
    typename Platform::stream stream(0);
    const std::size_t io_bytes = hidden_bytes_per_token * 8;
    void* input = pool.allocate(stream, io_bytes, 256); // static buffers: ordinary memory
    void* output = pool.allocate(stream, io_bytes, 256);

    // Capture: the largest bucket first, so that the smaller ones fit in its chunks.
    const custody::pool::capture_pool_id decode_pool = pool.make_capture_pool_id();
    std::vector<custody::pool::captured_graph<pool_type>> graphs(std::size(buckets));
    for (std::size_t b = std::size(buckets); b-- > 0;) {
        custody::pool::capture_scope scope(pool, stream, decode_pool);
        decode_step(pool, stream, buckets[b], input, output);
        graphs[b] = scope.end();
    }
    const auto captured = pool.detailed_statistics();

    // Replay: each token writes its input, runs the graph of its bucket, reads the output back;
    // between tokens an ordinary allocation on another stream takes and gives back memory.
    typename Platform::stream side(0);
    std::vector<unsigned char> host(io_bytes);
    int wrong = 0;
    for (int token = 0; token < 200; ++token) {
        const std::size_t b = static_cast<std::size_t>(token) % std::size(buckets);
        const std::size_t n = hidden_bytes_per_token * static_cast<std::size_t>(buckets[b]);
        const auto value = static_cast<unsigned char>(token);
        void* scratch = pool.allocate(side, n, 256);
        Platform::memset_async(scratch, 0xEE, n, side);
        Platform::memset_async(input, value, n, stream);
        graphs[b].launch(stream);
        Platform::memcpy_async(host.data(), output, n, stream);
        Platform::synchronize(stream);
        for (std::size_t i = 0; i < n; ++i) wrong += host[i] != value ? 1 : 0;
        pool.deallocate(side, scratch, n, 256);
    }
    Platform::synchronize(side);

    std::size_t peak_step = 0; // what the largest step holds at once: hidden + mlp
    for (int batch : buckets) peak_step = std::max(peak_step, 5 * hidden_bytes_per_token * static_cast<std::size_t>(batch));
    std::printf("%zu graphs captured into one private pool of %zu bytes (the largest step holds %zu bytes at once)\n",
                std::size(buckets), captured.capture_reserved_bytes, peak_step);
    graphs.clear();
    pool.deallocate(stream, input, io_bytes, 256);
    pool.deallocate(stream, output, io_bytes, 256);
    const auto after = pool.detailed_statistics();
    std::printf("200 tokens replayed: %d bytes wrong; after the graphs are gone: %zu private bytes, %zu blocks out\n",
                wrong, after.capture_reserved_bytes, after.totals.live_allocations);
    const bool proved = wrong == 0 && captured.capture_reserved_bytes != 0 &&
                        captured.capture_reserved_bytes < 2 * (peak_step + (std::size_t{2} << 20)) &&
                        after.capture_reserved_bytes == 0 && after.totals.live_allocations == 0;
    std::printf("%s decode steps captured once per batch size in one shared private pool replay 200 tokens "
                "correctly beside ordinary allocations, and give their memory back with the graphs\n",
                proved ? "graph_decode proved:" : "graph_decode did NOT prove:");
    return proved ? 0 : 1;
}

} // namespace

int main() {
#ifdef CUSTODY_WITH_CUDA
    if (custody::cuda::device_count() > 0) {
        std::puts("custody graph_decode on the cuda platform (device 0)");
        return run<custody::cuda::platform, custody::resource::cuda_malloc>(0);
    }
    std::puts("custody graph_decode: no CUDA device found, running on the host platform");
#else
    std::puts("custody graph_decode: built without CUDA, running on the host platform");
#endif
    return run<custody::host::platform, custody::host::simulated_device_memory>(0, std::size_t{1} << 30);
}
