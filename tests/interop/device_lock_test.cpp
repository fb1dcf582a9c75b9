// interop/device_lock.hpp with real processes: ranks are processes of their own (fork/exec of
// device_lock_worker), each claiming a simulated GPU UUID, as ranks claim GPUs before NCCL exists.
#include <custody/interop/device_lock.hpp>

#include "../support/catch.hpp"
#include "../support/rank_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

using custody::interop::device_lock;
using custody::interop::device_lock_options;
using custody::interop::duplicate_device_error;

namespace {

using custody_test::temp_dir;

/// A worker process: its pid, the write end of its standard input, and its standard output.
struct worker {
    pid_t pid = -1;
    int input = -1;
    FILE* output = nullptr;

    worker(const std::string& dir, const std::string& device_id, int rank) {
        int in[2];
        int out[2];
        REQUIRE(::pipe(in) == 0);
        REQUIRE(::pipe(out) == 0);
        pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::dup2(in[0], 0);
            ::dup2(out[1], 1);
            ::close(in[0]);
            ::close(in[1]);
            ::close(out[0]);
            ::close(out[1]);
            const std::string r = std::to_string(rank);
            ::execl(CUSTODY_DEVICE_LOCK_WORKER, CUSTODY_DEVICE_LOCK_WORKER, dir.c_str(), device_id.c_str(), r.c_str(),
                    static_cast<char*>(nullptr));
            ::_exit(127);
        }
        ::close(in[0]);
        ::close(out[1]);
        input = in[1];
        output = ::fdopen(out[0], "r");
    }
    worker(const worker&) = delete;
    worker& operator=(const worker&) = delete;
    ~worker() {
        if (input >= 0) ::close(input);
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
        if (output != nullptr) std::fclose(output);
    }

    /// The first line the worker prints.
    std::string line() {
        char buffer[1024] = {};
        if (std::fgets(buffer, sizeof buffer, output) == nullptr) return {};
        std::string text(buffer);
        if (!text.empty() && text.back() == '\n') text.pop_back();
        return text;
    }
    /// Ends the worker (SIGKILL: no destructor runs) and returns its exit status, or -signal.
    int kill() {
        ::kill(pid, SIGKILL);
        return wait();
    }
    /// Closes the worker's input (a worker holding a claim then ends) and waits for it.
    int wait() {
        if (input >= 0) ::close(input);
        input = -1;
        int status = 0;
        ::waitpid(pid, &status, 0);
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
};

} // namespace

TEST_CASE("a second process claiming one GPU gets custody's error naming both ranks", "[interop][device_lock]") {
    temp_dir dir;
    const std::string gpu = "GPU-5c1e0000-1111-2222-3333-444455556666";
    worker first(dir.path.string(), gpu, 0);
    REQUIRE(first.line() == "claimed rank 0");
    worker second(dir.path.string(), gpu, 1);
    const std::string message = second.line();
    CHECK(second.wait() == 3);
    CHECK_THAT(message, custody_test::contains("ranks 0 and 1 both chose device 0 on host host-a (" + gpu + ")") &&
                            custody_test::contains("rank 0 is process " + std::to_string(first.pid)));

    // The kernel releases the claim of a process that dies, however it dies.
    CHECK(first.kill() == -SIGKILL);
    worker third(dir.path.string(), gpu, 1);
    CHECK(third.line() == "claimed rank 1");
}

TEST_CASE("processes on different GPUs both hold their claims", "[interop][device_lock]") {
    temp_dir dir;
    worker a(dir.path.string(), "GPU-aaaa", 0);
    worker b(dir.path.string(), "GPU-bbbb", 1);
    CHECK(a.line() == "claimed rank 0");
    CHECK(b.line() == "claimed rank 1");
}

TEST_CASE("claims of one process share the lock until the last is released", "[interop][device_lock]") {
    temp_dir dir;
    device_lock_options options;
    options.directory = dir.path.string();
    auto world = device_lock::claim("GPU-cccc", 3, 0, options);
    {
        // Another communicator of this process (a tensor-parallel group) on the same GPU.
        const auto group = device_lock::claim("GPU-cccc", 1, 0, options);
        CHECK(group.rank() == 3); // the claim names the rank that first took it
        worker other(dir.path.string(), "GPU-cccc", 5);
        CHECK_THAT(other.line(), custody_test::contains("ranks 3 and 5"));
    }
    worker still_held(dir.path.string(), "GPU-cccc", 5);
    CHECK_THAT(still_held.line(), custody_test::contains("ranks 3 and 5"));
    world = device_lock{};
    worker free_now(dir.path.string(), "GPU-cccc", 5);
    CHECK(free_now.line() == "claimed rank 5");
}

