// The recorder and the recording adaptor: lossless and in order under 8 threads, bounded buffers,
// batched writes, flush, owners, failures, file names, and the round trip (record a program's
// allocations, replay them, get the same peak live and event count).
#include "../support/catch.hpp"
#include "../support/planted_links.hpp"
#include "support.hpp"

#include "replay/address_space.hpp"
#include "replay/allocators.hpp"
#include "replay/program.hpp"
#include "replay/replay.hpp"
#include "replay/streams.hpp"

#include <custody/core/rank.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/trace/reader.hpp>
#include <custody/trace/recorder.hpp>
#include <custody/trace/recording_resource.hpp>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

using custody::trace::event;
using custody::trace::event_kind;
using custody::trace::recorder;
using custody::trace::recorder_options;
using custody::trace::recording_resource;

namespace {

recorder_options options_for(const std::string& path) {
    recorder_options o;
    o.path = path;
    o.rank = custody::rank_info{};
    return o;
}

std::vector<event> read_all(const std::string& path, custody::trace::trace_header* header = nullptr) {
    custody::trace::reader r(path);
    std::vector<event> out;
    event e;
    while (r.next(e)) out.push_back(e);
    if (header != nullptr) *header = r.header();
    return out;
}

} // namespace

static_assert(custody::try_allocatable_resource<recording_resource<custody::resource::host_memory>>);
static_assert(custody::resource_with_statistics<recording_resource<custody::resource::host_memory>>);
static_assert(custody::has_property<recording_resource<custody::resource::host_memory>, custody::host_accessible>);
static_assert(custody::has_property<recording_resource<custody::replay::address_space>, custody::device_accessible>);

TEST_CASE("8 threads record losslessly, each in its own order, in few writes", "[trace][recorder]") {
    custody_test::temp_dir dir;
    recorder_options o = options_for(dir.file("t.ctrace"));
    o.thread_buffer_events = 256; // small buffers: threads wait for the writer, nothing is lost
    o.reorder_limit = 1024;
    constexpr int threads = 8;
    constexpr std::uint64_t pairs = 20000;
    custody::trace::recorder_statistics stats;
    {
        recorder rec(o);
        recording_resource<custody::resource::host_memory> mr(rec);
        std::vector<std::thread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&mr, t] {
                for (std::uint64_t i = 0; i < pairs; ++i) {
                    const std::uint64_t bytes = 1 + static_cast<std::uint64_t>(t) * pairs + i; // names thread and step
                    void* p = mr.allocate_sync(bytes, 64);
                    mr.deallocate_sync(p, bytes, 64);
                }
            });
        }
        for (auto& w : workers) w.join();
        stats = rec.statistics();
    }
    CHECK(stats.events == 2 * threads * pairs);
    CHECK(stats.threads == threads);
    CHECK(stats.dropped == 0);
    CHECK(stats.largest_reorder <= 1024);
    CHECK(stats.writes * 1000 < stats.events); // batched: not a write per event

    custody::trace::trace_header header;
    const std::vector<event> events = read_all(o.path, &header);
    REQUIRE(events.size() == 2 * threads * pairs);
    REQUIRE(header.threads.size() == threads);
    // Each thread's events are all there, in the order the thread made them.
    std::map<std::uint32_t, std::uint64_t> next_bytes; // thread index -> the bytes its next allocation has
    std::map<std::uint32_t, void*> open;
    for (const event& e : events) {
        REQUIRE(e.thread >= 1);
        REQUIRE(e.device == -1);
        REQUIRE(e.alignment == 64);
        REQUIRE(e.stream == 0);
        auto [it, first] = next_bytes.try_emplace(e.thread, e.bytes);
        if (first) REQUIRE((e.bytes - 1) % pairs == 0);
        if (e.kind == event_kind::allocate) {
            REQUIRE(e.bytes == it->second);
            open[e.thread] = reinterpret_cast<void*>(e.address);
        } else {
            REQUIRE(e.kind == event_kind::deallocate);
            REQUIRE(e.bytes == it->second);
            REQUIRE(reinterpret_cast<void*>(e.address) == open[e.thread]);
            ++it->second;
        }
    }
    for (const auto& [t, b] : next_bytes) CHECK((b - 1) % pairs == 0); // every thread ended complete
}

