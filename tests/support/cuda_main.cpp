// The Catch2 main of the cuda suite: one program holds the cases that need a device
// (tests/cuda/meson.build), and each meson test runs the cases of some of its files, selected by the
// files' names as tags ("-# [#pool_cuda_test]"). Where the CUDA stack is broken the program fails,
// naming the error (tests/support/cuda_presence.hpp), so a GPU machine never reports its suites as
// skipped. With a device every selected case runs. Without one (no GPU, or no driver), only the
// selected cases tagged [no_gpu_too] run (compile-time proofs, host memory through the adaptors),
// and the program exits 77 (skipped) unless one of them failed.
#define CATCH_CONFIG_RUNNER
#include "catch.hpp"

#include "cuda_presence.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace {

/// `specs` (Catch2's test specs, each alternatives joined by ',') with `tag` required in every
/// alternative: "[#a],[#b]" becomes "[#a][no_gpu_too],[#b][no_gpu_too]".
std::vector<std::string> requiring(const std::vector<std::string>& specs, const std::string& tag) {
    if (specs.empty()) return {tag};
    std::vector<std::string> out;
    for (const std::string& spec : specs) {
        std::string s;
        for (std::size_t i = 0; i < spec.size(); ++i) {
            if (spec[i] == '\\' && i + 1 < spec.size()) {
                s += spec.substr(i++, 2);
            } else if (spec[i] == ',') {
                s += tag + ',';
            } else {
                s += spec[i];
            }
        }
        out.push_back(s + tag);
    }
    return out;
}

} // namespace

int main(int argc, char* argv[]) {
    Catch::Session session;
    if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
    const std::string suite = "custody cuda suite" + (argc > 1 ? " (" + std::string(argv[argc - 1]) + ")" : std::string());
    const auto presence = custody_test::probe_cuda();
    if (presence.verdict != custody_test::cuda_verdict::skip) {
        if (const int status = custody_test::cuda_gate(suite.c_str(), presence); status >= 0) return status;
        return session.run();
    }
    session.configData().testsOrTags = requiring(session.configData().testsOrTags, "[no_gpu_too]");
#if CATCH_VERSION_MAJOR >= 3
    session.configData().allowZeroTests = true; // a selection may have no such case
#endif
    session.useConfigData(session.configData());
    if (const int failed = session.run(); failed != 0) return failed;
    return custody_test::cuda_gate(suite.c_str(), presence); // 77, saying why
}
