// The trace format: the writer and the reader agree on every field, the reader refuses every kind
// of malformed input with a typed error (and survives seeded random damage), and the CSV form is
// lossless.
#include "../support/catch.hpp"
#include "support.hpp"

#include <custody/trace/csv.hpp>
#include <custody/trace/detail/codec.hpp>
#include <custody/trace/reader.hpp>
#include <custody/trace/trace_error.hpp>
#include <custody/trace/writer.hpp>

#include <cstdint>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using custody::trace::event;
using custody::trace::event_kind;
using custody::trace::trace_error;
using custody_test::make_event;
using custody_test::read_bytes;
using custody_test::trace_of;

namespace {

/// Events that exercise every optional field and every delta direction.
std::vector<event> varied_events() {
    std::vector<event> v;
    event a = make_event(event_kind::allocate, 0x7f0000001000, 4096, 0x55aa00, 0);
    a.time_ns = 100;
    a.thread = 1;
    v.push_back(a);
    event b = make_event(event_kind::allocate, 0x1000, 1, 0, -1); // address goes down, no device
    b.time_ns = 50;                                                 // time steps back (another thread)
    b.thread = 2;
    b.alignment = 4096;
    b.owner = 1;
    v.push_back(b);
    event c = make_event(event_kind::deallocate, 0x7f0000001000, 4096, 0x55aa00, 0);
    c.time_ns = 1'000'000'000'000;
    c.thread = 1;
    c.owner = 2;
    v.push_back(c);
    event d = make_event(event_kind::allocation_failure, 0, UINT64_MAX, UINT64_MAX, 7);
    d.time_ns = INT64_MAX;
    d.alignment = 1;
    v.push_back(d);
    event r = make_event(event_kind::reference_reserve, 0, std::uint64_t{48} << 30, 0, 0);
    r.flags = custody::trace::flag_pre_trace;
    r.time_ns = INT64_MIN;
    v.push_back(r);
    event f = make_event(event_kind::reference_release, UINT64_MAX, 2 << 20, 0, 0);
    f.alignment = std::uint64_t{1} << 40;
    v.push_back(f);
    event g = make_event(event_kind::deallocate, 0x1000, 1, 0, -1);
    g.alignment = 4096;
    g.thread = 2;
    v.push_back(g);
    for (std::size_t i = 0; i < v.size(); ++i) v[i].sequence = i + 1;
    return v;
}

/// A writer with the tables varied_events() names, and the events written.
std::string varied_trace() {
    custody::trace::writer w;
    w.metadata("source", "test");
    w.metadata("odd, \"value\"", "line one\nline two");
    w.thread({1, 4242, "main"});
    w.thread({2, 4243, "worker, \"2\""});
    REQUIRE(w.owner("decoder/layer.3") == 1);
    REQUIRE(w.owner("kv,cache \"x\"\nsecond line") == 2);
    for (const auto& e : varied_events()) w.write(e);
    w.finish();
    return w.take();
}

/// The error a read of `bytes` to its end stops with; none when it succeeds.
std::optional<trace_error> error_of(const std::string& bytes) {
    try {
        auto r = read_bytes(bytes);
        event e;
        while (r.next(e)) {
        }
    } catch (const trace_error& e) {
        return e;
    }
    return std::nullopt;
}

/// The reason a read of `bytes` to its end fails with; fails the test if it succeeds.
trace_error::reason failure_of(const std::string& bytes) {
    const auto e = error_of(bytes);
    if (!e) FAIL("the trace was read without an error");
    return e->why();
}

std::string message_of(const std::string& bytes) {
    const auto e = error_of(bytes);
    return e ? e->what() : "no error";
}

/// The bytes of a trace whose records after the preamble are `records` (no end record added).
std::string raw(const std::string& records) {
    std::string s(custody::trace::detail::magic);
    custody::trace::detail::put_varint(s, 1);
    return s + records;
}

} // namespace

