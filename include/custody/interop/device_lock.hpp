/// @file
/// `device_lock`: this process's claim on one GPU of its host, taken before any NCCL communicator
/// exists, so that a second rank on the same GPU fails at once with custody's error naming both
/// ranks (instead of NCCL's "Duplicate GPU detected" from inside ncclCommInitRank).
#pragma once

#include <custody/core/rank.hpp>
#include <custody/interop/bind_device.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace custody::interop {

/// Where and as whom a device_lock claims.
struct device_lock_options {
    /// The directory of the lock files, shared by every process of the host that may use its GPUs.
    /// Empty: $CUSTODY_RUNTIME_DIR if set, else /tmp/custody-<uid> (created 0700, and refused if
    /// another user owns it or others may write to it).
    std::string directory;
    /// The host named in messages; empty: gethostname().
    std::string host;
};

namespace detail {

/// One open, flock()ed lock file; closing it releases the claim. Invariant: fd_ >= 0 holds an
/// exclusive flock on `path_`, whose contents name the claiming rank and process.
class lock_file {
public:
    lock_file(int fd, std::string path, int rank) noexcept : fd_(fd), path_(std::move(path)), rank_(rank) {}
    lock_file(const lock_file&) = delete;
    lock_file& operator=(const lock_file&) = delete;
    ~lock_file() { ::close(fd_); }

    [[nodiscard]] const std::string& path() const noexcept { return path_; }
    [[nodiscard]] int rank() const noexcept { return rank_; }

private:
    int fd_;
    std::string path_;
    int rank_;
};

/// The claims this process holds, by lock file path: a second claim of one GPU by this process
/// (another communicator on the same device) shares the first. Guarded by its mutex.
struct lock_registry {
    std::mutex mutex;
    std::map<std::string, std::weak_ptr<lock_file>> held;
};

inline lock_registry& process_locks() {
    static lock_registry registry;
    return registry;
}

/// `id` as a file name: characters other than [A-Za-z0-9._-] become '_', so an identity can never
/// name another directory.
inline std::string lock_file_name(std::string_view id) {
    std::string name = "gpu-";
    for (const char c : id) {
        const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                          c == '_' || c == '.';
        name += safe ? c : '_';
    }
    return name + ".lock";
}

[[noreturn]] inline void throw_unusable(const std::string& what, const std::string& path, int error) {
    throw rank_error("custody: cannot claim the GPU: " + what + " " + path + ": " + std::strerror(error) +
                     "; set CUSTODY_RUNTIME_DIR to a directory every process of this host can lock files in");
}

/// Opens (creating it if needed) the lock directory, sets `dir` to its path and returns its
/// descriptor. The default directory must be ours and not writable by others (it lives in /tmp).
inline int open_lock_directory(const device_lock_options& options, std::string& dir) {
    dir = options.directory;
    bool ours = false;
    if (dir.empty()) {
        if (const char* env = std::getenv("CUSTODY_RUNTIME_DIR"); env != nullptr && *env != '\0') { // NOLINT
            dir = env;
        } else {
            dir = "/tmp/custody-" + std::to_string(::geteuid());
            ours = true;
            if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) throw_unusable("creating", dir, errno);
        }
    }
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) throw_unusable("opening the directory", dir, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int error = errno;
        ::close(fd);
        throw_unusable("reading", dir, error);
    }
    if (ours && (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0)) {
        ::close(fd);
        throw_unusable("using", dir, EPERM);
    }
    return fd;
}

/// The holder's "rank R pid P" from the lock file at `fd`; false when it is not (yet) readable or
/// names a process that no longer exists (stale text from an earlier holder).
inline bool read_holder(int fd, int& rank, long& pid) {
    char text[128] = {};
    const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
    if (n <= 0) return false;
    if (std::sscanf(text, "rank %d pid %ld", &rank, &pid) != 2) return false;
    return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

} // namespace detail

/// This process's claim on one GPU, identified by a name every process of the host agrees on (the
/// GPU's UUID on the cuda platform, whatever ordinal CUDA_VISIBLE_DEVICES gives it).
///
/// claim() takes an exclusive flock() on `<directory>/gpu-<id>.lock` and writes "rank R pid P host
/// H" into it. A second process claiming the same id fails at once with duplicate_device_error
/// naming the holder's rank first, then its own, and the holder's process id. The kernel releases
/// the lock when the last handle of the process is gone or the process ends, however it ends (no
/// stale lock after a crash). Claims by one process share one lock (a process may build several
/// communicators on its GPU); the lock names the rank of the first claim.
///
/// Scope: processes that see the same lock directory (one host, one user, one mount namespace;
/// containers must share the directory, CUSTODY_RUNTIME_DIR). Two ranks in one process on one GPU
/// are not caught here (NCCL refuses them). A process that forks keeps its claim in the child.
/// Ownership: move-only handle; the claim lasts while any handle of this process refers to it.
/// Thread safety: claim() is thread-safe; a handle is not shared between threads without a lock.
/// Complexity: claim() costs an open, an flock and a write (microseconds); a conflict waits up to
/// ~200 ms for the holder's text.
class device_lock {
public:
    /// No claim.
    device_lock() = default;

