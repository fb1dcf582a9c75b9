// The workloads of the pool benchmarks, written once over any peer of peers.hpp so that the Google
// Benchmark suite (pool_bench.cpp) and the instruction counter (pool_ops.cpp) run the same calls.
// Each takes the streams it runs on: one, or several in one thread (taken in turn).
//
//   pair       one allocate + free of `bytes`, on the next stream each time
//   churn      sizes log-uniform in 64 B .. 4 MiB (seeded) replacing a window of 256 live blocks
//   trace      an inference-like step through 16 layers: q/k/v, attention output and MLP
//              activations per layer, a KV cache growing a page per layer per step and freed every
//              128 steps; batch sizes padded to CUDA-graph buckets (or, unbucketed, every size
//              1..64); step i on stream i % streams
//   llm        one request of an inference server (bench/replay/workloads.hpp): 64 decoding steps
//              of 16 layers, step i on compute stream i % streams, the request's KV cache given
//              back on a copy stream of its own at the end
// No memory is touched: the figures are the allocators' own costs.
#pragma once

#include "../replay/workloads.hpp"
#include "peers.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace custody_bench {

/// Streams for one thread: `count` compute streams and a copy stream, all this thread's own
/// (`thread` picks them from host_streams.hpp's eight, count + 1 per thread).
struct thread_streams {
    std::vector<stream> compute;
    stream copy;
    thread_streams(int thread, int count) {
        const int first = thread * (count + 1);
        for (int i = 0; i < count; ++i) compute.push_back(stream_of(first + i));
        copy = stream_of(first + count);
    }
};

// ---- pair ----

template <class Peer>
[[gnu::always_inline]] inline void pair_once(Peer& r, stream s, std::size_t bytes) {
    void* p = r.allocate(s, bytes, alignment);
    asm volatile("" : : "r"(p) : "memory"); // the block is used
    r.deallocate(s, p, bytes, alignment);
}

/// `pairs` pairs of `bytes`, pair i on streams[i % size].
template <class Peer>
void pairs(Peer& r, std::span<const stream> streams, std::size_t bytes, std::size_t pairs) {
    if (streams.size() == 1) {
        for (std::size_t i = 0; i < pairs; ++i) pair_once(r, streams[0], bytes);
        return;
    }
    for (std::size_t i = 0, k = 0; i < pairs; ++i) {
        pair_once(r, streams[k], bytes);
        if (++k == streams.size()) k = 0;
    }
}

// ---- churn ----

/// Sizes log-uniform in [64 B, 4 MiB], a fixed seeded sequence.
inline std::vector<std::size_t> churn_sizes(unsigned seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> exponent(6.0, 22.0);
    std::vector<std::size_t> v(1 << 14);
    for (auto& n : v) n = static_cast<std::size_t>(std::exp2(exponent(rng)));
    return v;
}

/// A window of live blocks replaced one at a time; replacement i on streams[i % size] (the block
/// it replaces is given back on the stream that allocated it).
template <class Peer>
class churn_state {
public:
    churn_state(Peer& r, std::span<const stream> streams, unsigned seed)
        : r_(r), streams_(streams), sizes_(churn_sizes(seed)), live_(window, {nullptr, 0}) {}
    churn_state(const churn_state&) = delete;
    churn_state& operator=(const churn_state&) = delete;
    ~churn_state() {
        for (std::size_t k = 0; k < window; ++k) {
            if (live_[k].first != nullptr) r_.deallocate(stream_for(k), live_[k].first, live_[k].second, alignment);
        }
    }
    /// One replacement: a free (but for the first window) and an allocation.
    void step() {
        const std::size_t k = (i_ * 7919) % window;
        auto& slot = live_[k];
        if (slot.first != nullptr) r_.deallocate(stream_for(k), slot.first, slot.second, alignment);
        const std::size_t n = sizes_[i_ % sizes_.size()];
        slot = {r_.allocate(stream_for(k), n, alignment), n};
        ++i_;
    }

private:
    static constexpr std::size_t window = 256;
    stream stream_for(std::size_t k) const { return streams_[k % streams_.size()]; }
    Peer& r_;
    std::span<const stream> streams_;
    std::vector<std::size_t> sizes_;
    std::vector<std::pair<void*, std::size_t>> live_;
    std::size_t i_ = 0;
};

