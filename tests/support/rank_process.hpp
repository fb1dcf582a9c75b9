// What the tests that run ranks as processes of their own share: a temporary directory, and the
// exit protocol of a rank worker (0 done, 3 custody's duplicate-device error, 4 any other error,
// the message on standard output).
#pragma once

#include <custody/interop/bind_device.hpp>

#include <stdlib.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>

namespace custody_test {

/// A fresh directory under the system's temporary directory, removed with its contents. `path` is
/// empty when it could not be made.
struct temp_dir {
    std::filesystem::path path;
    explicit temp_dir(const char* prefix = "custody-test") {
        std::string templ = (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
        if (::mkdtemp(templ.data()) != nullptr) path = templ;
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    ~temp_dir() {
        std::error_code ignored;
        if (!path.empty()) std::filesystem::remove_all(path, ignored);
    }
};

/// Runs a rank worker's `body` (returns its exit status) under the exit protocol above.
template <class Body>
int run_rank_worker(Body&& body) {
    try {
        return body();
    } catch (const custody::interop::duplicate_device_error& e) {
        std::printf("%s\n", e.what());
        return 3;
    } catch (const std::exception& e) {
        std::printf("%s\n", e.what());
        return 4;
    }
}

} // namespace custody_test
