// The CUDA and NCCL check macros turn failing calls into typed errors. Runs on every machine with
// the toolkit, GPU or not: the calls below fail either way (no device, no driver, or a bad argument).
#define CATCH_CONFIG_RUNNER
#include "../support/catch.hpp"

#include <custody/core/error.hpp>
#include <custody/platform/cuda.hpp>

#include <cuda_runtime_api.h>
#ifdef CUSTODY_WITH_NCCL
#include <nccl.h>
#endif

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
