/// @file
/// Writing files the way custody's tools promise: all of the file or none of it. `output_file`
/// writes to a temporary name beside the target and renames it into place on commit().
#pragma once

#include <custody/core/error.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

namespace custody::trace::detail {

/// Writes all of `data` to `fd`, retrying partial writes and interrupted calls; false (errno set)
/// on failure.
inline bool write_all(int fd, std::string_view data) noexcept {
    while (!data.empty()) {
        const ::ssize_t n = ::write(fd, data.data(), data.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
}

/// A file that appears under its name only when complete: created as `<path>.partial-<pid>`,
/// renamed to `path` by commit(), removed by the destructor if commit() was never reached (an
/// error, an exception). "-" is standard output, written directly.
/// Thread safety: none. Ownership: owns the descriptor and the temporary file.
class output_file {
public:
    explicit output_file(std::string path) : path_(std::move(path)) {
        if (path_ == "-") {
            fd_ = STDOUT_FILENO;
            return;
        }
        temporary_ = path_ + ".partial-" + std::to_string(::getpid());
        fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) throw error("cannot write '" + path_ + "': " + std::strerror(errno));
    }
    output_file(const output_file&) = delete;
    output_file& operator=(const output_file&) = delete;
    ~output_file() {
        if (path_ == "-" || committed_) return;
        if (fd_ >= 0) ::close(fd_);
        ::unlink(temporary_.c_str());
    }

    void write(std::string_view data) {
        if (!write_all(fd_, data)) throw error("cannot write '" + path_ + "': " + std::strerror(errno));
    }

    /// Closes the file and gives it its name.
    void commit() {
        if (path_ == "-") {
            committed_ = true;
            return;
        }
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) throw error("cannot write '" + path_ + "': " + std::strerror(errno));
        if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
            throw error("cannot rename '" + temporary_ + "' to '" + path_ + "': " + std::strerror(errno));
        }
        committed_ = true;
    }

    [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
    std::string path_;
    std::string temporary_;
    int fd_ = -1;
    bool committed_ = false;
};

} // namespace custody::trace::detail
