// The Catch2 main of the interop cuda suite. Without a device the cases tagged [gpu] are skipped,
// the others (host memory through CCCL, compile-time checks) still run, and the suite exits 77.
#define CATCH_CONFIG_RUNNER
#include "../support/catch.hpp"

#include <custody/platform/cuda.hpp>

#include <cstdio>

int main(int argc, char** argv) {
    Catch::Session session;
    if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
    const bool have_device = custody::cuda::device_count() > 0;
    if (!have_device) session.configData().testsOrTags.emplace_back("~[gpu]");
    session.useConfigData(session.configData());
    const int failed = session.run();
    if (failed != 0) return failed;
    if (!have_device) {
        std::puts("no CUDA device: the GPU cases were skipped (the static_asserts hold)");
        return 77;
    }
    return 0;
}
