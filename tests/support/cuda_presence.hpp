// Whether a cuda test suite runs, is skipped (exit 77) or fails: the one rule every cuda test main
// follows, so that a GPU machine whose CUDA stack is broken never reports its suites as skipped.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

namespace custody_test {

enum class cuda_verdict { run, skip, fail };

struct cuda_presence {
    cuda_verdict verdict = cuda_verdict::fail;
    int devices = 0;     ///< devices the runtime reports (0 unless verdict == run)
    std::string message; ///< why, in one line
};

/// "13.0" for a CUDA version number such as 13000.
inline std::string cuda_version_text(int version) {
    return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

/// The verdict from what cudaGetDeviceCount (`count_status`, `count`) and cudaDriverGetVersion
/// (`driver_status`, `driver_version`) answered:
///   run   devices were counted;
///   skip  no device: cudaErrorNoDevice or a count of 0 (a driver and no GPU), or no driver at all
///         (the runtime answers cudaErrorInsufficientDriver when it finds no libcuda, and
///         cudaDriverGetVersion then reports version 0, as documented for "no driver installed");
///   fail  anything else, named: a driver older than the runtime (cudaErrorInsufficientDriver with a
///         driver version), a driver/library mismatch, devices busy or unavailable, ...
inline cuda_presence judge_cuda(cudaError_t count_status, int count, cudaError_t driver_status, int driver_version) {
    if (count_status == cudaSuccess) {
        if (count > 0) return {cuda_verdict::run, count, std::to_string(count) + " CUDA device(s)"};
        return {cuda_verdict::skip, 0, "no CUDA device"};
    }
    if (count_status == cudaErrorNoDevice) return {cuda_verdict::skip, 0, "no CUDA device (cudaErrorNoDevice)"};
    const std::string name = cudaGetErrorName(count_status);
    if (count_status == cudaErrorInsufficientDriver && driver_status == cudaSuccess) {
        if (driver_version == 0) return {cuda_verdict::skip, 0, "no CUDA driver installed (" + name + ", driver version 0)"};
        return {cuda_verdict::fail, 0,
                "cudaGetDeviceCount: " + name + ": the driver supports CUDA " + cuda_version_text(driver_version) +
                    ", the runtime is CUDA " + cuda_version_text(CUDART_VERSION) + "; update the driver"};
    }
    std::string message = "cudaGetDeviceCount: " + name + " (" + cudaGetErrorString(count_status) + ")";
    if (driver_status != cudaSuccess) message += "; cudaDriverGetVersion: " + std::string(cudaGetErrorName(driver_status));
    return {cuda_verdict::fail, 0, message};
}

/// judge_cuda over this machine's answers.
inline cuda_presence probe_cuda() {
    int count = 0;
    const cudaError_t count_status = cudaGetDeviceCount(&count);
    int driver = 0;
    const cudaError_t driver_status = cudaDriverGetVersion(&driver);
    static_cast<void>(cudaGetLastError());
    return judge_cuda(count_status, count, driver_status, driver);
}

/// For a cuda suite's main: prints the verdict for `suite` and returns the exit status to end with
/// (77 to skip, 1 to fail), or -1 when the suite should run.
inline int cuda_gate(const char* suite, const cuda_presence& presence = probe_cuda()) {
    switch (presence.verdict) {
    case cuda_verdict::run:
        return -1;
    case cuda_verdict::skip:
        std::printf("%s: %s; skipped\n", suite, presence.message.c_str());
        return 77;
    case cuda_verdict::fail:
        break;
    }
    std::fprintf(stderr, "%s: FAILED: %s\n", suite, presence.message.c_str());
    return 1;
}

} // namespace custody_test
