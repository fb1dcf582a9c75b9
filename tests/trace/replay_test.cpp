// The replay engine: compiling a trace (and refusing one that cannot be replayed), the figures of
// the measuring pass, stream order, allocator names and options, and the address-space device
// memory (a write into it faults; the pool never touches it).
#include "../support/catch.hpp"
#include "support.hpp"

#include "replay/adaptors.hpp"
#include "replay/address_space.hpp"
#include "replay/allocator_spec.hpp"
#include "replay/allocators.hpp"
#include "replay/program.hpp"
#include "replay/replay.hpp"
#include "replay/report.hpp"
#include "replay/streams.hpp"

#include <custody/platform/host.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/trace/recorder.hpp>
#include <custody/trace/recording_resource.hpp>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using custody::replay::allocator_spec;
using custody::replay::compile;
using custody::replay::program_error;
using custody::replay::spec_error;
using custody::trace::event;
using custody::trace::event_kind;
using custody_test::make_event;
using custody_test::trace_of;

namespace {

constexpr std::uint64_t MiB = std::uint64_t{1} << 20;

custody::replay::program compile_events(const std::vector<event>& events) {
    auto r = custody_test::read_bytes(trace_of(events), "test.ctrace");
    return compile(r);
}

/// The message of the program_error compiling `events` throws, with its event number checked.
std::string refusal(const std::vector<event>& events, std::uint64_t expected_event) {
    try {
        compile_events(events);
    } catch (const program_error& e) {
        CHECK(e.sequence() == expected_event);
        return e.what();
    }
    FAIL("the trace was compiled");
    return {};
}

event alloc(std::uint64_t address, std::uint64_t bytes, std::uint64_t stream = 0) {
    return make_event(event_kind::allocate, address, bytes, stream);
}
event dealloc(std::uint64_t address, std::uint64_t bytes, std::uint64_t stream = 0) {
    return make_event(event_kind::deallocate, address, bytes, stream);
}

/// 1 MiB, 2 MiB live, free the first, 512 KiB, free the rest: peak 3 MiB after op 1.
std::vector<event> small_trace() {
    return {alloc(0x10000000, MiB, 0),      alloc(0x20000000, 2 * MiB, 0xA), dealloc(0x10000000, MiB, 0xB),
            alloc(0x30000000, MiB / 2, 0xA), dealloc(0x20000000, 2 * MiB, 0), dealloc(0x30000000, MiB / 2, 0xA)};
}

custody::replay::measurement measure(const std::string& spec, const custody::replay::device_program& p,
                                     std::uint64_t capacity = std::uint64_t{80} << 30) {
    custody::replay::stream_pool streams(p);
    const auto driver = custody::replay::plan(allocator_spec(spec))(p, streams);
    custody::replay::progress bar(false);
    custody::replay::run_options o;
    o.capacity = capacity;
    return driver->measure(p, o, bar);
}

/// Runs `body` in a child process; its exit status (128 + signal when killed). A fault in the
/// child ends it with 200, through a handler installed first (sanitizers would report it otherwise).
template <class Body>
int in_child(Body body) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        struct sigaction sa {};
        sa.sa_handler = [](int) { ::_exit(200); };
        ::sigaction(SIGSEGV, &sa, nullptr);
        ::sigaction(SIGBUS, &sa, nullptr);
        body();
        ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

} // namespace

TEST_CASE("compiling a trace: slots, streams, peak live, what stays live", "[replay][program]") {
    std::vector<event> events = small_trace();
    events.push_back(alloc(0x40000000, 3 * MiB, 0xB)); // stays live
    events.push_back(make_event(event_kind::allocation_failure, 0, 100 * MiB));
    const auto program = compile_events(events);
    REQUIRE(program.devices.size() == 1);
    const auto& p = program.devices[0];
    CHECK(p.ops.size() == 7);
    CHECK(p.allocations == 4);
    CHECK(p.deallocations == 3);
    CHECK(p.failures_in_trace == 1);
    CHECK(p.peak_live == 3 * MiB);
    CHECK(p.peak_live_op == 1);
    CHECK(p.streams == std::vector<std::uint64_t>{0, 0xA, 0xB});
    CHECK(p.slots == 2); // slots are reused once freed
    CHECK(p.ops[2].stream == 2);
    CHECK(p.ops[2].slot == p.ops[0].slot);
    REQUIRE(p.live_at_end.size() == 1);
    CHECK(p.live_at_end[0].bytes == 3 * MiB);
    CHECK(p.sequence[6] == 7);
}

