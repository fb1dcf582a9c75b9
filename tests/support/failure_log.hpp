// A failure callback for tests: collects what custody::report_failure receives while it lives.
#pragma once

#include <custody/core/failure_callback.hpp>

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace custody::test {

/// Collects what custody::report_failure receives while it lives; restores the previous callback.
class failure_log {
public:
    failure_log() : previous_(set_failure_callback(&record)) {
        std::lock_guard lock(mutex());
        messages().clear();
    }
    ~failure_log() { set_failure_callback(previous_); }
    failure_log(const failure_log&) = delete;
    failure_log& operator=(const failure_log&) = delete;

    [[nodiscard]] std::vector<std::string> lines() const {
        std::lock_guard lock(mutex());
        return messages();
    }

private:
    static std::mutex& mutex() {
        static std::mutex m;
        return m;
    }
    static std::vector<std::string>& messages() {
        static std::vector<std::string> m;
        return m;
    }
    static void record(std::string_view message) noexcept {
        try {
            std::lock_guard lock(mutex());
            messages().emplace_back(message);
        } catch (...) {
        }
    }
    failure_callback previous_;
};

} // namespace custody::test
