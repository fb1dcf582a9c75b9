// A libFuzzer target for what reads untrusted trace files: the binary trace reader, its CSV form's
// reader and the replay compiler (tools/replay/program.hpp). The input is read as a binary trace
// and, separately, as CSV text.
//
// Besides crashes, undefined behaviour, leaks and runaway memory (the sanitizers, -rss_limit_mb),
// it checks properties:
//  - the binary reader either reads the whole trace or throws trace_error; the events it accepted
//    before an error stay numbered 1, 2, ... and the error names the event after them;
//  - a trace the reader accepts writes (trace::writer) to bytes that read back to the same header
//    and events, and to CSV that reads back to the same header and events (the CSV is lossless);
//  - compiling an accepted trace for replay either succeeds or throws program_error, and a
//    compiled program's counts agree with the trace;
//  - the CSV reader either reads every line or throws csv_error naming a line it has read.
#include "../../tools/replay/program.hpp"

#include <custody/core/detail/output_file.hpp>
#include <custody/trace/csv.hpp>
#include <custody/trace/reader.hpp>
#include <custody/trace/trace_error.hpp>
#include <custody/trace/writer.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

namespace {

namespace trace = custody::trace;

[[noreturn]] void broken(const char* what, std::string_view detail = {}) {
    std::fprintf(stderr, "trace_fuzz: %s\n%.*s\n", what, static_cast<int>(std::min<std::size_t>(detail.size(), 2000)),
                 detail.data());
    std::abort();
}

struct read_result {
    trace::trace_header header;
    std::vector<trace::event> events;
};

std::unique_ptr<std::istream> stream_of(std::string_view bytes) {
    return std::make_unique<std::istringstream>(std::string(bytes), std::ios::binary);
}

/// Reads `bytes` as a binary trace; false when the reader refuses it (after checking the error).
bool read_binary(std::string_view bytes, read_result& out) {
    std::uint64_t accepted = 0;
    try {
        trace::reader r(stream_of(bytes), "fuzz.ctrace");
        trace::event e;
        while (r.next(e)) {
            if (e.sequence != accepted + 1) broken("an event out of sequence");
            if (e.thread > r.header().threads.size()) broken("an event names an undeclared thread");
            if (e.owner > r.header().owners.size()) broken("an event names an undeclared owner");
            if (e.alignment == 0 || (e.alignment & (e.alignment - 1)) != 0) broken("an alignment that is not a power of two");
            ++accepted;
            out.events.push_back(e);
        }
        out.header = r.header();
        return true;
    } catch (const trace::trace_error& e) {
        const std::uint64_t named = e.event() + (e.after_event() ? 1 : 0);
        if (e.event() != 0 && named != accepted + 1) broken("the error names another event than the next", e.what());
        if (e.offset() > bytes.size()) broken("the error names an offset past the input", e.what());
        return false;
    }
}

/// A file of this process's own for write_csv to read (it takes a path): in a directory made for
/// the process (mkdtemp), written by the writer every custody file goes through, removed at exit.
const std::string& scratch_file() {
    struct scratch {
        std::string dir;
        std::string file;
        scratch() {
            std::string pattern = "/tmp/custody-trace-fuzz-XXXXXX";
            if (::mkdtemp(pattern.data()) == nullptr) broken("cannot make a scratch directory");
            dir = pattern;
            file = dir + "/trace";
        }
        ~scratch() {
            ::unlink(file.c_str());
            ::rmdir(dir.c_str());
        }
    };
    static const scratch s;
    return s.file;
}

std::string rewritten(const read_result& t) {
    trace::writer w;
    for (const auto& [k, v] : t.header.metadata) w.metadata(k, v);
    for (const auto& th : t.header.threads) w.thread(th);
    for (const auto& o : t.header.owners) static_cast<void>(w.owner(o));
    for (const auto& e : t.events) static_cast<void>(w.write(e));
    w.finish();
    return w.take();
}

void check_round_trips(const read_result& t) {
    std::string bytes;
    try {
        bytes = rewritten(t);
    } catch (const std::exception& e) {
        broken("the writer refused what the reader accepted", e.what());
    }
    read_result again;
    if (!read_binary(bytes, again)) broken("the reader refused what the writer wrote");
    if (again.header != t.header || again.events != t.events) broken("a trace changed through writing and reading");

    // The CSV form, written from the rewritten trace, reads back to the same tables and events.
    // Owners with the same name are one owner in the CSV form: compare only traces without them.
    std::vector<std::string> owners = t.header.owners;
    std::sort(owners.begin(), owners.end());
    if (std::adjacent_find(owners.begin(), owners.end()) != owners.end()) return;
    const std::string& path = scratch_file();
    custody::detail::write_file(path, bytes);
    std::string csv;
    trace::write_csv(path, [&csv](std::string_view text) { csv.append(text); });
    std::istringstream in(csv);
    try {
        trace::csv_reader r(in, "fuzz.csv");
        std::vector<trace::event> events;
        trace::event e;
        while (r.next(e)) events.push_back(e);
        if (r.header() != t.header || events != t.events) broken("a trace changed through its CSV form", csv);
    } catch (const trace::csv_error& e) {
        broken("the CSV reader refused what write_csv wrote", std::string(e.what()) + "\n" + csv);
    }
}

void check_compile(std::string_view bytes, const read_result& t) {
    try {
        trace::reader r(stream_of(bytes), "fuzz.ctrace");
        const auto p = custody::replay::compile(r);
        std::uint64_t ops = 0;
        for (const auto& d : p.devices) {
            ops += d.ops.size();
            if (d.ops.size() != d.allocations + d.deallocations) broken("a device's ops are not its allocations and frees");
            if (d.sequence.size() != d.ops.size()) broken("an op without its event");
        }
        if (p.events != t.events.size() || ops > t.events.size()) broken("the program counts other events than the trace");
    } catch (const custody::replay::program_error& e) {
        if (e.sequence() == 0 || e.sequence() > t.events.size()) broken("a program error names no event of the trace", e.what());
    }
}

void check_csv(std::string_view text) {
    std::istringstream in{std::string(text)};
    std::uint64_t lines_read = 0;
    try {
        trace::csv_reader r(in, "fuzz.csv");
        trace::event e;
        std::uint64_t n = 0;
        while (r.next(e)) {
            if (e.sequence != ++n) broken("a CSV event out of sequence");
            lines_read = r.line();
        }
    } catch (const trace::csv_error& e) {
        if (e.line() < lines_read) broken("the CSV error names a line before the last one read", e.what());
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    if (read_result t; read_binary(input, t)) {
        check_round_trips(t);
        check_compile(input, t);
    }
    check_csv(input);
    return 0;
}
