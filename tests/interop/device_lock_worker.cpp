// A rank in a process of its own for device_lock_test.cpp:
//   device_lock_worker DIR DEVICE_ID RANK
// claims DEVICE_ID for RANK under DIR, prints "claimed" and holds the claim until its standard
// input closes (or it is killed). On custody's duplicate-device error it prints the message and
// exits 3; on any other error, 4.
#include <custody/interop/device_lock.hpp>

#include "../support/rank_process.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s DIR DEVICE_ID RANK\n", argv[0]);
        return 2;
    }
    return custody_test::run_rank_worker([&] {
        custody::interop::device_lock_options options;
        options.directory = argv[1];
        options.host = "host-a";
        const auto lock = custody::interop::device_lock::claim(argv[2], std::atoi(argv[3]), 0, options);
        std::printf("claimed rank %d\n", lock.rank());
        std::fflush(stdout);
        for (int c = std::getchar(); c != EOF; c = std::getchar()) {
        }
        return 0;
    });
}
