// platform/platform.hpp's basic_device_guard over a platform that knows which devices are set up
// (device_active, as the cuda platform asks for a device's primary context): a thread that never
// chose a device reads device 0 as current, and a guard must not give it a context on device 0
// when it ends.
#include <custody/platform/platform.hpp>

#include "../support/catch.hpp"

#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <vector>

namespace {

/// The device calls of a process with contexts: making a device current sets it up (as cudaSetDevice
/// creates the primary context). Each thread's current device is 0 until it sets one, as
/// cudaGetDevice answers on a thread that never chose.
struct context_platform {
    static inline std::mutex mutex;
    static inline std::set<int> active;     ///< devices set up in the process
    static inline std::vector<int> set_calls; ///< every set_device, in order

    static int& slot() noexcept {
        thread_local int device = 0;
        return device;
    }
    static int current_device() noexcept { return slot(); }
    static void set_device(int device) {
        std::lock_guard lock(mutex);
        set_calls.push_back(device);
        active.insert(device);
        slot() = device;
    }
    static void set_device_noexcept(int device) noexcept {
        try {
            set_device(device);
        } catch (...) {
        }
    }
    static bool device_active(int device) noexcept {
        std::lock_guard lock(mutex);
        return active.count(device) != 0;
    }
    static void reset(std::set<int> set_up) {
        std::lock_guard lock(mutex);
        active = std::move(set_up);
        set_calls.clear();
    }
};

using guard = custody::basic_device_guard<context_platform>;

/// Runs `f` on a thread of its own (one that never chose a device) and waits for it.
template <class F>
void on_fresh_thread(F f) {
    std::thread t(f);
    t.join();
}

} // namespace

TEST_CASE("a device guard on a thread that never chose a device gives it no context on device 0",
          "[platform][device_guard]") {
    context_platform::reset({1}); // this process uses device 1 only
    on_fresh_thread([] {
        { guard g(1); }
        CHECK(context_platform::current_device() == 1); // left where the guard went, as PyTorch's guards do
    });
    on_fresh_thread([] {
        { guard g(1, std::nothrow); }
    });
    CHECK(context_platform::set_calls == std::vector<int>{1, 1});
    CHECK_FALSE(context_platform::device_active(0));
}

TEST_CASE("a device guard restores a device the thread had set up", "[platform][device_guard]") {
    context_platform::reset({1, 2});
    on_fresh_thread([] {
        context_platform::set_device(2);
        {
            guard g(1);
            CHECK(context_platform::current_device() == 1);
        }
        CHECK(context_platform::current_device() == 2);
        {
            guard g(1, std::nothrow);
        }
        CHECK(context_platform::current_device() == 2);
    });
    CHECK(context_platform::set_calls == std::vector<int>{2, 1, 2, 1, 2});
}

TEST_CASE("a device guard for the current device or for no device changes nothing", "[platform][device_guard]") {
    context_platform::reset({});
    on_fresh_thread([] {
        { guard g(0); }
        { guard g(-1); }
    });
    CHECK(context_platform::set_calls.empty());
    CHECK(context_platform::active.empty());
}