TEST_CASE("writer and reader agree on every field, table and metadata", "[trace][format]") {
    const std::string bytes = varied_trace();
    auto r = read_bytes(bytes);
    REQUIRE(r.header().metadata.size() == 2);
    CHECK(r.header().get("odd, \"value\"") == "line one\nline two");
    std::vector<event> read;
    event e;
    while (r.next(e)) read.push_back(e);
    CHECK(read == varied_events());
    REQUIRE(r.header().threads.size() == 2);
    CHECK(r.header().threads[1].os_id == 4243);
    CHECK(r.header().threads[1].name == "worker, \"2\"");
    CHECK(r.header().owners == std::vector<std::string>{"decoder/layer.3", "kv,cache \"x\"\nsecond line"});
    CHECK(r.events_read() == read.size());
    CHECK(r.offset() == bytes.size());
}

TEST_CASE("an event costs a few bytes", "[trace][format]") {
    std::vector<event> v;
    for (std::uint64_t i = 0; i < 1000; ++i) {
        v.push_back(make_event(event_kind::allocate, 0x7f0000000000 + i * 4096, 256 + i));
        v.back().time_ns = static_cast<std::int64_t>(i * 700);
    }
    const std::string bytes = trace_of(v);
    CHECK(bytes.size() < 1000 * 10);
    CHECK(custody_test::all_events(bytes).size() == 1000);
}

TEST_CASE("the writer refuses what the reader would reject, and writes nothing for it", "[trace][format]") {
    custody::trace::writer w;
    w.metadata("k", "v");
    const std::size_t before = w.buffer().size();
    event bad = make_event(event_kind::allocate, 0x1000, 8);
    bad.alignment = 24;
    CHECK_THROWS_AS(w.write(bad), std::invalid_argument);
    bad.alignment = 8;
    bad.thread = 1;
    CHECK_THROWS_AS(w.write(bad), std::invalid_argument); // undeclared thread
    bad.thread = 0;
    bad.owner = 1;
    CHECK_THROWS_AS(w.write(bad), std::invalid_argument); // undeclared owner
    bad.owner = 0;
    bad.flags = 0x80;
    CHECK_THROWS_AS(w.write(bad), std::invalid_argument);
    CHECK_THROWS_AS(w.thread({2, 0, ""}), std::invalid_argument); // out of order
    CHECK(w.buffer().size() == before);
    bad.flags = 0;
    w.write(bad);
    CHECK_THROWS_AS(w.metadata("late", "x"), std::invalid_argument);
    w.finish();
    CHECK_THROWS_AS(w.write(bad), std::invalid_argument);
}