namespace {

/// An upstream that hands the one block it has to a second thread while its deallocate runs: the
/// deallocate returns only once the other thread's allocation of the same address has returned
/// (and been recorded). Host platform; only what recording_resource needs.
class handoff_upstream {
public:
    using stream_type = custody::host::stream_view;
    void* allocate(stream_type, std::size_t, std::size_t) { return allocate_sync(0, 0); }
    void deallocate(stream_type, void* p, std::size_t n, std::size_t a) noexcept { deallocate_sync(p, n, a); }
    void* allocate_sync(std::size_t, std::size_t) { return &block_; }
    void deallocate_sync(void*, std::size_t, std::size_t) noexcept {
        std::unique_lock lock(mutex_);
        freed_ = true;
        cv_.notify_all();
        cv_.wait(lock, [this] { return taken_; });
    }
    /// For the second thread: returns once a deallocate has begun.
    void wait_until_freeing() {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [this] { return freed_; });
    }
    /// For the second thread, once its allocation returned: lets the deallocate return.
    void release_free() {
        std::lock_guard lock(mutex_);
        taken_ = true;
        cv_.notify_all();
    }
    friend bool operator==(const handoff_upstream& a, const handoff_upstream& b) noexcept { return &a == &b; }

private:
    alignas(256) char block_[64] = {};
    std::mutex mutex_;
    std::condition_variable cv_;
    bool freed_ = false;
    bool taken_ = false;
};

} // namespace

TEST_CASE("a free is recorded before its upstream can hand the address to another thread", "[trace][recorder]") {
    custody_test::temp_dir dir;
    const recorder_options o = options_for(dir.file("t.ctrace"));
    {
        recorder rec(o);
        recording_resource<handoff_upstream> mr(rec);
        void* p = mr.allocate_sync(64, 256);
        std::thread other([&mr] {
            mr.upstream().wait_until_freeing();
            static_cast<void>(mr.allocate_sync(64, 256)); // the same address, while the free runs
            mr.upstream().release_free();
        });
        mr.deallocate_sync(p, 64, 256);
        other.join();
    }
    const std::vector<event> events = read_all(o.path);
    REQUIRE(events.size() == 3);
    CHECK(events[0].kind == event_kind::allocate);
    CHECK(events[1].kind == event_kind::deallocate);
    CHECK(events[2].kind == event_kind::allocate);
    custody::trace::reader in(o.path);
    CHECK_NOTHROW(custody::replay::compile(in));
}

TEST_CASE("a free is recorded before its address can be handed to another thread", "[trace][recorder]") {
    // Threads sharing one pool's default-stream cache take each other's blocks at once: an
    // allocation recorded before the free of the same address would make the trace unreplayable.
    using pool_type = custody::pool::stream_ordered_pool<custody::resource::host_memory>;
    custody_test::temp_dir dir;
    const recorder_options o = options_for(dir.file("t.ctrace"));
    {
        recorder rec(o);
        recording_resource<pool_type> mr(rec, custody::pool::pool_options{});
        std::vector<std::thread> workers;
        for (int t = 0; t < 8; ++t) {
            workers.emplace_back([&mr] {
                for (int i = 0; i < 20000; ++i) {
                    void* p = mr.allocate_sync(256, 256);
                    mr.deallocate_sync(p, 256, 256);
                }
            });
        }
        for (auto& w : workers) w.join();
    }
    custody::trace::reader in(o.path);
    const auto program = custody::replay::compile(in); // throws when a reuse precedes its free
    REQUIRE(program.devices.size() == 1);
    CHECK(program.devices[0].ops.size() == 8 * 2 * 20000);
    CHECK(program.devices[0].peak_live <= 8 * 256);
}

