// The Catch2 main of the interop cuda suite. Without a device the cases tagged [gpu] are skipped,
// the others (host memory through CCCL, compile-time checks) still run, and the suite exits 77. A
// broken CUDA stack fails the suite (tests/support/cuda_presence.hpp).
#define CATCH_CONFIG_RUNNER
#include "../support/catch.hpp"
#include "../support/cuda_presence.hpp"

#include <cstdio>

int main(int argc, char** argv) {
    Catch::Session session;
    if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
    const auto presence = custody_test::probe_cuda();
    if (presence.verdict == custody_test::cuda_verdict::fail) return custody_test::cuda_gate("test_interop_cuda", presence);
    const bool have_device = presence.verdict == custody_test::cuda_verdict::run;
    if (!have_device) session.configData().testsOrTags.emplace_back("~[gpu]");
    session.useConfigData(session.configData());
    const int failed = session.run();
    if (failed != 0) return failed;
    if (!have_device) {
        std::printf("%s: the GPU cases were skipped (the static_asserts hold)\n", presence.message.c_str());
        return 77;
    }
    return 0;
}