TEST_CASE("a trace that cannot be replayed is refused, naming the event", "[replay][program][errors]") {
    CHECK_THAT(refusal({alloc(0x1000, 64), dealloc(0x2000, 64)}, 2),
               custody_test::contains("free of 0x2000 on device 0, which is not live"));
    CHECK_THAT(refusal({alloc(0x1000, 64), dealloc(0x1000, 64), dealloc(0x1000, 64)}, 3),
               custody_test::contains("which is not live"));
    CHECK_THAT(refusal({alloc(0x1000, 64), alloc(0x1000, 64)}, 2), custody_test::contains("live since event 1"));
    CHECK_THAT(refusal({alloc(0x1000, 64), dealloc(0x1000, 128)}, 2),
               custody_test::contains("with 128 bytes (alignment 256); event 1 allocated it with 64 bytes"));
    CHECK_THAT(refusal({alloc(0x1000, 0)}, 1), custody_test::contains("an allocation of 0 bytes"));
    CHECK_THAT(refusal({alloc(0x1000, 64), alloc(0x2000, std::uint64_t{2} << 40)}, 2),
               custody_test::contains("larger than any device"));
    CHECK_THAT(refusal({alloc(0, 64)}, 1), custody_test::contains("null pointer"));
    event big = alloc(0x1000, 64);
    big.alignment = 8192;
    CHECK_THAT(refusal({big}, 1), custody_test::contains("alignment 8192"));
    event release = make_event(event_kind::reference_release, 0, 64);
    CHECK_THAT(refusal({release}, 1), custody_test::contains("gives back 64 bytes but holds only 0"));
    CHECK_THAT(refusal({alloc(0x1000, 64), dealloc(0x2000, 64)}, 2), custody_test::contains("trace 'test.ctrace': event 2"));
}

TEST_CASE("totals that do not fit 64 bits are refused, naming the event", "[replay][program][errors]") {
    const std::uint64_t half = std::uint64_t{1} << 63;
    const event reserve = make_event(event_kind::reference_reserve, 0, half);
    CHECK_THAT(refusal({reserve, reserve, reserve, alloc(0x1000, 64)}, 2),
               custody_test::contains("more than 2^64-1 bytes"));
    // Live bytes, with the request limit lifted (a test of the sum, not of the limit).
    auto r = custody_test::read_bytes(trace_of({alloc(0x1000, half), alloc(0x2000, half)}), "test.ctrace");
    custody::replay::compile_options o;
    o.max_request = UINT64_MAX;
    try {
        (void)compile(r, o);
        FAIL("live bytes of 2^64 were accepted");
    } catch (const custody::replay::program_error& e) {
        CHECK(e.sequence() == 2);
        CHECK_THAT(std::string(e.what()), custody_test::contains("more than 2^64-1 bytes"));
    }
}

TEST_CASE("devices are compiled apart, and one can be chosen", "[replay][program]") {
    std::vector<event> events = {alloc(0x1000, 64), alloc(0x1000, 128)}; // the same address on two devices
    events[1].device = 1;
    events.push_back(dealloc(0x1000, 64));
    const auto program = compile_events(events);
    REQUIRE(program.devices.size() == 2);
    CHECK(program.devices[0].device == 0);
    CHECK(program.devices[1].device == 1);
    CHECK(program.devices[1].peak_live == 128);
    auto r = custody_test::read_bytes(trace_of(events));
    custody::replay::compile_options o;
    o.only_device = 1;
    CHECK(compile(r, o).devices.size() == 1);
}