TEST_CASE("flush() puts every event so far in the file while recording goes on", "[trace][recorder]") {
    custody_test::temp_dir dir;
    const recorder_options o = options_for(dir.file("t.ctrace"));
    recorder rec(o);
    recording_resource<custody::resource::host_memory> mr(rec);
    std::vector<void*> kept;
    for (int i = 0; i < 1000; ++i) kept.push_back(mr.allocate_sync(128, 256));
    rec.flush();
    CHECK(rec.statistics().events_written == 1000);
    {
        custody::trace::reader r(o.path);
        event e;
        std::uint64_t n = 0;
        try {
            while (r.next(e)) ++n;
            FAIL("the trace has an end before the recorder does");
        } catch (const custody::trace::trace_error& err) {
            CHECK(err.why() == custody::trace::trace_error::reason::truncated);
        }
        CHECK(n == 1000);
    }
    for (void* p : kept) mr.deallocate_sync(p, 128, 256);
    rec.flush();
    CHECK(rec.statistics().events_written == 2000);
}

TEST_CASE("the adaptor records streams, devices, owners, and allocations that fail", "[trace][recorder]") {
    custody_test::temp_dir dir;
    recorder_options o = options_for(dir.file("t.ctrace"));
    o.record_owner = true;
    o.platform = "host";
    custody::host::stream s(2);
    {
        recorder rec(o);
        recording_resource<custody::replay::address_space> mr(rec, 2, std::size_t{1} << 20); // device 2, 1 MiB
        void* a = nullptr;
        {
            custody::debug::owner_scope decoder("decoder");
            a = mr.allocate(s, 4096, 256);
            custody::debug::owner_scope layer("layer.0");
            CHECK_THROWS_AS(mr.allocate(s, std::size_t{2} << 20, 256), custody::out_of_memory);
            CHECK(mr.try_allocate(s, std::size_t{2} << 20, 256) == nullptr);
        }
        CHECK(mr.allocate(s, 0, 256) == nullptr);                       // not an event
        CHECK_THROWS_AS(mr.allocate(s, 64, 3), std::invalid_argument);  // not an event
        mr.deallocate(s, nullptr, 64, 256);                             // not an event
        mr.deallocate(s, a, 4096, 256);
    }
    custody::trace::trace_header header;
    const std::vector<event> events = read_all(o.path, &header);
    REQUIRE(events.size() == 4);
    CHECK(header.get("platform") == "host");
    CHECK(header.owners == std::vector<std::string>{"decoder", "decoder/layer.0"});
    const auto key = custody::host::platform::stream_key(s);
    CHECK(events[0].kind == event_kind::allocate);
    CHECK(events[0].owner == 1);
    CHECK(events[1].kind == event_kind::allocation_failure);
    CHECK(events[1].bytes == std::size_t{2} << 20);
    CHECK(events[1].owner == 2);
    CHECK(events[2].kind == event_kind::allocation_failure);
    CHECK(events[3].kind == event_kind::deallocate);
    CHECK(events[3].owner == 0);
    for (const event& e : events) {
        CHECK(e.stream == key);
        CHECK(e.device == 2);
    }
    CHECK(events[3].address == events[0].address);
}

TEST_CASE("a rank's trace is named like its tracking report, and an unwritable path is an error", "[trace][recorder]") {
    custody_test::temp_dir dir;
    recorder_options o;
    o.directory = dir.path().string();
    o.rank = custody::make_rank(3, 1, 4);
    {
        recorder rec(o);
        CHECK(rec.path() == dir.file("rank-3.ctrace"));
        CHECK(custody::trace::trace_file_name(*o.rank) == "rank-3.ctrace");
    }
    custody::trace::trace_header header;
    CHECK(read_all(dir.file("rank-3.ctrace"), &header).empty());
    CHECK(header.get("rank") == "3");
    CHECK(header.get("world_size") == "4");
    CHECK(header.get("source") == "custody-recorder");

    o.directory = dir.file("no/such/directory");
    CHECK_THROWS_WITH(recorder(o), custody_test::contains("no/such/directory/rank-3.ctrace"));
    // A device that refuses every write (a private /dev/full where this process may make one):
    // custody::error, and the device is written in place, never replaced by a file.
    const std::string full_path = dir.file("full");
    recorder_options full = options_for(custody_test::make_device_node(full_path, 7) ? full_path : "/dev/full");
    CHECK_THROWS_AS(recorder(full), custody::error);
    struct stat st {};
    REQUIRE(::lstat(full.path.c_str(), &st) == 0);
    CHECK(S_ISCHR(st.st_mode));
}

