// tests/support/cuda_presence.hpp: only a machine without a device (or without any CUDA driver)
// skips the cuda suites; any other failure of the CUDA stack fails them, with the error's name.
#include "../support/cuda_presence.hpp"

#include "../support/catch.hpp"

#include <string>

using custody_test::cuda_verdict;
using custody_test::judge_cuda;

TEST_CASE("devices present: the suite runs", "[cuda][presence]") {
    const auto p = judge_cuda(cudaSuccess, 2, cudaSuccess, 13000);
    CHECK(p.verdict == cuda_verdict::run);
    CHECK(p.devices == 2);
}

TEST_CASE("no device, or no driver at all: the suite is skipped", "[cuda][presence]") {
    // A driver without any GPU.
    CHECK(judge_cuda(cudaErrorNoDevice, 0, cudaSuccess, 13000).verdict == cuda_verdict::skip);
    CHECK(judge_cuda(cudaSuccess, 0, cudaSuccess, 13000).verdict == cuda_verdict::skip);
    // No driver installed (no libcuda): the runtime answers cudaErrorInsufficientDriver, and
    // cudaDriverGetVersion reports version 0, as it is documented to when no driver is installed.
    const auto none = judge_cuda(cudaErrorInsufficientDriver, 0, cudaSuccess, 0);
    CHECK(none.verdict == cuda_verdict::skip);
    CHECK_THAT(none.message, custody_test::contains("no CUDA driver"));
}

TEST_CASE("a driver too old for the runtime fails the suite, naming the error and both versions", "[cuda][presence]") {
    const auto old = judge_cuda(cudaErrorInsufficientDriver, 0, cudaSuccess, 11040);
    CHECK(old.verdict == cuda_verdict::fail);
    CHECK(old.devices == 0);
    CHECK_THAT(old.message, custody_test::contains("cudaErrorInsufficientDriver") &&
                                custody_test::contains("driver supports CUDA 11.4") &&
                                custody_test::contains("runtime is CUDA " + std::to_string(CUDART_VERSION / 1000) + "."));
}

TEST_CASE("any other error of the CUDA stack fails the suite with its name", "[cuda][presence]") {
    for (const cudaError_t e : {cudaErrorInitializationError, cudaErrorSystemDriverMismatch,
                                cudaErrorCompatNotSupportedOnDevice, cudaErrorDevicesUnavailable, cudaErrorUnknown}) {
        const auto p = judge_cuda(e, 0, cudaSuccess, 13000);
        CHECK(p.verdict == cuda_verdict::fail);
        CHECK_THAT(p.message, custody_test::contains(cudaGetErrorName(e)));
    }
    // cudaDriverGetVersion failing with no device reported is a broken stack, not a bare machine.
    CHECK(judge_cuda(cudaErrorInsufficientDriver, 0, cudaErrorUnknown, 0).verdict == cuda_verdict::fail);
}

TEST_CASE("cuda_gate: -1 runs, 77 skips, 1 fails", "[cuda][presence]") {
    CHECK(custody_test::cuda_gate("t", {cuda_verdict::run, 1, "1 device"}) == -1);
    CHECK(custody_test::cuda_gate("t", {cuda_verdict::skip, 0, "no CUDA device"}) == 77);
    CHECK(custody_test::cuda_gate("t", {cuda_verdict::fail, 0, "cudaErrorUnknown"}) == 1);
}

TEST_CASE("this machine's verdict is consistent with its driver", "[cuda][presence]") {
    const auto here = custody_test::probe_cuda();
    int driver = -1;
    REQUIRE(cudaDriverGetVersion(&driver) == cudaSuccess);
    if (here.verdict == cuda_verdict::run) CHECK(here.devices > 0);
    if (driver == 0) CHECK(here.verdict == cuda_verdict::skip); // no driver installed
}