TEST_CASE("the reader names each kind of malformed input", "[trace][format][errors]") {
    using reason = trace_error::reason;
    const std::string good = trace_of({make_event(event_kind::allocate, 0x1000, 64)});

    SECTION("empty, too short, wrong magic") {
        CHECK(failure_of("") == reason::not_a_trace);
        CHECK(failure_of("CUST") == reason::not_a_trace);
        CHECK(failure_of("Thread,Time,Action,Pointer,Size,Stream\n") == reason::not_a_trace);
        CHECK_THAT(message_of(""), custody_test::contains("the file is empty"));
    }
    SECTION("a version this reader does not know") {
        std::string s(custody::trace::detail::magic);
        custody::trace::detail::put_varint(s, 2);
        CHECK(failure_of(s) == reason::unsupported_version);
        CHECK_THAT(message_of(s), custody_test::contains("format version 2"));
    }
    SECTION("cut short anywhere after the magic") {
        for (std::size_t n = custody::trace::detail::magic.size(); n < good.size(); ++n) {
            CAPTURE(n);
            CHECK(failure_of(good.substr(0, n)) == reason::truncated);
        }
        CHECK_THAT(message_of(good.substr(0, good.size() - 2)), custody_test::contains("after 1 events"));
    }
    SECTION("an unknown record tag, with its offset") {
        const std::string s = raw("\x42");
        CHECK(failure_of(s) == reason::malformed);
        CHECK_THAT(message_of(s), custody_test::contains("unknown record tag 0x42"));
        CHECK_THAT(message_of(s), custody_test::contains("at byte 9"));
    }
    SECTION("a varint longer than 64 bits") {
        CHECK(failure_of(raw("\x7f\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")) == reason::malformed);
        CHECK(failure_of(raw("\x7f\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02")) == reason::malformed);
    }
    SECTION("a string over the 1 MiB limit is refused before anything is allocated") {
        std::string s = "\x01";
        custody::trace::detail::put_varint(s, std::uint64_t{1} << 62);
        CHECK(failure_of(raw(s)) == reason::malformed);
        CHECK_THAT(message_of(raw(s)), custody_test::contains("limit of 1 MiB"));
    }
    SECTION("tables out of order, undeclared references") {
        CHECK(failure_of(raw(std::string("\x02\x02\x00\x00", 4))) == reason::malformed); // thread 2 first
        CHECK(failure_of(raw(std::string("\x03\x05\x00", 3))) == reason::malformed);     // owner 5 first
        // An event naming owner 1 that was never declared.
        const std::string e = std::string("\x10\x10\x00\x40\x00\x01", 6);
        CHECK(failure_of(raw(e)) == reason::malformed);
        CHECK_THAT(message_of(raw(e)), custody_test::contains("(event 1)"));
        // An event naming thread 3.
        CHECK(failure_of(raw(std::string("\x10\x01\x00\x03\x40\x00", 6))) == reason::malformed);
    }
    SECTION("bad field values") {
        CHECK(failure_of(raw(std::string("\x10\x80\x00\x40\x00", 5))) == reason::malformed);     // unknown field bit
        CHECK(failure_of(raw(std::string("\x10\x08\x00\x40\x29\x00", 6))) == reason::malformed); // alignment 2^41
        CHECK(failure_of(raw(std::string("\x10\x20\x00\x40\x00\x02", 6))) == reason::malformed); // unknown flag
        CHECK(failure_of(raw(std::string("\x10\x04\x00\x03\x40\x00", 6))) == reason::malformed); // device -2
    }
    SECTION("metadata after the first event") {
        CHECK(failure_of(raw(std::string("\x10\x00\x00\x40\x00\x01\x01k\x01v\x7f\x01", 12))) == reason::malformed);
    }
    SECTION("an end record that miscounts, and data after it") {
        CHECK(failure_of(raw(std::string("\x10\x00\x00\x40\x00\x7f\x02", 7))) == reason::malformed);
        CHECK_THAT(message_of(raw(std::string("\x10\x00\x00\x40\x00\x7f\x02", 7))),
                   custody_test::contains("counts 2 events; the trace holds 1"));
        CHECK(failure_of(good + "x") == reason::malformed);
        CHECK_THAT(message_of(good + "x"), custody_test::contains("after the end record"));
    }
    SECTION("a bad record between events names the event it follows, one inside an event names that event") {
        const std::string between = raw(std::string("\x10\x00\x00\x40\x00\x00", 6)); // event 1, then tag 0x00
        CHECK(failure_of(between) == reason::malformed);
        CHECK_THAT(message_of(between), custody_test::contains("(after event 1)"));
        const std::string inside = raw(std::string("\x10\x00\x00\x40\x00\x10\x40", 7)); // event 2: bad bit
        CHECK_THAT(message_of(inside), custody_test::contains("(event 2)"));
    }
    SECTION("huge counts and indices are refused without sizing anything by them") {
        std::string end_count = "\x7f";
        custody::trace::detail::put_varint(end_count, ~std::uint64_t{0});
        CHECK(failure_of(raw(end_count)) == reason::malformed);
        CHECK_THAT(message_of(raw(end_count)), custody_test::contains("counts 18446744073709551615 events"));
        std::string thread = "\x02";
        custody::trace::detail::put_varint(thread, std::uint64_t{1} << 63);
        CHECK(failure_of(raw(thread)) == reason::malformed);
        std::string name = "\x03\x01";
        custody::trace::detail::put_varint(name, ~std::uint64_t{0});
        CHECK_THAT(message_of(raw(name)), custody_test::contains("limit of 1 MiB"));
        std::string stream = std::string("\x10\x02\x00", 3); // an event on stream 2^64 - 1
        custody::trace::detail::put_varint(stream, ~std::uint64_t{0});
        stream += std::string("\x40\x00\x7f\x00", 4);
        CHECK(failure_of(raw(stream)) == reason::malformed); // the end record counts 0 events, not 1
    }
    SECTION("a file that does not exist, a directory") {
        custody_test::temp_dir dir;
        try {
            custody::trace::reader r(dir.file("missing.ctrace"));
            FAIL("opened a missing file");
        } catch (const trace_error& e) {
            CHECK(e.why() == reason::cannot_open);
            CHECK_THAT(std::string(e.what()), custody_test::contains("missing.ctrace"));
        }
        CHECK_THROWS_AS(custody::trace::reader(dir.path().string()), trace_error);
    }
}