TEST_CASE("the measuring pass: peak reserved, reserved at the peak, first op over capacity", "[replay][measure]") {
    const auto program = compile_events(small_trace());
    const auto& p = program.devices[0];
    // A leaf holds exactly what is live.
    const auto leaf = measure("address_space", p, 5 * MiB / 2);
    CHECK(leaf.peak_reserved == 3 * MiB);
    CHECK(leaf.reserved_at_peak == 3 * MiB);
    CHECK(leaf.first_over_capacity == std::optional<std::size_t>(1));
    CHECK(leaf.failed_allocations == 0);
    CHECK_FALSE(leaf.largest_free_at_peak.has_value());
    CHECK(leaf.timeline.op.size() == p.ops.size());
    CHECK(leaf.timeline.live[1] == 3 * MiB);
    CHECK(leaf.timeline.live.back() == 0);
    // The pool says where its free memory is.
    const auto pool = measure("pool", p);
    CHECK(pool.peak_reserved >= 3 * MiB);
    CHECK(pool.largest_free_at_peak.has_value());
    CHECK_FALSE(pool.first_over_capacity.has_value());
    CHECK(pool.observed_peak_live == std::optional<std::uint64_t>(3 * MiB));
}

TEST_CASE("an allocator that runs out fails those requests and goes on", "[replay][measure]") {
    const auto program = compile_events(small_trace());
    const auto m = measure("address_space:capacity=2MiB", program.devices[0]);
    CHECK(m.failed_allocations == 1);
    CHECK(m.first_failure == std::optional<std::size_t>(1));
    CHECK_THAT(m.failure_message, custody_test::contains("out of memory"));
    CHECK(m.peak_reserved == MiB); // 1 MiB; the 512 KiB come after it is freed
}

TEST_CASE("malloc's reserved bytes count the free heap it already held: never below what is live", "[replay][measure]") {
    // Leave free space in malloc's heap: many small blocks freed, with one kept above them so
    // that the heap is not trimmed.
    std::vector<void*> earlier;
    for (int i = 0; i < 512; ++i) earlier.push_back(std::malloc(1024));
    void* keep = std::malloc(1024);
    for (void* p : earlier) std::free(p);
    {
        custody::replay::malloc_adaptor a;
        std::vector<void*> live;
        for (int i = 0; i < 256; ++i) live.push_back(a.allocate(0, 1024, 16));
        // Under a sanitizer, whose allocator replaces glibc's, mallinfo2 reports nothing.
        if (custody::replay::detail::malloc_now().held != 0) CHECK(a.reserved() >= 256 * 1024);
        for (void* p : live) a.deallocate(0, p, 1024, 16);
    }
    std::free(keep);
}

TEST_CASE("the reference allocator's reserved bytes count at the op they come before", "[replay][program]") {
    std::vector<event> events = small_trace();
    event initial = make_event(event_kind::reference_reserve, 0, 4 * MiB);
    initial.flags = custody::trace::flag_pre_trace;
    events.insert(events.begin(), initial);
    events.insert(events.begin() + 2, make_event(event_kind::reference_reserve, 0, 2 * MiB)); // before op 1
    events.push_back(make_event(event_kind::reference_release, 0, 4 * MiB));                // after the last op
    const auto program = compile_events(events);
    const auto& p = program.devices[0];
    REQUIRE(p.reference.has_value());
    CHECK(p.reference->peak == 6 * MiB);
    CHECK(p.reference->at(0) == 4 * MiB);
    CHECK(p.reference->at(1) == 6 * MiB);
    CHECK(p.reference->at(5) == 6 * MiB);
    CHECK(p.reference->at(6) == 2 * MiB);
    const auto figures = custody::replay::reference_figures(p, 5 * MiB);
    CHECK(figures.peak_reserved == 6 * MiB);
    CHECK(figures.reserved_at_peak == 6 * MiB);
    CHECK(figures.first_over_capacity == std::optional<std::size_t>(1));
    CHECK(p.reference->peak_from(6) == 2 * MiB);
    CHECK(p.reference->peak_from(2) == 6 * MiB);
}

TEST_CASE("blocks live before the trace come first; the reference's peak from there leaves its old cache out",
          "[replay][program]") {
    // PyTorch held 10 MiB when recording began (a cache it gives back at once), 1 MiB of it live.
    event initial = make_event(event_kind::reference_reserve, 0, 10 * MiB);
    initial.flags = custody::trace::flag_pre_trace;
    event before = alloc(0x50000000, MiB);
    before.flags = custody::trace::flag_pre_trace;
    std::vector<event> events = {initial, before, make_event(event_kind::reference_release, 0, 8 * MiB)};
    for (const event& e : small_trace()) events.push_back(e);
    const auto program = compile_events(events);
    const auto& p = program.devices[0];
    CHECK(p.pre_trace == 1);
    CHECK(p.first_trace_op == 1);
    CHECK(p.peak_live == 4 * MiB);
    const auto figures = custody::replay::reference_figures(p, std::uint64_t{80} << 30);
    CHECK(figures.peak_reserved == 10 * MiB);
    CHECK(figures.peak_reserved_in_trace == 2 * MiB);
}

