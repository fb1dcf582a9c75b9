// A gate that holds a stream busy until opened, on either platform, so a test can give memory back
// while work is still pending on the stream, deterministically (a latch, not a sleep).
#pragma once

#include <custody/platform/host.hpp>

#include <latch>
#include <memory>

namespace custody::test {

/// Primary template: specialized per platform.
template <class Platform>
class stream_gate;

template <>
class stream_gate<host::platform> {
public:
    explicit stream_gate(host::stream_view s) : latch_(std::make_shared<std::latch>(1)) {
        s.enqueue([l = latch_] { l->wait(); });
    }
    stream_gate(const stream_gate&) = delete;
    stream_gate& operator=(const stream_gate&) = delete;
    ~stream_gate() { open(); }
    void open() {
        if (!opened_) {
            opened_ = true;
            latch_->count_down();
        }
    }

private:
    std::shared_ptr<std::latch> latch_;
    bool opened_ = false;
};

} // namespace custody::test