TEST_CASE("a trace is a new file: links planted at its name are replaced, never written through", "[trace][recorder]") {
    custody_test::temp_dir dir;
    recorder_options o;
    o.directory = dir.path().string();
    o.rank = custody::make_rank(2, 0, 4);
    const std::string path = dir.file("rank-2.ctrace");
    const std::string victim = custody_test::make_victim(dir.file("victim"));
    const std::string hard_victim = custody_test::make_victim(dir.file("hard-victim"));
    for (int k = 0; k < 3; ++k) {
        INFO("planted: " << (k == 0 ? "a symbolic link" : k == 1 ? "a hard link" : "a link at the temporary name"));
        std::filesystem::remove(path);
        if (k == 0) REQUIRE(custody_test::plant_symlink(victim, path));
        if (k == 1) REQUIRE(custody_test::plant_hard_link(hard_victim, path));
        if (k == 2) REQUIRE(custody_test::plant_symlink(victim, custody_test::old_temporary_name(path)));
        {
            recorder rec(o);
            CHECK(custody_test::is_own_regular_file(path)); // readable under its name while it grows
            rec.record(event_kind::allocate, 0, 0, 64, 256, reinterpret_cast<void*>(0x1000));
        }
        CHECK(custody_test::file_text(victim) == custody_test::victim_text);
        CHECK(custody_test::file_text(hard_victim) == custody_test::victim_text);
        CHECK(custody_test::is_own_regular_file(path));
        CHECK(read_all(path).size() == 1);
        std::filesystem::remove(custody_test::old_temporary_name(path));
        CHECK(custody_test::leftover_temporaries(dir.path()) == 0);
    }
}

TEST_CASE("round trip: a program's allocations, recorded and replayed, give the same peak live and event count",
          "[trace][recorder][replay]") {
    using pool_type = custody::pool::stream_ordered_pool<custody::resource::host_memory>;
    custody_test::temp_dir dir;
    const recorder_options o = options_for(dir.file("program.ctrace"));
    custody::resource_statistics original;
    {
        recorder rec(o);
        recording_resource<pool_type> mr(rec, custody::pool::pool_options{});
        custody::host::stream compute(0), copy(0);
        const custody::host::stream_view streams[] = {{}, compute.view(), copy.view()};
        struct block {
            void* p;
            std::size_t bytes;
        };
        std::vector<block> live;
        std::mt19937_64 rng(7);
        for (int step = 0; step < 20000; ++step) {
            const auto s = streams[rng() % 3];
            if (live.empty() || rng() % 100 < 52) {
                const std::size_t bytes = (std::size_t{64} << (rng() % 18)) + rng() % 512; // 64 B .. 8 MiB
                live.push_back({mr.allocate(s, bytes, 256), bytes});
            } else {
                const std::size_t k = rng() % live.size();
                mr.deallocate(s, live[k].p, live[k].bytes, 256); // often on another stream than its allocation
                live[k] = live.back();
                live.pop_back();
            }
        }
        for (const auto& b : live) mr.deallocate(streams[0], b.p, b.bytes, 256);
        original = mr.statistics();
    }
    custody::trace::reader in(o.path);
    const custody::replay::program program = custody::replay::compile(in);
    REQUIRE(program.devices.size() == 1);
    const custody::replay::device_program& p = program.devices.front();
    CHECK(program.events == original.allocations + original.deallocations);
    CHECK(p.ops.size() == program.events);
    CHECK(p.allocations == original.allocations);
    CHECK(p.peak_live == original.peak_live_bytes);
    CHECK(p.streams.size() == 3);

    for (const std::string spec : {"pool:upstream=host_memory", "pool", "host_memory"}) {
        CAPTURE(spec);
        custody::replay::stream_pool streams(p);
        const auto driver = custody::replay::plan(custody::replay::allocator_spec(spec))(p, streams);
        custody::replay::progress bar(false);
        const custody::replay::measurement m = driver->measure(p, {}, bar);
        CHECK(m.failed_allocations == 0);
        REQUIRE(m.observed_peak_live.has_value());
        CHECK(*m.observed_peak_live == original.peak_live_bytes);
        CHECK(m.peak_reserved >= original.peak_live_bytes);
        CHECK(driver->timed(p) > 0.0);
    }
}
