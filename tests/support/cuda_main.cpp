// The Catch2 main for the cuda suites: exits 77 (skipped) only where there is no CUDA device (or no
// driver at all), and fails, naming the error, where the CUDA stack is broken (tests/support/
// cuda_presence.hpp), so the suites build and "pass as skipped" only on machines without a GPU.
#define CATCH_CONFIG_RUNNER
#include "catch.hpp"

#include "cuda_presence.hpp"

int main(int argc, char* argv[]) {
    if (const int status = custody_test::cuda_gate("custody cuda suite"); status >= 0) return status;
    return Catch::Session().run(argc, argv);
}
