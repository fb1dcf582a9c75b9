// A token-batch loader: the host prepares each batch of token ids directly in the staging ring,
// the ring uploads it to one of a few device buffers on a copy stream, and a "kernel" on a compute
// stream sums the batch and checks the sum. Uploads of the next batches overlap the kernel on the
// current one; the ring's back-pressure keeps the host from running ahead of the copies.
//
// On the host platform the streams are worker threads, the device buffers are a virtual device's
// memory and the kernel is a task enqueued on the compute stream. The same pipeline on the cuda
// platform swaps in cuda streams, device memory, a pinned upstream and a real kernel launch.
//
// Runs on the host platform. The last line says what the run proved; exit status 0 when every
// batch arrived intact, 1 otherwise.
#include <custody/platform/host.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>
#include <custody/staging/staging_ring.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

namespace {

using platform = custody::host::platform;
using token = std::int32_t;

constexpr int batches = 64;
constexpr std::size_t tokens_per_batch = 64 * 1024; // 256 KiB per batch
constexpr std::size_t device_slots = 3;             // batches resident on the device at once
constexpr token vocabulary = 50257;

/// Fills `out` with batch b's token ids (a stand-in for tokenized text) and returns their sum.
std::int64_t prepare_batch(int b, std::span<token> out) {
    constexpr token stride = 104729 % vocabulary;
    token t = static_cast<token>((b * 7919) % vocabulary);
    std::int64_t sum = 0;
    for (token& slot : out) {
        slot = t;
        sum += t;
        t += stride;
        if (t >= vocabulary) t -= vocabulary;
    }
    return sum;
}

} // namespace

int main() {
    const int device = 0;
    custody::host::simulated_device_memory device_memory(device, std::size_t{64} << 20);
    custody::host::stream copy(device);
    custody::host::stream compute(device);

    // Room for four batches in flight: the host fills one while earlier ones are copied.
    custody::staging::ring_options options;
    options.capacity = 4 * tokens_per_batch * sizeof(token);
    custody::staging::staging_ring<custody::resource::host_memory> ring(options);

    std::array<token*, device_slots> slots{};
    for (auto& s : slots) {
        s = static_cast<token*>(device_memory.allocate_sync(tokens_per_batch * sizeof(token), 256));
    }
    std::vector<custody::host::event> uploaded;
    std::vector<custody::host::event> consumed;
    for (std::size_t i = 0; i < device_slots; ++i) {
        uploaded.emplace_back(device);
        consumed.emplace_back(device);
    }

    std::atomic<int> checked{0};
    std::atomic<int> mismatches{0};
    std::atomic<int> uploads_ahead{0}; // batches on the device before the previous kernel had finished

    for (int b = 0; b < batches; ++b) {
        const std::size_t slot = static_cast<std::size_t>(b) % device_slots;
        // The slot's previous batch must have been consumed before it is overwritten.
        platform::wait(copy, consumed[slot]);

        // Prepare the batch in place, in pinned memory: no extra host copy.
        auto batch = ring.reserve<token>(tokens_per_batch);
        const std::int64_t expected = prepare_batch(b, batch.span());
        ring.commit(std::move(batch), slots[slot], copy);
        copy.view().enqueue([&, b] { // batch b has landed: is the kernel on batch b-1 still running?
            if (checked.load() < b) uploads_ahead.fetch_add(1);
        });
        uploaded[slot].record(copy);

        // The kernel runs once its batch has landed, while the next uploads proceed.
        platform::wait(compute, uploaded[slot]);
        compute.view().enqueue([&, data = slots[slot], expected] {
            std::int64_t sum = 0;
            for (int pass = 0; pass < 32; ++pass) { // a little work, as a real kernel would do
                sum = 0;
                for (std::size_t i = 0; i < tokens_per_batch; ++i) sum += data[i];
            }
            if (sum != expected) mismatches.fetch_add(1);
            checked.fetch_add(1);
        });
        consumed[slot].record(compute);
    }
    platform::synchronize(compute);
    ring.synchronize();

    for (auto* s : slots) device_memory.deallocate_sync(s, tokens_per_batch * sizeof(token), 256);
    const auto st = ring.statistics();
    std::printf("token_loader (host platform): %d batches of %zu tokens checked, %d mismatches\n", checked.load(),
                tokens_per_batch, mismatches.load());
    std::printf("  batches uploaded while the previous kernel still ran: %d of %d; ring waits: %llu (%.3f ms), "
                "peak in use %zu of %zu B\n",
                uploads_ahead.load(), batches - 1, static_cast<unsigned long long>(st.waits),
                static_cast<double>(st.wait_time.count()) / 1e6, st.peak_bytes_in_use, st.capacity);
    const bool proved = checked.load() == batches && mismatches.load() == 0 && st.peak_bytes_in_use <= st.capacity;
    std::printf("%s all %d batches reached the device intact through a %zu KiB pinned ring that never held more than "
                "its capacity, with %d of %d uploads overlapping the previous batch's kernel\n",
                proved ? "token_loader proved:" : "token_loader did NOT prove:", batches, st.capacity / 1024,
                uploads_ahead.load(), batches - 1);
    return proved ? 0 : 1;
}