TEST_CASE("seeded random damage never crashes the reader: a typed error or a valid trace", "[trace][format][fuzz]") {
    const std::string good = varied_trace();
    std::mt19937_64 rng(20261123);
    int errors = 0, valid = 0;
    for (int round = 0; round < 4000; ++round) {
        std::string s = good;
        const int edits = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < edits; ++k) {
            const std::size_t at = rng() % s.size();
            switch (rng() % 5) {
            case 0: s[at] = static_cast<char>(rng()); break;                          // overwrite
            case 1: s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8))); break;     // flip a bit
            case 2: s.insert(at, 1, static_cast<char>(rng())); break;                 // insert
            case 3: if (s.size() > 1) s.erase(at, 1); break;                          // delete
            default: s.resize(at); break;                                             // cut
            }
            if (s.empty()) s = "C";
        }
        try {
            auto r = read_bytes(s);
            event e;
            while (r.next(e)) {
            }
            ++valid;
        } catch (const trace_error&) {
            ++errors;
        }
        // Any other exception (or a crash, caught by the sanitizer builds) fails the test.
    }
    CHECK(errors > 3000); // damage is almost always seen
    CHECK(errors + valid == 4000);
}

TEST_CASE("the CSV form is lossless", "[trace][csv]") {
    custody_test::temp_dir dir;
    const std::string path = dir.file("t.ctrace");
    {
        std::ofstream f(path, std::ios::binary);
        f << varied_trace();
    }
    std::ostringstream csv;
    custody::trace::write_csv(path, csv);
    CHECK_THAT(csv.str(), custody_test::contains(std::string(custody::trace::csv_columns)));
    CHECK_THAT(csv.str(), custody_test::contains("1,100,allocate,1,0x55aa00,0,4096,256,0x7f0000001000,,"));

    std::istringstream in(csv.str());
    custody::trace::csv_reader r(in, "t.csv");
    auto original = read_bytes(varied_trace());
    event a, b;
    std::size_t n = 0;
    while (original.next(a)) {
        REQUIRE(r.next(b));
        CHECK(a == b);
        ++n;
    }
    CHECK_FALSE(r.next(b));
    CHECK(n == varied_events().size());
    CHECK(r.header() == original.header());
}

TEST_CASE("the CSV reader names the line of each problem", "[trace][csv][errors]") {
    const std::string head = "# metadata,source,test\n" + std::string(custody::trace::csv_columns) + "\n";
    const auto line_of = [](const std::string& text) -> std::uint64_t {
        std::istringstream in(text);
        try {
            custody::trace::csv_reader r(in, "bad.csv");
            event e;
            while (r.next(e)) {
            }
        } catch (const custody::trace::csv_error& e) {
            return e.line();
        }
        return 0;
    };
    CHECK(line_of("sequence,time\n") == 1);                                            // not the header
    CHECK(line_of(head + "1,0,allocate,0,0x0,0,64,256,0x1000,,\n1,0,allocate,0,0x0,0,64,256,0x2000,,\n") == 4);
    CHECK(line_of(head + "1,0,allocate,0,0x0,0,64,256\n") == 3);                        // too few fields
    CHECK(line_of(head + "1,0,reserve,0,0x0,0,64,256,0x1000,,\n") == 3);                 // unknown action
    CHECK(line_of(head + "1,0,allocate,0,0x0,0,sixty,256,0x1000,,\n") == 3);             // not a number
    CHECK(line_of(head + "1,0,allocate,0,0x0,0,64,24,0x1000,,\n") == 3);                 // alignment
    CHECK(line_of(head + "1,0,allocate,0,12,0,64,256,0x1000,,\n") == 3);                 // stream not hex
    CHECK(line_of(head + "1,0,allocate,0,0x0,0,64,256,0x1000,kv,\n") == 3);              // undeclared owner
    CHECK(line_of(head + "1,0,allocate,2,0x0,0,64,256,0x1000,,\n") == 3);                // undeclared thread
    CHECK(line_of("# nonsense\n" + head) == 1);
    std::istringstream empty("");
    CHECK_THROWS_AS(custody::trace::csv_reader(empty, "empty.csv"), custody::trace::csv_error);
}
