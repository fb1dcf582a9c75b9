// debug/pytorch_snapshot.hpp and what it is made of: the pickle writer's bytes (as Python's
// pickle.dumps(..., protocol=2) writes them), the layout of blocks in segments, the history of a
// tracker over a pool whose upstream a segment_journal watches, and the file written beside a link.
#include <custody/debug/detail/pickle_writer.hpp>
#include <custody/debug/history.hpp>
#include <custody/debug/pytorch_snapshot.hpp>
#include <custody/debug/segment_journal.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/simulated_device_memory.hpp>

#include "../support/catch.hpp"
#include "../support/planted_links.hpp"

#include <atomic>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace custody;
using namespace custody::debug;

namespace {

std::string pickled(void (*write)(custody::debug::detail::pickle_writer&)) {
    std::string out;
    custody::debug::detail::pickle_writer w(out);
    w.begin();
    write(w);
    w.end();
    return out;
}

using journaled_pool = pool::stream_ordered_pool<segment_journal<host::simulated_device_memory>>;

tracking_options history_options(std::shared_ptr<allocation_history> history) {
    tracking_options o;
    o.canaries = false;
    o.poison = false;
    o.history = std::move(history);
    return o;
}

} // namespace

TEST_CASE("pickle: integers, strings, pairs and containers as Python's protocol 2 writes them", "[debug][snapshot]") {
    using namespace std::string_literals;
    CHECK(pickled([](auto& w) { w.integer(std::int64_t{7}); }) == "\x80\x02K\x07."s);
    CHECK(pickled([](auto& w) { w.integer(std::int64_t{300}); }) == "\x80\x02J\x2c\x01\x00\x00."s);
    CHECK(pickled([](auto& w) { w.integer(std::int64_t{-1}); }) == "\x80\x02J\xff\xff\xff\xff."s);
    // pickle.dumps(2**40, 2) == b'\x80\x02\x8a\x06\x00\x00\x00\x00\x00\x01.': the writer uses 8 bytes
    // (any LONG1 length reads back the same number).
    CHECK(pickled([](auto& w) { w.integer(std::int64_t{1} << 40); }) == "\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x01\x00\x00."s);
    // An address with the top bit set stays positive: a ninth, zero byte.
    CHECK(pickled([](auto& w) { w.integer(std::uint64_t{0xFFFFFFFFFFFFFFFF}); }) ==
          "\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."s);
    CHECK(pickled([](auto& w) { w.text("ab"); }) == "\x80\x02X\x02\x00\x00\x00" "ab."s);
    CHECK(pickled([](auto& w) { w.text("a\xff"); }) == "\x80\x02X\x04\x00\x00\x00" "a\xef\xbf\xbd."s); // U+FFFD
    CHECK(pickled([](auto& w) { w.pair(0, 3); }) == "\x80\x02K\x00K\x03\x86."s);
    CHECK(pickled([](auto& w) {
              w.begin_dict();
              w.key("k");
              w.begin_list();
              w.boolean(true);
              w.none();
              w.end_list();
              w.end_dict();
          }) == "\x80\x02}(X\x01\x00\x00\x00k](\x88Neu."s);
}

TEST_CASE("snapshot: blocks tile their segment, held ones are pending, strays get a segment of their own",
          "[debug][snapshot]") {
    device_memory_state d;
    d.device = 1;
    d.segments = {memory_segment{0x10000, 0x4000, 0, 0}};
    const owner_id kv = intern_owner("kv");
    d.blocks = {live_block{0x11000, 1000, 0x11000, 1000, kv, 1, 0, 0, {}},
                live_block{0x10000, 256, 0x10000, 256, nullptr, 1, 0, 0, {}},
                live_block{0x90000, 100, 0x90000, 100, kv, 1, 0, 0, {}}}; // in no segment
    d.pending_free = {0x10000};
    const pytorch_snapshot s = make_pytorch_snapshot({d});
    REQUIRE(s.segments.size() == 2);
    REQUIRE(s.device_traces.size() == 2); // devices 0 and 1
    const snapshot_segment* seg = nullptr;
    for (const auto& x : s.segments) {
        if (x.address == 0x10000) seg = &x;
    }
    REQUIRE(seg != nullptr);
    std::uintptr_t at = seg->address;
    for (const snapshot_block& b : seg->blocks) {
        CHECK(b.address == at);
        at += b.size;
    }
    CHECK(at == seg->address + seg->total_size);
    REQUIRE(seg->blocks.size() == 4); // pending, gap, kv (1000 B in 1024), the rest
    CHECK(seg->blocks[0].state == "active_pending_free");
    CHECK(seg->blocks[1].state == "inactive");
    CHECK(seg->blocks[2].state == "active_allocated");
    CHECK(seg->blocks[2].size == 1024);
    CHECK(seg->blocks[2].requested_size == 1000);
    REQUIRE_FALSE(seg->blocks[2].frames.empty());
    CHECK(seg->blocks[2].frames.back() == snapshot_frame{"<custody owner>", 0, "kv"});
    CHECK(seg->sum("active_allocated", true) == 1000);
}

TEST_CASE("snapshot: a device number no machine has is refused, not overflowed", "[debug][snapshot]") {
    for (const int device : {INT_MAX, max_snapshot_device + 1}) {
        device_memory_state d;
        d.device = device;
        CHECK_THROWS_AS(make_pytorch_snapshot({d}), std::invalid_argument);
    }
    device_memory_state last;
    last.device = max_snapshot_device;
    CHECK(make_pytorch_snapshot({last}).device_traces.size() == static_cast<std::size_t>(max_snapshot_device) + 1);
}