TEST_CASE("each op is replayed on the stream of its event, in order", "[replay][streams]") {
    // A trace whose blocks are freed on other streams than their allocation's.
    std::vector<event> events;
    std::mt19937_64 rng(11);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
    const std::uint64_t streams[] = {0, 0x100, 0x200, 0x300};
    for (std::uint64_t i = 0; i < 2000; ++i) {
        if (live.empty() || rng() % 2 == 0) {
            live.emplace_back(0x10000 + i * 0x1000, 256 * (1 + rng() % 64));
            events.push_back(alloc(live.back().first, live.back().second, streams[rng() % 4]));
        } else {
            const std::size_t k = rng() % live.size();
            events.push_back(dealloc(live[k].first, live[k].second, streams[rng() % 4]));
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
    }
    const auto program = compile_events(events);
    const auto& p = program.devices[0];
    // Replay through a recorder: the second trace must name the same streams in the same order.
    custody_test::temp_dir dir;
    custody::trace::recorder_options o;
    o.path = dir.file("replayed.ctrace");
    o.rank = custody::rank_info{};
    {
        custody::trace::recorder rec(o);
        custody::replay::stream_pool pool(p);
        const auto& views = pool.views<custody::host::platform>(0);
        using A = custody::replay::custody_adaptor<custody::trace::recording_resource<custody::resource::host_memory>>;
        const auto driver = custody::replay::make_driver<A>([&] { return std::make_unique<A>(views, rec); });
        custody::replay::progress bar(false);
        driver->measure(p, {}, bar);
    }
    custody::trace::reader r(o.path);
    std::map<std::uint64_t, std::uint64_t> replayed_of; // trace stream -> replay stream key
    event e;
    for (const event& original : events) {
        REQUIRE(r.next(e));
        CHECK(e.kind == original.kind);
        CHECK(e.bytes == original.bytes);
        const auto [it, fresh] = replayed_of.try_emplace(original.stream, e.stream);
        CHECK(it->second == e.stream);
    }
    CHECK(replayed_of.size() == 4);
    CHECK(replayed_of[0] == 0); // the default stream stays the default stream
    std::map<std::uint64_t, int> distinct;
    for (const auto& [from, to] : replayed_of) ++distinct[to];
    CHECK(distinct.size() == 4);
}

TEST_CASE("allocator names and options are checked before anything runs", "[replay][spec][errors]") {
    using custody::replay::plan;
    CHECK_THROWS_WITH(plan(allocator_spec("nope")), custody_test::contains("allocator 'nope': unknown allocator (known: pool,"));
    CHECK_THROWS_WITH(plan(allocator_spec("pool:foo=1")), custody_test::contains("unknown option 'foo' (options: upstream="));
    CHECK_THROWS_WITH(plan(allocator_spec("malloc:x=1")), custody_test::contains("(it takes no options)"));
    CHECK_THROWS_WITH(plan(allocator_spec("pool:maximum_size=lots")), custody_test::contains("maximum_size='lots' is not a size"));
    CHECK_THROWS_WITH(plan(allocator_spec("pool:reuse=sometimes")), custody_test::contains("is not one of same_stream"));
    CHECK_THROWS_WITH(plan(allocator_spec("pool:max_streams=0")), custody_test::contains("max_streams must be at least 1"));
    CHECK_THROWS_WITH(plan(allocator_spec("pool:growth_divisor=-1")), custody_test::contains("not a non-negative integer"));
    CHECK_THROWS_AS(allocator_spec(":x=1"), spec_error);
    CHECK_THROWS_WITH(allocator_spec("pool:x"), custody_test::contains("'x' is not key=value"));
    CHECK_THROWS_WITH(allocator_spec("pool:a=1,a=2"), custody_test::contains("given twice"));
    CHECK_THROWS_WITH(allocator_spec("pool:a=1,"), custody_test::contains("a comma ends the options"));
    CHECK_NOTHROW(plan(allocator_spec("pool:maximum_size=1.5GiB,reuse=same_stream,record_interval=1")));
    CHECK_NOTHROW(plan(allocator_spec("pmr_sync:largest_block=64KiB,blocks_per_chunk=32")));
    // This suite is built without CUDA: the CUDA allocators say so (custody-replay built with the
    // toolkit says instead that no device is present; tests/trace/cli_test.py checks it).
    for (const char* name : {"cuda_async", "cuda_malloc", "cub", "pool:upstream=cuda_malloc"}) {
        CHECK_THROWS_WITH(plan(allocator_spec(name)), custody_test::contains("CUDA Toolkit"));
    }
}

TEST_CASE("sizes are read with their units", "[replay][spec]") {
    using custody::replay::allocator_spec;
    CHECK(allocator_spec::parse_byte_count("80GiB") == std::optional<std::uint64_t>(std::uint64_t{80} << 30));
    CHECK(allocator_spec::parse_byte_count("1.5GiB") == std::optional<std::uint64_t>(std::uint64_t{3} << 29));
    CHECK(allocator_spec::parse_byte_count("100") == std::optional<std::uint64_t>(100));
    CHECK(allocator_spec::parse_byte_count("2MB") == std::optional<std::uint64_t>(2000000));
    CHECK(allocator_spec::parse_byte_count("64KiB") == std::optional<std::uint64_t>(65536));
    for (const char* bad : {"", "GiB", "100.5", "-1", "1e3", "12 GiB", "20000000TiB", "1GiBs"}) {
        CAPTURE(bad);
        CHECK_FALSE(allocator_spec::parse_byte_count(bad).has_value());
    }
}

TEST_CASE("address-space device memory: a write into it faults", "[replay][address_space]") {
    custody::replay::address_space memory(0);
    void* p = memory.allocate_sync(std::size_t{80} << 30, 256); // 80 GiB of address space, no memory
    REQUIRE(p != nullptr);
    CHECK(memory.mapped() == std::size_t{80} << 30);
    CHECK(in_child([p] { static_cast<volatile char*>(p)[12345] = 1; }) == 200);
    CHECK(in_child([p] { static_cast<void>(static_cast<volatile char*>(p)[0]); }) == 200);
    CHECK(in_child([] {}) == 0); // the harness itself: a child that touches nothing exits 0
    memory.deallocate_sync(p, std::size_t{80} << 30, 256);
    CHECK(memory.mapped() == 0);
    CHECK(memory.statistics().peak_live_bytes == std::size_t{80} << 30);
}

TEST_CASE("the pool never touches device memory (it lives on address space that faults)", "[replay][address_space]") {
    using pool_type = custody::pool::stream_ordered_pool<custody::replay::address_space>;
    const auto workload = [](bool touch) {
        return [touch] {
            pool_type pool(custody::pool::pool_options{}, 0);
            custody::host::stream a(0), b(0);
            const custody::host::stream_view streams[] = {{}, a.view(), b.view()};
            std::mt19937_64 rng(3);
            struct block {
                void* p;
                std::size_t bytes;
                std::size_t alignment;
            };
            std::vector<block> live;
            for (int i = 0; i < 20000; ++i) {
                const auto s = streams[rng() % 3];
                if (live.empty() || rng() % 2 == 0) {
                    const std::size_t bytes = (std::size_t{1} << (6 + rng() % 24)) + rng() % 4096; // up to 1 GiB
                    const std::size_t alignment = std::size_t{1} << (rng() % 13);
                    void* p = pool.allocate(s, bytes, alignment);
                    if (touch) static_cast<volatile char*>(p)[0] = 1;
                    live.push_back({p, bytes, alignment});
                } else {
                    const std::size_t k = rng() % live.size();
                    pool.deallocate(s, live[k].p, live[k].bytes, live[k].alignment); // often another stream
                    live[k] = live.back();
                    live.pop_back();
                }
            }
            for (const auto& b : live) pool.deallocate(streams[0], b.p, b.bytes, b.alignment);
            pool.trim();
        };
    };
    CHECK(in_child(workload(false)) == 0);
    CHECK(in_child(workload(true)) == 200); // the control: a touch is seen
}
