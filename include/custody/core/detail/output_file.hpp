/// @file
/// Writing a file the way every custody writer does (tools, reports, traces): all of it or none of
/// it, and never through a link someone planted. `output_file` creates a new file beside the target
/// (exclusively, without following links) and renames it into place; `write_file` is the one-call
/// form. Character devices and pipes (/dev/null, /dev/stdout) are written in place.
#pragma once

#include <custody/core/error.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace custody::detail {

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

/// 64 bits no other process can guess: names of temporary files are not predictable, so nobody
/// can plant them in advance (the exclusive creation refuses a planted name anyway; this keeps
/// such a plant from even delaying the writer).
inline std::uint64_t unpredictable_bits() noexcept {
    static std::atomic<std::uint64_t> counter{0};
    std::uint64_t bits = counter.fetch_add(1, std::memory_order_relaxed) * 0x9E3779B97F4A7C15ULL;
    bits ^= static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    try {
        std::random_device device;
        bits ^= (static_cast<std::uint64_t>(device()) << 32) ^ device();
    } catch (...) { // no entropy source: the clock and the counter still make the name unique
    }
    return bits;
}

/// Creates a new, empty file named `<path>.partial-<pid>-<random>` in `path`'s directory and
/// returns its descriptor, setting `temporary` to its name. O_CREAT | O_EXCL | O_NOFOLLOW: an
/// existing name, link or not, is never opened (another name is tried). Mode 0644 less the umask.
/// Throws custody::error naming `path` when the directory cannot take a new file.
inline int create_beside(const std::string& path, std::string& temporary) {
    for (int attempt = 0; attempt < 64; ++attempt) {
        char suffix[48];
        std::snprintf(suffix, sizeof suffix, ".partial-%ld-%016llx", static_cast<long>(::getpid()),
                      static_cast<unsigned long long>(unpredictable_bits()));
        temporary = path + suffix;
        const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) return fd;
        if (errno != EEXIST && errno != EINTR) break;
    }
    throw error("cannot write '" + path + "': " + std::strerror(errno));
}

/// `path` opened for writing when it names a character device or a pipe (/dev/null, a terminal, a
/// named pipe, /dev/stdout): directly, or through a symbolic link of this user or root; -1 when the
/// name is to be given a new file instead (nothing there, a regular file, a link to anything else,
/// and any link or node of another user, which is never opened). Throws custody::error for a
/// directory and the kinds that are neither. The descriptor's kind is checked after opening, so a
/// name swapped in between is never written through.
inline int open_device_or_pipe(const std::string& path) {
    struct stat name {};
    if (::lstat(path.c_str(), &name) != 0 || S_ISREG(name.st_mode)) return -1;
    if (S_ISDIR(name.st_mode)) throw error("cannot write '" + path + "': it is a directory");
    if (name.st_uid != ::geteuid() && name.st_uid != 0) return -1; // planted by another user: replaced
    const bool link = S_ISLNK(name.st_mode);
    // O_NONBLOCK: a pipe without a reader fails at once instead of hanging (cleared below).
    const int fd = ::open(path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC | O_NONBLOCK | (link ? 0 : O_NOFOLLOW));
    if (fd < 0) {
        if (link && errno == ENOENT) return -1; // a dangling link: replaced
        throw error("cannot write '" + path + "': " + std::strerror(errno));
    }
    struct stat opened {};
    if (::fstat(fd, &opened) == 0 && (S_ISCHR(opened.st_mode) || S_ISFIFO(opened.st_mode))) {
        const int flags = ::fcntl(fd, F_GETFL);
        if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        return fd;
    }
    ::close(fd);
    if (link) return -1; // a link to a regular file (or anything else): replaced, never written through
    throw error("cannot write '" + path + "': not a regular file, a character device or a pipe");
}

/// A file that appears under its name only when complete and that never writes through a link:
/// created new beside `path` (create_beside), renamed to `path` by commit() (or earlier by
/// publish()), removed by the destructor if it was never renamed. rename() replaces whatever has
/// the name (a planted symbolic link, a hard link to someone's file) without touching what it
/// points to. "-" is standard output; a character device or a pipe (open_device_or_pipe: /dev/null,
/// /dev/stdout, a named pipe) is written directly, as it cannot be replaced by a file.
///
/// Thread safety: none. Ownership: owns the descriptor and the temporary file.
class output_file {
public:
    explicit output_file(std::string path) : path_(std::move(path)) {
        if (path_ == "-") {
            fd_ = STDOUT_FILENO;
            published_ = true;
            return;
        }
        if ((fd_ = open_device_or_pipe(path_)) >= 0) {
            published_ = true; // written in place: nothing to rename or remove
            return;
        }
        fd_ = create_beside(path_, temporary_);
    }
    output_file(const output_file&) = delete;
    output_file& operator=(const output_file&) = delete;
    ~output_file() {
        if (path_ == "-") return;
        if (fd_ >= 0) ::close(fd_);
        if (!published_) ::unlink(temporary_.c_str());
    }

    void write(std::string_view data) {
        if (!write_all(fd_, data)) throw error("cannot write '" + path_ + "': " + std::strerror(errno));
    }

    /// Gives the file its name now and goes on writing it: for a file that must be readable while
    /// it grows (a trace a crashed program leaves behind).
    void publish() {
        if (published_) return;
        if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
            throw error("cannot rename '" + temporary_ + "' to '" + path_ + "': " + std::strerror(errno));
        }
        published_ = true;
    }

    /// Closes the file and gives it its name (if publish() has not).
    void commit() {
        if (path_ == "-") return;
        const int fd = std::exchange(fd_, -1);
        if (fd >= 0 && ::close(fd) != 0) throw error("cannot write '" + path_ + "': " + std::strerror(errno));
        publish();
    }

    [[nodiscard]] int descriptor() const noexcept { return fd_; }
    [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
    std::string path_;
    std::string temporary_;
    int fd_ = -1;
    bool published_ = false;
};

/// Writes `text` to `path` as output_file does: the whole text under the name, or nothing new.
/// Throws custody::error naming the file.
inline void write_file(const std::string& path, std::string_view text) {
    output_file out(path);
    out.write(text);
    out.commit();
}

} // namespace custody::detail
