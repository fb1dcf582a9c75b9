// core/rank.hpp and interop/bind_device.hpp: rank detection from launcher environments, and the
// duplicate-device check run by N ranks as N threads meeting at a barrier (the host path of the
// exchange an NCCL communicator does on GPUs).
#include <custody/interop/bind_device.hpp>
#include <custody/core/rank.hpp>
#include <custody/platform/host.hpp>

#include "../support/catch.hpp"

#include <barrier>
#include <cstddef>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using custody::interop::bind_device;
using custody::interop::binding_options;
using custody::interop::device_binding;
using custody::interop::device_claim;
using custody::interop::duplicate_device_error;
using custody::rank_error;
using custody::rank_from_environment;
using custody::rank_info;
using host_platform = custody::host::platform;

namespace {

custody::environment_lookup env(std::map<std::string, std::string> vars) {
    return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
        const auto it = vars.find(std::string(name));
        if (it == vars.end()) return std::nullopt;
        return it->second;
    };
}

/// N ranks as N threads: each all_gather writes its claim to its slot, meets the others at a
/// barrier, copies every slot, and meets them again so no slot is rewritten while being read.
class thread_exchange {
public:
    explicit thread_exchange(int ranks) : slots_(static_cast<std::size_t>(ranks)), barrier_(ranks) {}

    std::vector<device_claim> all_gather(const device_claim& mine) {
        slots_.at(static_cast<std::size_t>(mine.rank)) = mine;
        barrier_.arrive_and_wait();
        std::vector<device_claim> all = slots_;
        barrier_.arrive_and_wait();
        return all;
    }

private:
    std::vector<device_claim> slots_;
    std::barrier<> barrier_;
};
static_assert(custody::interop::claim_exchange<thread_exchange>);

struct outcome {
    std::optional<device_binding> binding;
    std::string error;
    int first = -1;
    int second = -1;
    int device_after = -1; ///< the thread's current device after the call
};

/// Runs bind_device on `ranks.size()` threads; hosts[i] is rank i's host name.
std::vector<outcome> bind_all(const std::vector<rank_info>& ranks, const std::vector<std::string>& hosts) {
    thread_exchange exchange(static_cast<int>(ranks.size()));
    std::vector<outcome> results(ranks.size());
    {
        std::vector<std::jthread> threads;
        for (std::size_t i = 0; i < ranks.size(); ++i) {
            threads.emplace_back([&, i] {
                host_platform::set_device(7); // a device no rank chooses: shows whether binding changed it
                try {
                    results[i].binding = bind_device<host_platform>(ranks[i], exchange, binding_options{hosts[i], {}});
                } catch (const duplicate_device_error& e) {
                    results[i].error = e.what();
                    results[i].first = e.first_rank();
                    results[i].second = e.second_rank();
                } catch (const std::exception& e) {
                    results[i].error = e.what();
                }
                results[i].device_after = host_platform::current_device();
            });
        }
    }
    return results;
}

rank_info rank(int r, int local, int world) { return rank_info{r, local, world, -1, "test"}; }

} // namespace

TEST_CASE("the rank is read from torchrun, Open MPI and Slurm variables", "[interop][rank]") {
    const auto torchrun = rank_from_environment(env({{"RANK", "5"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"},
                                                     {"LOCAL_WORLD_SIZE", "4"}}));
    CHECK(torchrun == rank_info{5, 1, 8, 4, "torchrun"});
    const auto mpi = rank_from_environment(env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                                {"OMPI_COMM_WORLD_SIZE", "4"}}));
    CHECK(mpi == rank_info{3, 3, 4, -1, "Open MPI"});
    const auto slurm = rank_from_environment(env({{"SLURM_PROCID", "6"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS", "8"},
                                                  {"SLURM_NTASKS_PER_NODE", "4(x2)"}}));
    CHECK(slurm == rank_info{6, 2, 8, -1, "Slurm"});
    // torchrun's variables win over a surrounding Slurm allocation.
    const auto both = rank_from_environment(env({{"RANK", "1"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "2"},
                                                 {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "1"}}));
    CHECK(both.source == "torchrun");
    CHECK(both.rank == 1);
}

