// core/detail/output_file.hpp: every file custody writes is made new beside its name and renamed
// into place: links planted at the name or at temporary names are never written through, a file
// is either complete or as it was, and no temporary is left behind.
#include <custody/core/detail/output_file.hpp>
#include <custody/core/error.hpp>

#include "../support/catch.hpp"
#include "../support/planted_links.hpp"

#include <cstdlib>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>

namespace {

using custody::detail::output_file;
using custody::detail::write_file;
using namespace custody_test;

struct scratch {
    std::filesystem::path dir;
    scratch() {
        std::string pattern = (std::filesystem::temp_directory_path() / "custody-output-file-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
        dir = pattern;
    }
    scratch(const scratch&) = delete;
    scratch& operator=(const scratch&) = delete;
    ~scratch() {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
    }
    [[nodiscard]] std::string file(const std::string& name) const { return (dir / name).string(); }
};

} // namespace

TEST_CASE("a symbolic link at the name is replaced, never written through", "[core][output_file]") {
    scratch s;
    const std::string victim = make_victim(s.file("victim"));
    const std::string out = s.file("out.json");
    REQUIRE(plant_symlink(victim, out));
    write_file(out, "new text\n");
    CHECK(file_text(victim) == victim_text);
    CHECK(is_own_regular_file(out));
    CHECK(file_text(out) == "new text\n");
    CHECK(leftover_temporaries(s.dir) == 0);

    // A dangling link: nothing is created where it points.
    const std::string dangling = s.file("dangling");
    REQUIRE(plant_symlink(s.file("planted-target"), dangling));
    write_file(dangling, "x");
    CHECK_FALSE(std::filesystem::exists(s.file("planted-target")));
    CHECK(is_own_regular_file(dangling));
}

TEST_CASE("a hard link at the name keeps the other name's content", "[core][output_file]") {
    scratch s;
    const std::string victim = make_victim(s.file("victim"));
    const std::string out = s.file("out.json");
    REQUIRE(plant_hard_link(victim, out));
    write_file(out, "new text\n");
    CHECK(file_text(victim) == victim_text);
    CHECK(is_own_regular_file(out));
    CHECK(is_own_regular_file(victim));
}

TEST_CASE("links planted at temporary names are never opened", "[core][output_file]") {
    scratch s;
    const std::string victim = make_victim(s.file("victim"));
    const std::string out = s.file("trace.ctrace");
    REQUIRE(plant_symlink(victim, old_temporary_name(out)));
    REQUIRE(plant_symlink(victim, out + ".partial"));
    write_file(out, "trace bytes");
    CHECK(file_text(victim) == victim_text);
    CHECK(file_text(out) == "trace bytes");
    CHECK(leftover_temporaries(s.dir) == 0);
}

TEST_CASE("a file is complete under its name or the name is as it was", "[core][output_file]") {
    scratch s;
    const std::string out = s.file("report.json");
    write_file(out, "first\n");
    {
        output_file f(out);
        f.write("second, never committed");
        CHECK(file_text(out) == "first\n"); // nothing shows before commit()
        CHECK(leftover_temporaries(s.dir) == 1);
    }
    CHECK(file_text(out) == "first\n");
    CHECK(leftover_temporaries(s.dir) == 0);

    // publish(): the name now, the rest written through the same file (a growing trace).
    {
        output_file f(out);
        f.write("head ");
        f.publish();
        CHECK(file_text(out) == "head ");
        f.write("tail");
        f.commit();
    }
    CHECK(file_text(out) == "head tail");
    CHECK(leftover_temporaries(s.dir) == 0);

    // A directory that cannot take the file: custody::error naming the file, nothing left.
    CHECK_THROWS_WITH(write_file(s.file("no/such/dir/out"), "x"), contains("no/such/dir/out"));
    // Temporary names are fresh for each file.
    std::set<std::string> names;
    for (int i = 0; i < 8; ++i) {
        std::string temporary;
        const int fd = custody::detail::create_beside(out, temporary);
        REQUIRE(fd >= 0);
        ::close(fd);
        names.insert(temporary);
    }
    CHECK(names.size() == 8);
}

TEST_CASE("character devices and pipes are written in place, never replaced", "[core][output_file]") {
    scratch s;
    // A pipe with a reader: the writer's text arrives through it, and the pipe stays a pipe.
    const std::string fifo = s.file("pipe");
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    std::string received;
    std::thread reader([&] { received = file_text(fifo); });
    while (true) { // the writer must find the reader there (a pipe without one is refused at once)
        try {
            write_file(fifo, "through the pipe");
            break;
        } catch (const custody::error&) {
            std::this_thread::yield();
        }
    }
    reader.join();
    CHECK(received == "through the pipe");
    struct stat st {};
    REQUIRE(::lstat(fifo.c_str(), &st) == 0);
    CHECK(S_ISFIFO(st.st_mode));

    // A device node (a private copy of /dev/null, made only by root), directly and through a link of
    // this user: written through, and both stay what they were.
    const std::string null_device = s.file("null");
    if (!make_device_node(null_device, 3)) {
        WARN("not checked: making a device node needs root");
        return;
    }
    write_file(null_device, "discarded");
    REQUIRE(::lstat(null_device.c_str(), &st) == 0);
    CHECK(S_ISCHR(st.st_mode));
    const std::string ours = s.file("link-of-ours");
    REQUIRE(plant_symlink(null_device, ours));
    write_file(ours, "discarded");
    REQUIRE(::lstat(ours.c_str(), &st) == 0);
    CHECK(S_ISLNK(st.st_mode));
    // A link of another user to the device is never opened: replaced by a file of ours.
    const std::string theirs = s.file("link-of-theirs");
    REQUIRE(plant_symlink(null_device, theirs));
    REQUIRE(::lchown(theirs.c_str(), 65534, 65534) == 0);
    write_file(theirs, "a file now");
    CHECK(is_own_regular_file(theirs));
    REQUIRE(::lstat(null_device.c_str(), &st) == 0);
    CHECK(S_ISCHR(st.st_mode));
    // A full device refuses the write: custody::error, and it stays a device.
    const std::string full_device = s.file("full");
    REQUIRE(make_device_node(full_device, 7));
    CHECK_THROWS_AS(write_file(full_device, "no room"), custody::error);
    REQUIRE(::lstat(full_device.c_str(), &st) == 0);
    CHECK(S_ISCHR(st.st_mode));
    // A directory is refused by name.
    CHECK_THROWS_WITH(write_file(s.dir.string(), "x"), contains("directory"));
}