TEST_CASE("a lock directory that cannot be used is a rank_error naming it", "[interop][device_lock]") {
    temp_dir dir;
    const auto file = dir.path / "not-a-directory";
    FILE* f = std::fopen(file.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fclose(f);
    device_lock_options options;
    options.directory = file.string();
    CHECK_THROWS_WITH(device_lock::claim("GPU-dddd", 0, 0, options),
                      custody_test::contains(file.string()) && custody_test::contains("CUSTODY_RUNTIME_DIR"));
    // Device identities are file names only after unsafe characters are replaced.
    options.directory = dir.path.string();
    const auto lock = device_lock::claim("../../etc/x", 0, 0, options);
    CHECK(std::filesystem::path(lock.path()).parent_path() == dir.path);
    CHECK(std::filesystem::exists(lock.path()));
    CHECK(lock.holds());
    CHECK_FALSE(device_lock{}.holds());
}

TEST_CASE("a claim returned is a claim held, while other threads of the process claim and release the id",
          "[interop][device_lock]") {
    temp_dir dir;
    device_lock_options options;
    options.directory = dir.path.string();
    constexpr int threads = 8;
    constexpr int rounds = 3000;
    std::atomic<int> empty{0};
    std::atomic<int> errors{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            for (int i = 0; i < rounds; ++i) {
                try {
                    const device_lock lock = device_lock::claim("GPU-stress", t, 0, options);
                    if (!lock.holds()) empty.fetch_add(1);
                } catch (const std::exception&) {
                    errors.fetch_add(1);
                }
            }
        });
    }
    for (auto& th : pool) th.join();
    CHECK(empty.load() == 0);
    CHECK(errors.load() == 0);
    // Nothing is left held: another process claims the id at once.
    worker after(dir.path.string(), "GPU-stress", 9);
    CHECK(after.line() == "claimed rank 9");
}

TEST_CASE("a lock file planted as a link, a hard link or another user's file is refused", "[interop][device_lock]") {
    temp_dir dir;
    device_lock_options options;
    options.directory = dir.path.string();
    const std::string victim = (dir.path / "victim").string();
    const std::string text = "someone else's file\n";
    const auto plant = [&] {
        FILE* f = std::fopen(victim.c_str(), "w");
        REQUIRE(f != nullptr);
        std::fputs(text.c_str(), f);
        std::fclose(f);
    };
    const auto victim_text = [&] {
        char buffer[128] = {};
        FILE* f = std::fopen(victim.c_str(), "r");
        if (f == nullptr) return std::string();
        const std::size_t n = std::fread(buffer, 1, sizeof buffer - 1, f);
        std::fclose(f);
        return std::string(buffer, n);
    };
    const std::string lock_path = (dir.path / "gpu-GPU-planted.lock").string();
    plant();

    SECTION("a symbolic link") { REQUIRE(::symlink(victim.c_str(), lock_path.c_str()) == 0); }
    SECTION("a hard link") { REQUIRE(::link(victim.c_str(), lock_path.c_str()) == 0); }
    SECTION("a file of another user") {
        if (::geteuid() != 0) {
            WARN("not checked: giving a file to another user needs root");
            return;
        }
        REQUIRE(::rename(victim.c_str(), lock_path.c_str()) == 0);
        REQUIRE(::chown(lock_path.c_str(), 65534, 65534) == 0);
        plant();
    }
    SECTION("a directory") { REQUIRE(::mkdir(lock_path.c_str(), 0700) == 0); }
    SECTION("a named pipe") { REQUIRE(::mkfifo(lock_path.c_str(), 0600) == 0); }

    CHECK_THROWS_AS(device_lock::claim("GPU-planted", 0, 0, options), custody::rank_error);
    CHECK(victim_text() == text);
    // The claim took nothing: once the plant is gone, the id is claimed as usual.
    std::filesystem::remove_all(lock_path);
    const auto lock = device_lock::claim("GPU-planted", 0, 0, options);
    CHECK(lock.holds());
    CHECK(victim_text() == text);
}
