// The Catch2 main for the cuda suites: exits 77 (skipped) when no CUDA device is present, so the
// suites build and "pass as skipped" on machines without a GPU.
#define CATCH_CONFIG_RUNNER
#include "catch.hpp"

#include <custody/platform/cuda.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
    if (custody::cuda::device_count() == 0) {
        std::puts("custody: no CUDA device present; skipping the cuda suite");
        return 77;
    }
    return Catch::Session().run(argc, argv);
}