// ---- trace ----

/// The inference-like trace, one decoding step per call of step().
template <class Peer>
class trace_state {
public:
    trace_state(Peer& r, std::span<const stream> streams, bool bucketed) : r_(r), streams_(streams), bucketed_(bucketed) {
        kv_.reserve(layers * 128);
    }
    trace_state(const trace_state&) = delete;
    trace_state& operator=(const trace_state&) = delete;
    ~trace_state() { release_kv(); }

    void step() {
        constexpr std::size_t hidden = 4096, intermediate = 11008, element = 2;
        constexpr std::size_t buckets[] = {1, 2, 4, 8, 16, 32, 48, 64};
        const stream s = streams_[step_ % streams_.size()];
        const std::size_t tokens = bucketed_ ? buckets[rng_() % 8] : 1 + rng_() % 64;
        const std::size_t x_bytes = tokens * hidden * element;
        block x = take(s, x_bytes);
        for (int l = 0; l < layers; ++l) {
            block q = take(s, x_bytes);
            block k = take(s, x_bytes / 4); // grouped-query attention: 8 of 32 heads for k and v
            block v = take(s, x_bytes / 4);
            block attn = take(s, x_bytes);
            const std::size_t up_bytes = tokens * intermediate * element;
            block gate = take(s, up_bytes);
            block up = take(s, up_bytes);
            give(q);
            give(k);
            give(v);
            kv_.push_back(take(s, tokens * 4096)); // this step's K and V for this layer
            give(gate);
            give(up);
            block out = take(s, x_bytes);
            give(attn);
            give(x);
            x = out;
        }
        give(x);
        if (++step_ % 128 == 0) release_kv();
    }

    [[nodiscard]] std::size_t peak_live() const noexcept { return peak_; }

private:
    static constexpr int layers = 16;
    struct block {
        void* p;
        std::size_t n;
        stream s;
    };
    block take(stream s, std::size_t n) {
        live_ += n;
        peak_ = std::max(peak_, live_);
        return {r_.allocate(s, n, alignment), n, s};
    }
    void give(const block& b) {
        live_ -= b.n;
        r_.deallocate(b.s, b.p, b.n, alignment);
    }
    void release_kv() {
        for (const block& b : kv_) give(b);
        kv_.clear();
    }

    Peer& r_;
    std::span<const stream> streams_;
    bool bucketed_;
    std::mt19937 rng_{2024};
    std::vector<block> kv_;
    std::size_t live_ = 0, peak_ = 0, step_ = 0;
};

// ---- llm ----

/// A peer that counts the calls made through it.
template <class Peer>
struct counted {
    Peer& r;
    std::size_t ops = 0;
    void* allocate(stream s, std::size_t n, std::size_t a) {
        ++ops;
        return r.allocate(s, n, a);
    }
    void deallocate(stream s, void* p, std::size_t n, std::size_t a) {
        ++ops;
        r.deallocate(s, p, n, a);
    }
};

inline constexpr int llm_steps = 64; // one request: its KV cache is given back at the end

/// One request of the inference server.
template <class Peer>
void llm_request(Peer& r, const thread_streams& t) {
    inference_workload(r, std::span<const stream>(t.compute), t.copy, llm_steps);
}

/// The allocations and frees of one llm_request (the same for every peer: the sequence is seeded).
inline std::size_t llm_ops() {
    static const std::size_t ops = [] {
        malloc_peer m;
        counted<malloc_peer> c{m};
        inference_workload(c, stream{}, stream{}, llm_steps);
        return c.ops;
    }();
    return ops;
}

} // namespace custody_bench
