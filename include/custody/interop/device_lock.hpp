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
/// exclusive flock on `path_`, whose contents name the claiming rank and process; fd_ == -1 once
/// the descriptor was closed or handed to a new claim (adopt()).
class lock_file {
public:
    lock_file(int fd, std::string path, std::string key, int rank) noexcept
        : fd_(fd), path_(std::move(path)), key_(std::move(key)), rank_(rank) {}
    lock_file(const lock_file&) = delete;
    lock_file& operator=(const lock_file&) = delete;
    ~lock_file() { close(); }

    [[nodiscard]] const std::string& path() const noexcept { return path_; }
    [[nodiscard]] const std::string& key() const noexcept { return key_; }
    [[nodiscard]] int rank() const noexcept { return rank_; }
    /// Gives up the descriptor, lock included, to the caller (a new claim of the same file).
    [[nodiscard]] int adopt() noexcept { return std::exchange(fd_, -1); }
    void close() noexcept {
        if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    }

private:
    int fd_;
    std::string path_;
    std::string key_;
    int rank_;
};

/// The claims this process holds, by the lock file's identity (device:inode): a second claim of
/// one GPU by this process (another communicator on the same device) shares the first.
///
/// Invariant (under mutex): a lock file of this process holds its flock only while `held` names
/// it; `raw` is the object `file` watches, alive until its deleter (release_claim) has run, which
/// takes the mutex. So under the mutex an entry is either alive (file.lock() shares it) or being
/// released with its descriptor still open (its flock is taken over by the next claim: adopt()).
struct lock_registry {
    struct entry {
        std::weak_ptr<lock_file> file;
        lock_file* raw;
    };
    std::recursive_mutex mutex; ///< recursive: a claim that fails under it releases its own file
    std::map<std::string, entry> held;
};

/// Never destroyed: a claim may be released by a static object's destructor at exit.
inline lock_registry& process_locks() {
    static auto* registry = new lock_registry;
    return *registry;
}

/// The deleter of a claim's last handle: forgets the claim and closes its file, under the
/// registry's mutex (a claim never finds the lock held by this process and not in the registry).
inline void release_claim(lock_file* file) noexcept {
    {
        auto& registry = process_locks();
        std::lock_guard guard(registry.mutex);
        if (auto it = registry.held.find(file->key()); it != registry.held.end() && it->second.raw == file) {
            registry.held.erase(it);
        }
        file->close();
    }
    delete file;
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

/// Why the lock file at `st` is not one this process may lock and rewrite, or "" when it is: a
/// regular file of this user with one name. Another user's file, or a hard link to a file of ours
/// elsewhere (planted in a shared directory), would be truncated and rewritten by the claim.
inline std::string foreign_lock_file(const struct stat& st) {
    if (!S_ISREG(st.st_mode)) return "is not a regular file";
    if (st.st_uid != ::geteuid()) return "belongs to user " + std::to_string(st.st_uid) + ", not to this process's";
    if (st.st_nlink != 1) return "has " + std::to_string(st.st_nlink) + " names (a hard link to another file)";
    return {};
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
/// communicators on its GPU); the lock names the rank of the first claim. A claim returned always
/// holds the lock, whatever other threads claim and release meanwhile. The lock file is opened
/// without following links and must be a regular file of this user with one name: a symbolic link,
/// a hard link or another user's file planted under its name is refused (rank_error), never
/// truncated or rewritten.
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
        const std::string host = options.host.empty() ? detail::this_host_name() : options.host;
        std::lock_guard guard(registry.mutex);
        int fd = ::openat(dir, name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
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
        if (const std::string why = detail::foreign_lock_file(st); !why.empty()) {
            ::close(fd);
            throw rank_error("custody: cannot claim the GPU: the lock file " + path + " " + why +
                             "; remove it, or set CUSTODY_RUNTIME_DIR to a directory of your own");
        }
        const std::string key = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
        if (auto it = registry.held.find(key); it != registry.held.end()) {
            if (auto shared = it->second.file.lock()) {
                ::close(fd);
                return device_lock(std::move(shared));
            }
            // Its last handle is being released on another thread, its flock still held: this
            // claim takes the descriptor over (a new claim, with this rank's text).
            ::close(fd);
            fd = it->second.raw->adopt();
            registry.held.erase(it);
        } else if (!try_lock(fd, path)) {
            throw_held(fd, device_id, rank, device, options);
        }
        const std::string text = "rank " + std::to_string(rank) + " pid " + std::to_string(::getpid()) + " host " +
                                 host + "\n";
        if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
            const int error = errno;
            ::close(fd);
            detail::throw_unusable("writing", path, error);
        }
        detail::lock_file* raw = nullptr;
        try {
            raw = new detail::lock_file(fd, std::move(path), key, rank);
        } catch (...) {
            ::close(fd);
            throw;
        }
        // Should either step throw, the deleter closes the file (the mutex is recursive for it).
        std::shared_ptr<detail::lock_file> file(raw, &detail::release_claim);
        registry.held.emplace(key, detail::lock_registry::entry{file, raw});
        return device_lock(std::move(file));
    }

    /// The lock file, empty without a claim.
    [[nodiscard]] std::string path() const { return file_ ? file_->path() : std::string(); }
    /// The rank that first claimed the GPU in this process; -1 without a claim.
    [[nodiscard]] int rank() const noexcept { return file_ ? file_->rank() : -1; }
    [[nodiscard]] bool holds() const noexcept { return file_ != nullptr; }

private:
    explicit device_lock(std::shared_ptr<detail::lock_file> file) noexcept : file_(std::move(file)) {}

    /// Takes the exclusive lock on `fd`; false when another process holds it (this process's own
    /// claims are in the registry, which the caller looked at first).
    static bool try_lock(int fd, const std::string& path) {
        if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
        const int error = errno;
        if (error != EWOULDBLOCK) {
            ::close(fd);
            detail::throw_unusable("locking", path, error);
        }
        return false;
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
