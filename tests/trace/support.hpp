// Helpers the trace suite shares: traces built in memory, read back from memory, temporary files.
#pragma once

#include <custody/trace/event.hpp>
#include <custody/trace/reader.hpp>
#include <custody/trace/writer.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace custody_test {

/// A reader over bytes held in memory.
inline custody::trace::reader read_bytes(const std::string& bytes, const std::string& name = "memory") {
    return custody::trace::reader(std::make_unique<std::istringstream>(bytes), name);
}

/// Every event of a trace held in memory.
inline std::vector<custody::trace::event> all_events(const std::string& bytes) {
    auto r = read_bytes(bytes);
    std::vector<custody::trace::event> out;
    custody::trace::event e;
    while (r.next(e)) out.push_back(e);
    return out;
}

/// An allocation or deallocation event on device 0.
inline custody::trace::event make_event(custody::trace::event_kind kind, std::uint64_t address, std::uint64_t bytes,
                                        std::uint64_t stream = 0, std::int32_t device = 0) {
    custody::trace::event e;
    e.kind = kind;
    e.address = address;
    e.bytes = bytes;
    e.stream = stream;
    e.device = device;
    return e;
}

/// A complete trace of `events` (sequence numbers are assigned in order).
inline std::string trace_of(const std::vector<custody::trace::event>& events) {
    custody::trace::writer w;
    w.metadata("source", "test");
    for (const auto& e : events) w.write(e);
    w.finish();
    return w.take();
}

/// A directory of its own under the system's temporary directory, removed with its contents.
class temp_dir {
public:
    temp_dir() {
        std::string pattern = (std::filesystem::temp_directory_path() / "custody-trace-test-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
        path_ = pattern;
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

private:
    std::filesystem::path path_;
};

} // namespace custody_test