TEST_CASE("snapshot: a tracker over a journaled pool records allocations, frees and segments in order",
          "[debug][snapshot]") {
    auto history = std::make_shared<allocation_history>(100);
    tracking_resource<journaled_pool> t(history_options(history), pool::pool_options{}, history, 0,
                                        std::size_t{64} << 20);
    host::stream s;
    void* a = nullptr;
    {
        owner_scope scope("decode");
        a = t.allocate(s, 3000, 256);
    }
    void* b = t.allocate(s, 5 << 20, 256);
    t.deallocate(s, a, 3000, 256);
    CHECK_THROWS_AS(t.allocate(s, std::size_t{1} << 40, 256), out_of_memory);
    device_memory_state d;
    d.device = 0;
    d.segments = t.upstream().upstream().segments();
    d.blocks = t.live_blocks();
    d.history = history->events();
    const pytorch_snapshot snap = make_pytorch_snapshot({d});
    const auto& trace = snap.device_traces.at(0);
    std::vector<std::string> actions;
    for (const auto& e : trace) actions.emplace_back(to_string(e.action));
    // A block comes after the segment it lies in; a free is requested and completed at once; before
    // its out-of-memory the pool gave back the chunk the freed block left empty (its last resort).
    CHECK(actions == std::vector<std::string>{"segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested",
                                              "free_completed", "segment_free", "oom"});
    CHECK(trace[1].owner == "decode");
    CHECK(trace[1].size == 3000);
    CHECK(trace[7].size == std::size_t{1} << 40);
    for (std::size_t i = 1; i < trace.size(); ++i) CHECK(trace[i].time_us >= trace[i - 1].time_us);
    std::size_t reserved = 0;
    for (const auto& seg : snap.segments) reserved += seg.total_size;
    CHECK(reserved == t.upstream().statistics().reserved_bytes);
    t.deallocate(s, b, 5 << 20, 256);
    host::platform::synchronize(s);
    static_cast<void>(t.upstream().trim());
    CHECK(t.upstream().upstream().segments().empty());
    CHECK(history->events().back().action == history_action::segment_free);
}

TEST_CASE("snapshot: the history keeps its most recent events", "[debug][snapshot]") {
    allocation_history h(2);
    for (std::uintptr_t i = 1; i <= 3; ++i) h.record(history_event{history_action::alloc, i, 8, 0, 0, nullptr, {}});
    const auto kept = h.events();
    REQUIRE(kept.size() == 2);
    CHECK(kept[0].address == 2);
    CHECK(h.forgotten() == 1);
    h.set_capacity(0);
    h.record(history_event{});
    CHECK(h.events().empty());
}

TEST_CASE("snapshot: written to a new file renamed into place, never through a link", "[debug][snapshot]") {
    const auto dir = std::filesystem::temp_directory_path() / ("custody-snapshot-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const auto target = dir / "victim";
    std::ofstream(target) << "keep";
    const auto link = dir / "snap.pickle";
    std::filesystem::create_symlink(target, link);
    write_pytorch_snapshot(pytorch_snapshot{}, link.string());
    CHECK_FALSE(std::filesystem::is_symlink(link));
    std::ifstream kept(target);
    CHECK(std::string(std::istreambuf_iterator<char>(kept), {}) == "keep");
    std::ifstream written(link, std::ios::binary);
    const std::string data(std::istreambuf_iterator<char>(written), {});
    CHECK(data.substr(0, 2) == "\x80\x02");
    CHECK(data.back() == '.');
    CHECK_THROWS_AS(write_pytorch_snapshot(pytorch_snapshot{}, (dir / "no" / "such" / "dir").string()), custody::error);
    std::filesystem::remove_all(dir);
}

TEST_CASE("snapshot: a pipe, a planted temporary name and threads writing one path", "[debug][snapshot]") {
    const auto dir = std::filesystem::temp_directory_path() / ("custody-snapshot-hostile-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string expected = to_pickle(pytorch_snapshot{});

    // A named pipe with a reader is written through and stays a pipe (never replaced by a file).
    const std::string fifo = (dir / "pipe").string();
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC); // there before the writer
    REQUIRE(reader >= 0);
    write_pytorch_snapshot(pytorch_snapshot{}, fifo);
    std::string received(expected.size() + 1, '\0');
    const ::ssize_t got = ::read(reader, received.data(), received.size());
    ::close(reader);
    CHECK(received.substr(0, got > 0 ? static_cast<std::size_t>(got) : 0) == expected);
    struct stat st {};
    REQUIRE(::lstat(fifo.c_str(), &st) == 0);
    CHECK(S_ISFIFO(st.st_mode));

    // A name planted where a predictable temporary would go does not stop the writer.
    const std::string target = (dir / "snap.pickle").string();
    std::ofstream(target + ".partial-" + std::to_string(::getpid())) << "planted";
    write_pytorch_snapshot(pytorch_snapshot{}, target);
    CHECK(custody_test::file_text(target) == expected);

    // Threads writing one path all succeed, and the file is one whole snapshot.
    std::atomic<int> failures{0};
    std::vector<std::thread> writers;
    for (int t = 0; t < 8; ++t) {
        writers.emplace_back([&] {
            for (int i = 0; i < 12; ++i) {
                try {
                    write_pytorch_snapshot(pytorch_snapshot{}, target);
                } catch (const custody::error&) {
                    ++failures;
                }
            }
        });
    }
    for (std::thread& w : writers) w.join();
    CHECK(failures == 0);
    CHECK(custody_test::file_text(target) == expected);
    CHECK(custody_test::leftover_temporaries(dir) == 1); // the planted one alone
    std::filesystem::remove_all(dir);
}
