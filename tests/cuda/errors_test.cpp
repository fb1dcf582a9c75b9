// The CUDA and NCCL check macros turn failing calls into typed errors. Runs on every machine with
// the toolkit, GPU or not: the calls below fail either way (no device, no driver, or a bad argument).
#define CATCH_CONFIG_RUNNER
#include "../support/catch.hpp"

#include <custody/core/error.hpp>
#include <custody/platform/cuda.hpp>
#include <custody/platform/platform.hpp>

#include "../support/failure_log.hpp"

#include <cuda_runtime_api.h>
#ifdef CUSTODY_WITH_NCCL
#include <nccl.h>
#endif

#include <stdexcept>
#include <string>

TEST_CASE("CUSTODY_CUDA_TRY throws cuda_error with the call, the error's name and code, and file:line", "[cuda][core]") {
    try {
        CUSTODY_CUDA_TRY(cudaSetDevice(-1));
        FAIL("cudaSetDevice(-1) succeeded");
    } catch (const custody::cuda_error& e) {
        CHECK(e.code() != 0);
        CHECK(e.call() == "cudaSetDevice(-1)");
        CHECK(e.error_name().rfind("cudaError", 0) == 0);
        CHECK(std::string(e.file()).find("errors_test.cpp") != std::string::npos);
        CHECK(std::string(e.what()).find(" from cudaSetDevice(-1) at ") != std::string::npos);
    }
    // The error was cleared, so the next call does not report it again. (Without a driver the
    // runtime keeps reporting its initialization failure, which no call can clear.)
    if (custody::cuda::device_count() > 0) CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("device_count is 0, not an exception, when there is no device", "[cuda][platform]") {
    const int n = custody::cuda::device_count();
    CHECK(n >= 0);
    if (n == 0) CHECK_THROWS_AS(custody::cuda::stream(0), custody::cuda_error);
}

TEST_CASE("a failure that is the runtime unloading goes unreported on noexcept paths, any other is reported",
          "[cuda][platform]") {
    CHECK(custody::cuda::is_exiting(cudaErrorCudartUnloading));
    CHECK_FALSE(custody::cuda::is_exiting(cudaErrorInvalidValue));
    const custody::cuda_error unloading(cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "cudaEventSynchronize(e)");
    const custody::cuda_error invalid(cudaErrorInvalidValue, "cudaErrorInvalidValue", "cudaEventSynchronize(e)");
    CHECK(custody::cuda::platform::is_exiting(unloading));
    CHECK_FALSE(custody::cuda::platform::is_exiting(invalid));
    CHECK_FALSE(custody::cuda::platform::is_exiting(std::runtime_error("not CUDA's")));

    custody::test::failure_log log;
    CHECK_FALSE(custody::run_exit_tolerant<custody::cuda::platform>("waiting", [&] { throw unloading; }));
    CHECK(log.lines().empty());
    CHECK_FALSE(custody::run_exit_tolerant<custody::cuda::platform>("waiting", [&] { throw invalid; }));
    REQUIRE(log.lines().size() == 1);
    CHECK_THAT(log.lines()[0], custody_test::contains("waiting failed: cudaErrorInvalidValue"));
    CHECK(custody::run_exit_tolerant<custody::cuda::platform>("waiting", [] {}));

    CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaErrorCudartUnloading); // a call that failed so
    CHECK(log.lines().size() == 1);
    CUSTODY_CUDA_ASSERT_NOEXCEPT(cudaErrorInvalidValue);
    REQUIRE(log.lines().size() == 2);
    CHECK_THAT(log.lines()[1], custody_test::contains("cudaErrorInvalidValue"));
}

#ifdef CUSTODY_WITH_NCCL
TEST_CASE("CUSTODY_NCCL_TRY throws nccl_error with the call", "[nccl][core]") {
    try {
        CUSTODY_NCCL_TRY(ncclCommCount(nullptr, nullptr));
        FAIL("ncclCommCount(nullptr, nullptr) succeeded");
    } catch (const custody::nccl_error& e) {
        CHECK(e.code() != 0);
        CHECK(e.call() == "ncclCommCount(nullptr, nullptr)");
        CHECK(std::string(e.what()).find(" from ncclCommCount(nullptr, nullptr) at ") != std::string::npos);
    }
}
#endif

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }

namespace {

// Stand-ins for cuDevicePrimaryCtxGetState.
CUresult CUDAAPI state_untouched(CUdevice, unsigned int*, int*) { return CUDA_SUCCESS; } // an inactive context, as a driver may answer it
CUresult CUDAAPI state_inactive(CUdevice, unsigned int* flags, int* active) {
    *flags = 0;
    *active = 0;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI state_active(CUdevice, unsigned int* flags, int* active) {
    *flags = 0;
    *active = 1;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI state_failing(CUdevice, unsigned int*, int*) { return CUDA_ERROR_INVALID_DEVICE; }

} // namespace

TEST_CASE("a primary context is active only when the driver says 1, as PyTorch reads it", "[cuda][platform]") {
    using custody::cuda::detail::primary_context_active;
    CHECK_FALSE(primary_context_active(0, &state_untouched)); // the state left as seeded: inactive
    CHECK_FALSE(primary_context_active(0, &state_inactive));
    CHECK(primary_context_active(0, &state_active));
    // The driver cannot tell: callers behave as without the query.
    CHECK(primary_context_active(0, &state_failing));
    CHECK(primary_context_active(0, nullptr));
}