    /// Claims `device_id` for `rank`, which calls it device `device` (for the message). Throws
    /// duplicate_device_error when another process holds it, rank_error when the lock directory
    /// cannot be used. On a throw nothing is held.
    [[nodiscard]] static device_lock claim(std::string_view device_id, int rank, int device,
                                           const device_lock_options& options = {}) {
        auto& registry = detail::process_locks();
        std::string directory;
        const int dir = detail::open_lock_directory(options, directory);
        const std::string name = detail::lock_file_name(device_id);
        std::string path = directory + "/" + name;
        std::lock_guard guard(registry.mutex);
        for (auto it = registry.held.begin(); it != registry.held.end();) {
            it = it->second.expired() ? registry.held.erase(it) : std::next(it);
        }
        const int fd = ::openat(dir, name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        const int open_error = errno;
        ::close(dir);
        if (fd < 0) detail::throw_unusable("opening", path, open_error);
        // The identity of the file, not its spelling, says whether this process holds it already.
        struct stat st {};
        if (::fstat(fd, &st) != 0) {
            const int error = errno;
            ::close(fd);
            detail::throw_unusable("reading", path, error);
        }
        const std::string key = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
        if (auto it = registry.held.find(key); it != registry.held.end()) {
            ::close(fd);
            return device_lock(it->second.lock());
        }
        if (!try_lock(fd, path)) throw_held(fd, device_id, rank, device, options);
        const std::string host = options.host.empty() ? detail::this_host_name() : options.host;
        const std::string text = "rank " + std::to_string(rank) + " pid " + std::to_string(::getpid()) + " host " +
                                 host + "\n";
        if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
            const int error = errno;
            ::close(fd);
            detail::throw_unusable("writing", path, error);
        }
        auto file = std::make_shared<detail::lock_file>(fd, std::move(path), rank);
        registry.held[key] = file;
        return device_lock(std::move(file));
    }

    /// The lock file, empty without a claim.
    [[nodiscard]] std::string path() const { return file_ ? file_->path() : std::string(); }
    /// The rank that first claimed the GPU in this process; -1 without a claim.
    [[nodiscard]] int rank() const noexcept { return file_ ? file_->rank() : -1; }
    [[nodiscard]] bool holds() const noexcept { return file_ != nullptr; }

private:
    explicit device_lock(std::shared_ptr<detail::lock_file> file) noexcept : file_(std::move(file)) {}

    /// Takes the exclusive lock on `fd`; false when another process holds it. A claim of this
    /// process being released on another thread (its file not yet closed) is waited for, briefly.
    static bool try_lock(int fd, const std::string& path) {
        for (int attempt = 0;; ++attempt) {
            if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
            const int error = errno;
            if (error != EWOULDBLOCK) {
                ::close(fd);
                detail::throw_unusable("locking", path, error);
            }
            int rank = -1;
            long pid = -1;
            if (attempt == 40 || !detail::read_holder(fd, rank, pid) || pid != static_cast<long>(::getpid())) {
                return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }

    /// Another process holds `fd`'s lock: reads who (its text may lag the lock by microseconds),
    /// closes `fd` and throws.
    [[noreturn]] static void throw_held(int fd, std::string_view device_id, int rank, int device,
                                        const device_lock_options& options) {
        int holder_rank = -1;
        long holder_pid = -1;
        bool known = false;
        for (int attempt = 0; attempt < 40 && !(known = detail::read_holder(fd, holder_rank, holder_pid)); ++attempt) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        ::close(fd);
        const std::string host = options.host.empty() ? detail::this_host_name() : options.host;
        throw duplicate_device_error(known ? holder_rank : -1, rank, device, host, std::string(device_id),
                                     known ? "rank " + std::to_string(holder_rank) + " is process " +
                                                 std::to_string(holder_pid) + ", which holds the GPU"
                                           : "another process holds the GPU");
    }

    std::shared_ptr<detail::lock_file> file_;
};

} // namespace custody::interop
