// Links planted where a writer writes, as another user of a shared directory would plant them,
// and the checks that the writer went around them: what a link points to is left as it was, and
// the name ends up a regular file of its own.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace custody_test {

inline constexpr const char* victim_text = "someone else's file\n";

/// Writes victim_text to `path` and returns the path.
inline std::string make_victim(const std::string& path) {
    std::ofstream(path, std::ios::binary) << victim_text;
    return path;
}

inline std::string file_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A symbolic link at `at` to `target`, and a hard link at `hard_at` to `hard_target` (same file
/// system). Return false when the link cannot be made.
inline bool plant_symlink(const std::string& target, const std::string& at) { return ::symlink(target.c_str(), at.c_str()) == 0; }
inline bool plant_hard_link(const std::string& target, const std::string& at) { return ::link(target.c_str(), at.c_str()) == 0; }

/// `path` is a regular file with one name (not a link, not sharing its inode).
inline bool is_own_regular_file(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1;
}

/// A character device like /dev/null (1, 3) or /dev/full (1, 7) at `at`, made here so that a test
/// never risks the system's own /dev; false when this process may not make device nodes (not root).
inline bool make_device_node(const std::string& at, unsigned minor) {
    return ::mknod(at.c_str(), S_IFCHR | 0666, ::makedev(1, minor)) == 0;
}

/// The temporary name writers used before they were made safe: `<path>.partial-<pid>`.
inline std::string old_temporary_name(const std::string& path) { return path + ".partial-" + std::to_string(::getpid()); }

/// Files in `dir` whose name holds ".partial-" and that are not links (temporaries left behind).
inline int leftover_temporaries(const std::filesystem::path& dir) {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().filename().string().find(".partial-") != std::string::npos && !entry.is_symlink()) ++n;
    }
    return n;
}

} // namespace custody_test
