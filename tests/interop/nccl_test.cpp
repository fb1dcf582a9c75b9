// The NCCL pieces: resource/nccl_memory.hpp and interop/nccl/ (communicator, rank, live summary).
// Compile-time checks always; the run-time part needs a device (exit 77 without one): a one-rank
// communicator, the device check over it, ncclMemAlloc memory through custody's contract, two
// processes on one GPU (custody's error, not NCCL's), and, with two GPUs, local ranks under
// CUDA_VISIBLE_DEVICES and the live summary on the communicator's device.
#include <custody/debug/tracking_resource.hpp>
#include <custody/interop/cccl.hpp>
#include <custody/interop/nccl/communicator.hpp>
#include <custody/interop/nccl/live_summary.hpp>
#include <custody/interop/nccl/rank.hpp>
#include <custody/resource/cuda_async.hpp>
#include <custody/resource/nccl_memory.hpp>

#include "../support/catch.hpp"
#include "../support/rank_process.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace nccl = custody::interop::nccl;
using custody::resource::nccl_memory;

static_assert(std::is_move_constructible_v<nccl::communicator> && std::is_move_assignable_v<nccl::communicator>);
static_assert(!std::is_copy_constructible_v<nccl::communicator> && !std::is_copy_assignable_v<nccl::communicator>);
static_assert(custody::try_allocatable_resource<nccl_memory>); // usable as a pool's upstream
static_assert(custody::interop::cccl_stream_ordered_with<custody::interop::cccl_resource<nccl_memory>,
                                                         ::cuda::mr::device_accessible>);

namespace {

/// A worker process (nccl_rank_worker) with its output in a file.
struct rank_process {
    pid_t pid = -1;
    std::filesystem::path output;

    rank_process(const std::string& id_hex, int rank, int world, int device, const char* visible,
                 const std::filesystem::path& dir)
        : output(dir / ("rank" + std::to_string(rank) + ".out")) {
        pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            if (visible != nullptr) ::setenv("CUDA_VISIBLE_DEVICES", visible, 1);
            std::FILE* out = std::freopen(output.c_str(), "w", stdout);
            if (out == nullptr) ::_exit(126);
            const std::string r = std::to_string(rank);
            const std::string w = std::to_string(world);
            const std::string d = std::to_string(device);
            ::execl(CUSTODY_NCCL_RANK_WORKER, CUSTODY_NCCL_RANK_WORKER, id_hex.c_str(), r.c_str(), w.c_str(), d.c_str(),
                    static_cast<char*>(nullptr));
            ::_exit(127);
        }
    }
    rank_process(const rank_process&) = delete;
    rank_process& operator=(const rank_process&) = delete;
    ~rank_process() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    }
    /// The exit status, waiting at most `limit`; -1 if it has not ended by then.
    int wait(std::chrono::seconds limit) {
        const auto end = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < end) {
            int status = 0;
            if (::waitpid(pid, &status, WNOHANG) == pid) {
                pid = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return -1;
    }
    [[nodiscard]] std::string text() const {
        std::ifstream in(output);
        return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    }
};

std::string unique_id_hex() {
    const ncclUniqueId id = nccl::make_unique_id();
    const auto* bytes = reinterpret_cast<const unsigned char*>(&id);
    std::string hex;
    for (std::size_t i = 0; i < sizeof id; ++i) {
        char two[3];
        std::snprintf(two, sizeof two, "%02x", bytes[i]);
        hex += two;
    }
    return hex;
}

/// A fresh lock directory for the workers (CUSTODY_RUNTIME_DIR, inherited by fork), removed after.
struct lock_dir {
    custody_test::temp_dir dir{"custody-nccl-test"};
    const std::filesystem::path& path = dir.path;
    lock_dir() {
        REQUIRE_FALSE(path.empty());
        ::setenv("CUSTODY_RUNTIME_DIR", path.c_str(), 1);
    }
    lock_dir(const lock_dir&) = delete;
    lock_dir& operator=(const lock_dir&) = delete;
    ~lock_dir() { ::unsetenv("CUSTODY_RUNTIME_DIR"); }
};

} // namespace

TEST_CASE("ncclMemAlloc memory follows custody's contract", "[interop][nccl][gpu]") {
    nccl_memory memory(0);
    custody::cuda::stream stream(0);
    void* p = memory.allocate(stream.view(), 1 << 20, 256);
    REQUIRE(p != nullptr);
    CHECK(memory.statistics().live_bytes == (1 << 20));
    REQUIRE(cudaMemsetAsync(p, 1, 1 << 20, stream.view().get()) == cudaSuccess);
    memory.deallocate(stream.view(), p, 1 << 20, 256);
    CHECK(memory.statistics().live_bytes == 0);
    CHECK(memory.allocate_sync(0, 256) == nullptr);
    CHECK_THROWS_AS(memory.allocate_sync(64, 3), std::invalid_argument);
    CHECK_THROWS_AS(memory.allocate_sync(std::size_t{1} << 60, 256), custody::out_of_memory);
    CHECK(memory.statistics().allocations == 1);
}

