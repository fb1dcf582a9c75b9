/// @file
/// `progress`: a one-line progress bar on standard error for long replays.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace custody::replay {

/// Draws "[#####.....]  42%  pool, device 0, repetition 2 of 5" on standard error, redrawn in
/// place at most ten times a second, and erased by finish(). Disabled, every call is a no-op.
/// Thread safety: none (the replay's thread).
class progress {
public:
    explicit progress(bool enabled) noexcept : enabled_(enabled) {}
    progress(const progress&) = delete;
    progress& operator=(const progress&) = delete;
    ~progress() { finish(); }

    /// Sets the whole amount of work (operations over every allocator and repetition).
    void total(std::uint64_t units) noexcept { total_ = units == 0 ? 1 : units; }
    void label(std::string text) { label_ = std::move(text); }

    void advance(std::uint64_t units) {
        done_ += units;
        if (!enabled_) return;
        const auto now = std::chrono::steady_clock::now();
        if (drawn_ && now - last_ < std::chrono::milliseconds(100) && done_ < total_) return;
        last_ = now;
        draw();
    }

    void finish() noexcept {
        if (enabled_ && drawn_) std::fputs("\r\033[K", stderr);
        drawn_ = false;
    }

private:
    void draw() {
        constexpr int width = 30;
        const double f = done_ >= total_ ? 1.0 : static_cast<double>(done_) / static_cast<double>(total_);
        char bar[width + 1];
        for (int i = 0; i < width; ++i) bar[i] = i < static_cast<int>(f * width) ? '#' : '.';
        bar[width] = '\0';
        std::fprintf(stderr, "\r\033[K[%s] %3d%%  %s", bar, static_cast<int>(f * 100.0), label_.c_str());
        std::fflush(stderr);
        drawn_ = true;
    }

    bool enabled_;
    bool drawn_ = false;
    std::uint64_t total_ = 1;
    std::uint64_t done_ = 0;
    std::string label_;
    std::chrono::steady_clock::time_point last_{};
};

} // namespace custody::replay