TEST_CASE("torchrun inside an Open MPI job: torchrun's complete set wins", "[interop][rank]") {
    // mpirun starts one torchrun agent per node; each agent starts its workers with RANK & co.
    // The worker inherits the agent's OMPI_COMM_WORLD_* too, which describe the agents' job.
    const auto vars = std::map<std::string, std::string>{
        {"RANK", "5"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
    CHECK(rank_from_environment(env(vars)) == rank_info{5, 1, 8, 4, "torchrun"});
    CHECK(custody::detect_rank(env(vars)) == rank_info{5, 1, 8, 4, "torchrun"});
}

TEST_CASE("a launcher set that contradicts itself is an error, never skipped for the next", "[interop][rank]") {
    const std::map<std::string, std::string> mpi{
        {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
    auto contradictory = mpi;
    contradictory.insert({{"RANK", "0"}, {"LOCAL_RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}});
    auto incomplete = mpi;
    incomplete.insert({{"RANK", "0"}});
    for (const auto& vars : {contradictory, incomplete}) {
        // Both entry points agree: the torchrun set is wrong, and the message says which complete
        // set was passed over and how to use it.
        const custody::environment_lookup read = env(vars);
        CHECK_THROWS_WITH(rank_from_environment(read),
                          custody_test::contains("torchrun") &&
                              custody_test::contains("Open MPI's variables are complete (rank 1 of 2)") &&
                              custody_test::contains("unset RANK"));
        CHECK_THROWS_AS(custody::detect_rank(read), rank_error);
    }
    // Alone, the same incomplete set names no other launcher.
    try {
        static_cast<void>(rank_from_environment(env({{"RANK", "0"}})));
        FAIL("no rank_error");
    } catch (const rank_error& e) {
        CHECK_THAT(std::string(e.what()), !custody_test::contains("variables are complete"));
    }
}

TEST_CASE("a missing or invalid environment is a clear rank_error", "[interop][rank]") {
    CHECK_THROWS_WITH(rank_from_environment(env({})),
                      custody_test::contains("no rank in the environment") && custody_test::contains("LOCAL_RANK") &&
                          custody_test::contains("SLURM_PROCID") && custody_test::contains("OMPI_COMM_WORLD_RANK"));
    CHECK_THROWS_WITH(rank_from_environment(env({{"RANK", "0"}, {"WORLD_SIZE", "2"}})),
                      custody_test::contains("RANK is set but LOCAL_RANK is not"));
    CHECK_THROWS_WITH(rank_from_environment(env({{"RANK", "0"}, {"LOCAL_RANK", "zero"}, {"WORLD_SIZE", "2"}})),
                      custody_test::contains("LOCAL_RANK='zero' is not a non-negative integer"));
    CHECK_THROWS_WITH(rank_from_environment(env({{"RANK", "-1"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "2"}})),
                      custody_test::contains("RANK='-1'"));
    CHECK_THROWS_WITH(rank_from_environment(env({{"RANK", "2 "}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "4"}})),
                      custody_test::contains("RANK='2 '"));
    CHECK_THROWS_WITH(rank_from_environment(env({{"RANK", "4"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "4"}})),
                      custody_test::contains("rank 4 is not below the world size 4"));
    CHECK_THROWS_WITH(rank_from_environment(env({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "0"}})),
                      custody_test::contains("world size 0 is not positive") && custody_test::contains("Slurm"));
    CHECK_THROWS_AS(rank_from_environment(env({{"RANK", "0"}, {"LOCAL_RANK", "3"}, {"WORLD_SIZE", "4"},
                                               {"LOCAL_WORLD_SIZE", "2"}})),
                    rank_error);
}

TEST_CASE("two ranks given one device: every rank fails with an error naming both", "[interop][rank]") {
    // Ranks 0 and 1 both read LOCAL_RANK=0 on host-a (a misconfigured launcher).
    const auto results = bind_all({rank(0, 0, 3), rank(1, 0, 3), rank(2, 1, 3)}, {"host-a", "host-a", "host-a"});
    for (const auto& r : results) {
        CHECK_FALSE(r.binding.has_value());
        CHECK(r.error == "custody: ranks 0 and 1 both chose device 0 on host host-a (device 0); give each local "
                         "rank its own device (LOCAL_RANK, CUDA_VISIBLE_DEVICES)");
        CHECK(r.first == 0);
        CHECK(r.second == 1);
        CHECK(r.device_after == 7); // unchanged on failure
    }
}

TEST_CASE("distinct devices, or one device index on different hosts, bind", "[interop][rank]") {
    const auto results = bind_all({rank(0, 0, 4), rank(1, 1, 4), rank(2, 0, 4), rank(3, 1, 4)},
                                  {"host-a", "host-a", "host-b", "host-b"});
    for (std::size_t i = 0; i < results.size(); ++i) {
        INFO("rank " << i << ": " << results[i].error);
        REQUIRE(results[i].binding.has_value());
        CHECK(results[i].binding->device == static_cast<int>(i % 2));
        CHECK(results[i].device_after == static_cast<int>(i % 2));
        CHECK(results[i].binding->device_id == "device " + std::to_string(i % 2));
    }
}

TEST_CASE("more local ranks than visible devices: each process uses local rank mod visible", "[interop][rank]") {
    using custody::interop::choose_device;
    // Each process sees its own pair of GPUs (CUDA_VISIBLE_DEVICES=2k,2k+1): local ranks 0..3 of a
    // host with 8 GPUs see 2 each, and use device (local rank mod 2) of their pair.
    CHECK(choose_device(rank(2, 2, 4), 2) == 0);
    CHECK(choose_device(rank(3, 3, 4), 2) == 1);
    // One GPU per process: device 0; all GPUs visible: the local rank.
    CHECK(choose_device(rank(5, 5, 8), 1) == 0);
    CHECK(choose_device(rank(5, 5, 8), 8) == 5);
    CHECK_THROWS_WITH(choose_device(rank(1, 1, 2), 0), custody_test::contains("no device is visible"));

    // On the host platform every process sees the same devices: one local rank too many wraps
    // onto device 0, and the identity check names the two ranks that share it.
    const int count = host_platform::device_count();
    std::vector<rank_info> ranks;
    for (int r = 0; r <= count; ++r) ranks.push_back(rank(r, r, count + 1));
    const auto results = bind_all(ranks, std::vector<std::string>(ranks.size(), "host-a"));
    for (const auto& r : results) {
        CHECK_FALSE(r.binding.has_value());
        CHECK(r.first == 0);
        CHECK(r.second == count);
    }
}

TEST_CASE("local ranks from gathered host names, whatever the device ordinals", "[interop][rank]") {
    using custody::place_on_host;
    const std::vector<std::string> hosts{"a", "b", "a", "b", "a"};
    CHECK(place_on_host(hosts, 0).local_rank == 0);
    CHECK(place_on_host(hosts, 2).local_rank == 1);
    CHECK(place_on_host(hosts, 4).local_rank == 2);
    CHECK(place_on_host(hosts, 4).local_world_size == 3);
    CHECK(place_on_host(hosts, 3).local_rank == 1);
    CHECK(place_on_host(hosts, 3).local_world_size == 2);
    CHECK_THROWS_AS(place_on_host(hosts, 5), rank_error);
    CHECK_THROWS_AS(place_on_host(hosts, -1), rank_error);
}

TEST_CASE("the claims must cover every rank once", "[interop][rank]") {
    device_claim a;
    a.rank = 0;
    a.device = 0;
    device_claim::assign(a.host, "h");
    device_claim::assign(a.device_id, "device 0");
    device_claim b = a;
    b.device = 1;
    device_claim::assign(b.device_id, "device 1");
    CHECK_THROWS_WITH(custody::interop::check_device_claims({a, b}, 2), custody_test::contains("no claim from rank 1"));
    CHECK_THROWS_WITH(custody::interop::check_device_claims({a}, 2), custody_test::contains("gathered 1 claims"));
    b.rank = 1;
    CHECK_NOTHROW(custody::interop::check_device_claims({b, a}, 2));
    // Identity, not the index, decides: one GPU seen as device 0 by both ranks under different
    // CUDA_VISIBLE_DEVICES orderings collides only if its UUID matches.
    device_claim::assign(b.device_id, "device 0");
    CHECK_THROWS_AS(custody::interop::check_device_claims({a, b}, 2), duplicate_device_error);
    // Long host names are truncated, never overrun.
    device_claim::assign(a.host, std::string(500, 'x'));
    CHECK(a.host_name().size() == device_claim::text_size - 1);
}