TEST_CASE("a one-rank communicator binds its device and checks it", "[interop][nccl][gpu]") {
    lock_dir dir;
    const auto id = nccl::make_unique_id();
    const custody::rank_info me{0, 0, 1, 1, "caller"};
    nccl::communicator comm(id, me, 0);
    CHECK(comm.claim().holds());
    CHECK(comm.claim().rank() == 0);
    CHECK(comm.rank() == 0);
    CHECK(comm.size() == 1);
    const auto binding = nccl::bind_device(me, comm);
    CHECK(binding.device == 0);
    CHECK(binding.device_id.rfind("GPU-", 0) == 0);
    CHECK(custody::cuda::current_device() == 0);
    // Its rank over the communicator: local rank from the gathered host names.
    custody::cuda::stream stream(0);
    const custody::rank_info over = nccl::rank_from_communicator(comm.get(), stream.view().get());
    CHECK(over == custody::rank_info{0, 0, 1, 1, "nccl"});
    nccl::communicator moved = std::move(comm);
    CHECK(comm.get() == nullptr); // NOLINT(bugprone-use-after-move): checking the moved-from state
    CHECK(moved.get() != nullptr);
    CHECK(moved.claim().holds());
}

TEST_CASE("two processes on one GPU: the second gets custody's error naming both ranks", "[interop][nccl][gpu]") {
    lock_dir dir;
    const std::string id = unique_id_hex();
    rank_process first(id, 0, 2, 0, nullptr, dir.path);
    // Rank 0 holds the GPU once its lock file names it (it then waits in ncclCommInitRank).
    bool held = false;
    for (int i = 0; i < 1000 && !held; ++i) {
        for (const auto& entry : std::filesystem::directory_iterator(dir.path)) {
            std::ifstream in(entry.path());
            std::string word;
            held = held || (entry.path().extension() == ".lock" && (in >> word) && word == "rank");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(held);
    rank_process second(id, 1, 2, 0, nullptr, dir.path);
    CHECK(second.wait(std::chrono::seconds(60)) == 3);
    CHECK_THAT(second.text(), custody_test::contains("ranks 0 and 1 both chose device 0") &&
                                  custody_test::contains("rank 0 is process " + std::to_string(first.pid)));
}

TEST_CASE("two GPUs, one per process through CUDA_VISIBLE_DEVICES: local ranks 0 and 1", "[interop][nccl][gpu]") {
    if (custody::cuda::device_count() < 2) {
        WARN("fewer than two GPUs: local ranks under CUDA_VISIBLE_DEVICES not checked");
        return;
    }
    lock_dir dir;
    const std::string id = unique_id_hex();
    rank_process r0(id, 0, 2, 0, "0", dir.path);
    rank_process r1(id, 1, 2, 0, "1", dir.path);
    CHECK(r0.wait(std::chrono::seconds(120)) == 0);
    CHECK(r1.wait(std::chrono::seconds(120)) == 0);
    CHECK_THAT(r0.text(), custody_test::contains("rank 0 local 0 of 2"));
    CHECK_THAT(r1.text(), custody_test::contains("rank 1 local 1 of 2"));
}

TEST_CASE("the live summary travels over a one-rank NCCL communicator", "[interop][nccl][gpu]") {
    using tracker = custody::debug::tracking_resource<custody::resource::cuda_async>;
    custody::debug::tracking_options o;
    o.rank = custody::rank_info{};
    o.on_leak = custody::debug::policy::ignore;
    const int devices = custody::cuda::device_count();
    // With two GPUs the communicator lives on device 1 while device 0 is current: the scratch
    // memory of the gather must be on the communicator's device, and the caller's device restored.
    const int device = devices >= 2 ? 1 : 0;
    tracker t(o, device);
    custody::cuda::stream s(device);
    void* p = t.allocate(s, 4096, 256, "kv_cache");
    ncclComm_t comm = nullptr;
    int list[] = {device};
    REQUIRE(ncclCommInitAll(&comm, 1, list) == ncclSuccess);
    custody::cuda::platform::set_device(0);
    const custody::debug::cross_rank_view v = nccl::gather_live_summary(t, comm, s.view().get());
    CHECK(custody::cuda::current_device() == 0);
    CHECK(v.world_size == 1);
    REQUIRE(v.owners == std::vector<std::string>{"kv_cache"});
    CHECK(v.bytes[0][0] == 4096);
    ncclCommDestroy(comm);
    t.deallocate(s, p, 4096, 256);
    custody::cuda::platform::synchronize(s.view());
    if (devices < 2) WARN("one GPU: the summary's device choice was not checked against another current device");
}
