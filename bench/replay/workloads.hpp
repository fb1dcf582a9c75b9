// The project's own generated workloads for the replay benchmarks: programs that allocate the way
// LLM inference and training do, written against any stream-ordered resource so that they can be
// recorded into traces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace custody_bench {

/// Decoding steps of an inference server, `steps` of them: each step runs a batch (sizes drawn
/// from CUDA-graph buckets) through `layers` layers on a compute stream (step i on
/// computes[i % computes.size()]: a server that spreads its steps over several streams), each
/// layer taking its projections and MLP activations and giving them back before the next, and
/// appending one page per layer to the KV cache of the running request. Every 64 steps the request
/// ends and its KV cache is given back on the copy stream (a stream other than the one that
/// allocated it).
template <class Resource, class Stream>
void inference_workload(Resource& mr, std::span<const Stream> computes, Stream copy, int steps, int layers = 16) {
    constexpr std::size_t hidden = 4096, intermediate = 11008, element = 2, page_tokens = 16;
    constexpr std::size_t buckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64};
    std::mt19937 rng(1234);
    std::vector<std::pair<void*, std::size_t>> kv;
    const auto take = [&](Stream s, std::size_t n) { return std::pair{mr.allocate(s, n, 256), n}; };
    const auto give = [&](Stream s, std::pair<void*, std::size_t> b) { mr.deallocate(s, b.first, b.second, 256); };
    for (int step = 0; step < steps; ++step) {
        const Stream compute = computes[static_cast<std::size_t>(step) % computes.size()];
        const std::size_t batch = buckets[rng() % std::size(buckets)];
        auto residual = take(compute, batch * hidden * element);
        for (int l = 0; l < layers; ++l) {
            auto normed = take(compute, batch * hidden * element);
            auto qkv = take(compute, batch * (hidden + hidden / 2) * element); // grouped-query: k and v are a quarter each
            kv.push_back(take(compute, page_tokens * hidden / 2 * element));   // this step's K and V page
            auto attn = take(compute, batch * hidden * element);
            give(compute, qkv);
            give(compute, normed);
            auto gate_up = take(compute, 2 * batch * intermediate * element);
            auto act = take(compute, batch * intermediate * element);
            give(compute, gate_up);
            auto out = take(compute, batch * hidden * element);
            give(compute, act);
            give(compute, attn);
            give(compute, residual);
            residual = out;
        }
        auto logits = take(compute, batch * 32000 * 4);
        give(compute, residual);
        give(compute, logits);
        if ((step + 1) % 64 == 0) {
            for (auto b : kv) give(copy, b);
            kv.clear();
        }
    }
    for (auto b : kv) give(copy, b);
}

/// The same on one compute stream.
template <class Resource, class Stream>
void inference_workload(Resource& mr, Stream compute, Stream copy, int steps, int layers = 16) {
    inference_workload(mr, std::span<const Stream>(&compute, 1), copy, steps, layers);
}

/// Training steps, `steps` of them: a forward pass through `layers` layers keeps every layer's
/// activations, the backward pass gives them back in reverse order while it takes each layer's
/// gradient, and the optimizer step gives the gradients back. Weights and optimizer state are
/// taken once and kept. Micro-batch sequence lengths vary (packed sequences), so sizes vary.
template <class Resource, class Stream>
void training_workload(Resource& mr, Stream compute, int steps, int layers = 12) {
    constexpr std::size_t hidden = 2048, element = 2;
    std::mt19937 rng(99);
    using block = std::pair<void*, std::size_t>;
    const auto take = [&](std::size_t n) { return block{mr.allocate(compute, n, 256), n}; };
    const auto give = [&](block b) { mr.deallocate(compute, b.first, b.second, 256); };
    std::vector<block> weights, state;
    for (int l = 0; l < layers; ++l) {
        weights.push_back(take(12 * hidden * hidden * element));
        state.push_back(take(2 * 12 * hidden * hidden * 4)); // Adam's two moments in fp32
    }
    for (int step = 0; step < steps; ++step) {
        const std::size_t tokens = 512 * (1 + rng() % 8);
        std::vector<std::vector<block>> saved(static_cast<std::size_t>(layers));
        for (int l = 0; l < layers; ++l) {
            auto& keep = saved[static_cast<std::size_t>(l)];
            keep.push_back(take(tokens * hidden * element));         // input
            keep.push_back(take(tokens * 3 * hidden * element));     // qkv
            keep.push_back(take(tokens * 4 * hidden * element));     // MLP up
            auto scratch = take(tokens * tokens / 8 * element);      // attention scores, blockwise
            give(scratch);
        }
        std::vector<block> grads;
        for (int l = layers; l-- > 0;) {
            auto dx = take(tokens * hidden * element);
            grads.push_back(take(12 * hidden * hidden * element));
            for (auto it = saved[static_cast<std::size_t>(l)].rbegin(); it != saved[static_cast<std::size_t>(l)].rend(); ++it) give(*it);
            give(dx);
        }
        for (auto g : grads) give(g);
    }
    for (auto b : state) give(b);
    for (auto b : weights) give(b);
}

} // namespace custody_bench
