// One NCCL rank in a process of its own, for nccl_test.cpp:
//   nccl_rank_worker ID_HEX RANK WORLD DEVICE
// joins the communicator ID_HEX (ncclUniqueId as hex) as RANK of WORLD on DEVICE, then prints
// "rank R local L of N" from rank_from_communicator and exits 0. On custody's duplicate-device
// error it prints the message and exits 3; on any other error, 4.
#include <custody/interop/nccl/communicator.hpp>
#include <custody/interop/nccl/rank.hpp>

#include "../support/rank_process.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
    if (argc != 5 || std::strlen(argv[1]) != 2 * sizeof(ncclUniqueId)) {
        std::fprintf(stderr, "usage: %s ID_HEX RANK WORLD DEVICE\n", argv[0]);
        return 2;
    }
    ncclUniqueId id{};
    auto* bytes = reinterpret_cast<unsigned char*>(&id);
    for (std::size_t i = 0; i < sizeof id; ++i) {
        bytes[i] = static_cast<unsigned char>(std::stoi(std::string(argv[1] + 2 * i, 2), nullptr, 16));
    }
    return custody_test::run_rank_worker([&] {
        const int device = std::atoi(argv[4]);
        custody::interop::nccl::communicator comm(id, std::atoi(argv[2]), std::atoi(argv[3]), device);
        custody::cuda::stream stream(device);
        const custody::rank_info me = custody::interop::nccl::rank_from_communicator(comm.get(), stream.view().get());
        std::printf("rank %d local %d of %d\n", me.rank, me.local_rank, me.local_world_size);
        return 0;
    });
}
