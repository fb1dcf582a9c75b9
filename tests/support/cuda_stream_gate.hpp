// stream_gate for the cuda platform: a host function enqueued on the stream blocks on a latch.
#pragma once

#include "stream_gate.hpp"

#include <custody/core/error.hpp>
#include <custody/platform/cuda.hpp>

#include <cuda_runtime_api.h>

#include <latch>
#include <memory>

namespace custody::test {

template <>
class stream_gate<cuda::platform> {
public:
    explicit stream_gate(cuda::stream_view s) : latch_(new std::latch(1)) {
        CUSTODY_CUDA_TRY(cudaLaunchHostFunc(s.get(), [](void* l) { static_cast<std::latch*>(l)->wait(); }, latch_.get()));
        stream_ = s;
    }
    stream_gate(const stream_gate&) = delete;
    stream_gate& operator=(const stream_gate&) = delete;
    ~stream_gate() {
        open();
        static_cast<void>(cudaStreamSynchronize(stream_.get())); // the host function still refers to the latch
    }
    void open() {
        if (!opened_) {
            opened_ = true;
            latch_->count_down();
        }
    }

private:
    std::unique_ptr<std::latch> latch_;
    cuda::stream_view stream_;
    bool opened_ = false;
};

} // namespace custody::test
