// Every part composed with the others: one typed test over the stacks a user builds (a tracker, a
// recorder, the pool with either growth, sleepable memory, a segment journal, the staging ring's
// upstream), each with NVTX annotations on and off, checked mode on and off (where a pool is) and the
// tracker's canaries on and off, run through one short seeded model: allocate and write a cookie,
// free after checking it, sleep and wake where memory sleeps, report, snapshot. After every few
// steps the same things are asserted: contents intact, counts exact in every layer (each layer
// holds exactly what the layer above handed it), reports and snapshots naming every live block once
// at the address the user holds; at the end, the recorder's trace holds every call with the owner
// the tracker charged. Run by the NVTX suite too, with its recording tool loaded: there, each live
// block is also named after its owner in what CUDA's tools were told, with annotations on, and
// nothing is, with them off.
#include <custody/core/discarding.hpp>
#include <custody/debug/history.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/pytorch_snapshot.hpp>
#include <custody/debug/segment_journal.hpp>
#include <custody/debug/tracking_resource.hpp>
#include <custody/platform/host.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/simulated_device_memory.hpp>
#include <custody/resource/virtual_memory.hpp>
#include <custody/sleep/sleepable_memory.hpp>
#include <custody/staging/staging_ring.hpp>
#include <custody/trace/reader.hpp>
#include <custody/trace/recorder.hpp>
#include <custody/trace/recording_resource.hpp>

#include "../nvtx/recording.hpp"
#include "../support/catch.hpp"
#include "../support/sizes.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

namespace {

using namespace custody;
using custody::debug::tracking_options;
using custody::debug::tracking_resource;
using custody::sleep::sleep_policy;
using stream = host::stream_view;

using custody::test::KiB;
using custody::test::MiB;
constexpr std::size_t alignment = 256;
constexpr std::array<const char*, 3> owners{"weights", "kv_cache", "activations"};

// ---- the layers, as types ------------------------------------------------------------------------

using sim = host::simulated_device_memory;
using mapped = resource::virtual_memory<host::vmm>;
using sleepable = sleep::sleepable_memory<host::vmm, resource::host_memory>;
using pooled_backing = pool::stream_ordered_pool<resource::host_memory>;
using sleepable_pooled_backing = sleep::sleepable_memory<host::vmm, pooled_backing>;
template <class U>
using tracker_over = tracking_resource<U>;
template <class U>
using pool_over = pool::stream_ordered_pool<U>;
template <class U>
using recorder_over = trace::recording_resource<U>;
template <class U>
using journal_over = debug::segment_journal<U>;

template <class T> inline constexpr bool is_tracker = false;
template <class U> inline constexpr bool is_tracker<tracking_resource<U>> = true;
template <class T> inline constexpr bool is_pool = false;
template <class U> inline constexpr bool is_pool<pool::stream_ordered_pool<U>> = true;
template <class T> inline constexpr bool is_recorder = false;
template <class U> inline constexpr bool is_recorder<trace::recording_resource<U>> = true;
template <class T> inline constexpr bool is_journal = false;
template <class U> inline constexpr bool is_journal<debug::segment_journal<U>> = true;
template <class T> inline constexpr bool is_sleepable = false;
template <class V, class B, class R> inline constexpr bool is_sleepable<sleep::sleepable_memory<V, B, R>> = true;

template <class R>
concept has_upstream = requires(R& r) { r.upstream(); };

static_assert(discarding_resource<sleepable>);
static_assert(discarding_resource<pool_over<sleepable>>);
static_assert(discarding_resource<recorder_over<sleepable>>);
static_assert(!has_property<tracker_over<sim>, discards_contents>);

// ---- what the model holds -------------------------------------------------------------------------

/// A live block as its user holds it.
struct user_block {
    std::size_t bytes = 0;
    std::string owner;
    unsigned seed = 0;
    bool zeroed = false; ///< discarded by a sleep: zeros until written again
};

/// What a layer must hold live: exactly `blocks` (address -> bytes, owner), or, below a pool (whose
/// blocks the layer never sees), `bytes` in total.
struct expected {
    std::map<std::uintptr_t, std::pair<std::size_t, std::string>> blocks;
    bool exact = true;
    std::size_t bytes = 0;

    [[nodiscard]] std::size_t total() const {
        if (!exact) return bytes;
        std::size_t n = 0;
        for (const auto& [a, b] : blocks) n += b.first;
        return n;
    }
    [[nodiscard]] std::map<std::string, std::pair<std::size_t, std::size_t>> per_owner() const {
        std::map<std::string, std::pair<std::size_t, std::size_t>> o; // owner -> (bytes, count)
        for (const auto& [a, b] : blocks) {
            o[b.second].first += b.first;
            ++o[b.second].second;
        }
        return o;
    }
};

/// The variant of a run: NVTX annotations, the pool's checked mode and the tracker's canaries.
struct variant {
    bool annotate = true;
    bool checked = true;
    bool canaries = true;
};

/// Whether the run under way announces its memory (what check_announced expects).
bool annotating = true;

/// With the NVTX recording tool loaded: every live block the tracker holds (its upstream's block,
/// guards included) is named after its owner, as a region of a pool's heap or as a name of its own,
/// with annotations on; with them off, none is. Without the tool: nothing to check.
void check_announced(const std::map<std::uintptr_t, std::string>& outer_owners) {
    if (!custody_nvtx_test::recording_run()) return;
    const custody_nvtx_test::recording r = custody_nvtx_test::read();
    CHECK(r.violations.empty());
    for (const auto& [outer, owner] : outer_owners) {
        const auto region = r.regions.find(outer);
        const auto named = r.named.find(outer);
        const std::string seen = region != r.regions.end() ? region->second.name
                                 : named != r.named.end()  ? named->second
                                                           : std::string();
        CHECK(seen == (annotating ? owner : std::string()));
    }
}

std::string describe(const variant& v) {
    return std::string("annotate ") + (v.annotate ? "on" : "off") + ", checked " + (v.checked ? "on" : "off") +
           ", canaries " + (v.canaries ? "on" : "off");
}

tracking_options tracker_options(const variant& v, std::shared_ptr<debug::allocation_history> history) {
    tracking_options o;
    o.name = "compose";
    o.annotate = v.annotate;
    o.canaries = v.canaries;
    o.history = std::move(history);
    o.on_leak = debug::policy::ignore;
    return o;
}
pool::pool_options pool_options_of(const variant& v) {
    pool::pool_options o;
    o.annotate = v.annotate;
    o.checked = v.checked;
    return o;
}
resource::reservation_options granules() {
    resource::reservation_options o;
    o.granule = 2 * MiB;
    return o;
}

// ---- the stacks -------------------------------------------------------------------------------------

/// A stack: `resource` (what the user allocates from), built for a variant, with the parts a check
/// needs: the history the tracker writes, the recorder's file, the sleepable memory (if any).
/// `single_owner`: every block belongs to one owner (a pool over sleepable memory sleeps whole
/// chunks: it serves one owner, as a MemPool per owner does).
template <class Resource>
struct stack_base {
    using resource_type = Resource;
    std::shared_ptr<debug::allocation_history> history = std::make_shared<debug::allocation_history>(1 << 16);
    std::unique_ptr<trace::recorder> recorder;
    std::string trace_path;
    std::unique_ptr<Resource> resource;
    static constexpr bool single_owner = false;

    void start_recorder(const std::string& name) {
        trace_path = (std::filesystem::temp_directory_path() /
                      ("custody-compose-" + name + "-" + std::to_string(::getpid()) + ".ctrace"))
                         .string();
        trace::recorder_options o;
        o.path = trace_path;
        o.record_owner = true;
        recorder = std::make_unique<trace::recorder>(o);
    }
};

struct tracker_pool_chunked : stack_base<tracker_over<pool_over<journal_over<sim>>>> {
    static constexpr const char* name = "tracker > pool (chunks) > journal > device";
    explicit tracker_pool_chunked(const variant& v) {
        resource = std::make_unique<resource_type>(tracker_options(v, history), pool_options_of(v), history, 0, 4096 * MiB);
    }
};
struct tracker_pool_mapped : stack_base<tracker_over<pool_over<mapped>>> {
    static constexpr const char* name = "tracker > pool (mapped) > virtual memory";
    explicit tracker_pool_mapped(const variant& v) {
        resource = std::make_unique<resource_type>(tracker_options(v, history), pool_options_of(v), 0, 1024 * MiB, granules());
    }
};
struct tracker_sleepable : stack_base<tracker_over<sleepable>> {
    static constexpr const char* name = "tracker > sleepable memory";
    explicit tracker_sleepable(const variant& v) {
        resource = std::make_unique<resource_type>(tracker_options(v, history), 0);
    }
};
struct tracker_pool_sleepable : stack_base<tracker_over<pool_over<sleepable>>> {
    static constexpr const char* name = "tracker > pool (chunks) > sleepable memory, one owner";
    static constexpr bool single_owner = true;
    explicit tracker_pool_sleepable(const variant& v) {
        debug::owner_scope owner(owners[1]); // the pool's first chunk is the owner's too
        resource = std::make_unique<resource_type>(tracker_options(v, history), pool_options_of(v), 0);
    }
};
struct recorder_tracker_pool : stack_base<recorder_over<tracker_over<pool_over<journal_over<sim>>>>> {
    static constexpr const char* name = "recorder > tracker > pool > journal > device";
    explicit recorder_tracker_pool(const variant& v) {
        start_recorder("rtp");
        resource = std::make_unique<resource_type>(*recorder, tracker_options(v, history), pool_options_of(v), history,
                                                   0, 4096 * MiB);
    }
};
struct tracker_recorder_sleepable : stack_base<tracker_over<recorder_over<sleepable>>> {
    static constexpr const char* name = "tracker > recorder > sleepable memory";
    explicit tracker_recorder_sleepable(const variant& v) {
        start_recorder("trs");
        resource = std::make_unique<resource_type>(tracker_options(v, history), *recorder, 0);
    }
};
struct pool_tracker : stack_base<pool_over<tracker_over<sim>>> {
    static constexpr const char* name = "pool > tracker > device";
    explicit pool_tracker(const variant& v) {
        resource = std::make_unique<resource_type>(pool_options_of(v), tracker_options(v, history), 0, 4096 * MiB);
    }
};
struct tracker_sleepable_pooled_backing : stack_base<tracker_over<sleepable_pooled_backing>> {
    static constexpr const char* name = "tracker > sleepable memory offloading into a pool";
    explicit tracker_sleepable_pooled_backing(const variant& v) {
        resource = std::make_unique<resource_type>(tracker_options(v, history), 0, sleep::sleep_options{},
                                                   pool_options_of(v));
    }
};

using stacks = std::tuple<tracker_pool_chunked, tracker_pool_mapped, tracker_sleepable, tracker_pool_sleepable,
                          recorder_tracker_pool, tracker_recorder_sleepable, pool_tracker,
                          tracker_sleepable_pooled_backing>;

// ---- finding layers -------------------------------------------------------------------------------

/// The first layer of `r` (itself or below) that satisfies Pred, or nullptr.
template <template <class> class Pred, class R>
auto* find_layer(R& r) {
    if constexpr (Pred<R>::value) {
        return &r;
    } else if constexpr (has_upstream<R>) {
        return find_layer<Pred>(r.upstream());
    } else {
        return static_cast<void*>(nullptr);
    }
}
template <class R> struct sleepable_layer : std::bool_constant<is_sleepable<R>> {};
template <class R> struct journal_layer : std::bool_constant<is_journal<R>> {};
template <class R> struct pool_layer : std::bool_constant<is_pool<R>> {};

// ---- the checks, layer by layer ---------------------------------------------------------------------

/// A PyTorch snapshot of what `t` holds (with the journal's segments when there is one below it):
/// every live block once, at the user's address, which its alloc event names.
template <class Tracker>
void check_snapshot(Tracker& t, const expected& e, debug::allocation_history& history) {
    debug::device_memory_state d;
    d.device = 0;
    if constexpr (!std::is_same_v<decltype(find_layer<journal_layer>(t)), void*>) {
        d.segments = find_layer<journal_layer>(t)->segments();
    }
    d.blocks = t.live_blocks();
    d.history = history.events();
    const debug::pytorch_snapshot s = debug::make_pytorch_snapshot({d});
    std::multiset<std::uintptr_t> active;
    for (const auto& seg : s.segments) {
        std::uintptr_t at = seg.address;
        for (const auto& b : seg.blocks) {
            REQUIRE(b.address == at); // blocks tile their segment
            at += b.size;
            if (b.state != "inactive") {
                active.insert(b.address);
                REQUIRE(e.blocks.count(b.address) == 1);
                CHECK(b.frames.back().name == e.blocks.at(b.address).second);
            }
        }
    }
    CHECK(active.size() == e.blocks.size());
    CHECK(std::set<std::uintptr_t>(active.begin(), active.end()).size() == active.size());
    std::map<std::uintptr_t, std::size_t> allocated; // alloc events not yet freed: address -> size
    for (const auto& entry : s.device_traces.at(0)) {
        if (entry.action == debug::history_action::alloc) allocated[entry.address] = entry.size;
        if (entry.action == debug::history_action::free_completed) allocated.erase(entry.address);
    }
    std::map<std::uintptr_t, std::size_t> held;
    for (const auto& [a, b] : e.blocks) held[a] = b.first;
    CHECK(allocated == held);
}

template <class R>
void check_layers(R& r, const expected& e, debug::allocation_history& history);

template <class Upstream>
void check_tracker(tracking_resource<Upstream>& t, const expected& e, debug::allocation_history& history) {
    CHECK(t.violation_count() == 0);
    const resource_statistics st = t.statistics();
    expected below;
    if (e.exact) {
        std::map<std::uintptr_t, std::pair<std::size_t, std::string>> seen;
        std::map<std::uintptr_t, std::string> outer_owners;
        for (const debug::live_block& b : t.live_blocks()) {
            CHECK(seen.emplace(b.address, std::pair(b.bytes, std::string(debug::owner_name(b.owner)))).second);
            below.blocks[b.outer] = {b.total, std::string(debug::owner_name(b.owner))};
            outer_owners[b.outer] = std::string(debug::owner_name(b.owner));
        }
        CHECK(seen == e.blocks);
        check_announced(outer_owners);
        CHECK(st.live_allocations == e.blocks.size());
        for (const auto& [owner, usage] : e.per_owner()) {
            const debug::owner_usage u = t.owner_live(owner);
            CHECK(u.live_bytes == usage.first);
            CHECK(u.live_count == usage.second);
        }
        // The report names every live block once: its groups add up to the model's, owner by owner.
        const debug::rank_report report = t.make_report();
        std::map<std::string, std::pair<std::size_t, std::size_t>> grouped;
        for (const auto& g : report.live.groups) {
            grouped[g.owner].first += g.bytes;
            grouped[g.owner].second += g.count;
        }
        CHECK(grouped == e.per_owner());
        check_snapshot(t, e, history);
    } else {
        below = expected{{}, false, st.reserved_bytes}; // a pool's chunks: what it holds, guards included
    }
    CHECK(st.live_bytes == e.total());
    check_layers(t.upstream(), below, history);
}

template <class R>
void check_layers(R& r, const expected& e, debug::allocation_history& history) {
    if constexpr (is_tracker<R>) {
        check_tracker(r, e, history);
    } else if constexpr (is_recorder<R>) {
        check_layers(r.upstream(), e, history); // it holds nothing; its trace is read at the end
    } else if constexpr (is_journal<R>) {
        std::size_t segments = 0;
        for (const auto& s : r.segments()) {
            segments += s.bytes;
            if (e.exact) CHECK(e.blocks.count(s.address) == 1);
        }
        CHECK(segments == e.total());
        check_layers(r.upstream(), e, history);
    } else if constexpr (is_pool<R>) {
        const resource_statistics st = r.statistics();
        if (e.exact) {
            CHECK(st.live_allocations == e.blocks.size());
            CHECK(st.live_bytes == e.total());
        } else {
            CHECK(st.live_bytes == e.bytes); // a pool over a pool's chunks
        }
        CHECK(r.detailed_statistics().misuses == 0);
        if constexpr (std::is_same_v<typename R::upstream_type, mapped>) {
            CHECK(r.upstream().vmm_statistics().placed_bytes == st.reserved_bytes); // its own range, mapped by the pool
        } else {
            check_layers(r.upstream(), expected{{}, false, st.reserved_bytes}, history);
        }
    } else if constexpr (is_sleepable<R>) {
        const resource_statistics st = r.statistics();
        CHECK(st.live_bytes == e.total());
        if (e.exact) {
            CHECK(st.live_allocations == e.blocks.size());
            for (const auto& [owner, usage] : e.per_owner()) {
                const sleep::owner_memory m = r.owner_statistics(owner);
                CHECK(m.bytes == usage.first);
                CHECK(m.blocks == usage.second);
            }
        }
    } else {
        const resource_statistics st = r.statistics(); // a leaf
        CHECK(st.live_bytes == e.total());
        if (e.exact) CHECK(st.live_allocations == e.blocks.size());
    }
}

// ---- the model ----------------------------------------------------------------------------------------

unsigned char cookie_byte(unsigned seed, std::size_t i) { return static_cast<unsigned char>(seed * 131U + i * 7U + (i >> 9)); }

/// The bytes of a block the model writes and reads back: every byte of a small block; of a large
/// one, 4 KiB at each end and every 61st byte between (what keeps the model fast under the
/// sanitizers, and still finds a block whose contents moved, were zeroed or overwritten).
template <class F>
void for_each_checked(std::size_t bytes, F&& f) {
    const std::size_t edge = 4 * KiB;
    if (bytes <= 4 * edge) {
        for (std::size_t i = 0; i < bytes; ++i) f(i);
        return;
    }
    for (std::size_t i = 0; i < edge; ++i) {
        f(i);
        f(bytes - 1 - i);
    }
    for (std::size_t i = edge; i < bytes - edge; i += 61) f(i);
}

void write_cookie(void* p, const user_block& b) {
    auto* bytes = static_cast<unsigned char*>(p);
    for_each_checked(b.bytes, [&](std::size_t i) { bytes[i] = cookie_byte(b.seed, i); });
}
/// How many of the checked bytes of the block at `p` differ from what its user last wrote (zeros
/// after a discard).
std::size_t damaged(const void* p, const user_block& b) {
    const auto* bytes = static_cast<const unsigned char*>(p);
    std::size_t n = 0;
    for_each_checked(b.bytes, [&](std::size_t i) { n += bytes[i] != (b.zeroed ? 0 : cookie_byte(b.seed, i)) ? 1U : 0U; });
    return n;
}

template <class Stack>
class model {
public:
    model(Stack& stack, std::uint32_t seed) : stack_(stack), rng_(seed) {}

    void run(int steps) {
        for (int step = 0; step < steps; ++step) {
            const unsigned roll = rng_() % 100;
            if (roll < 55 || live_.empty()) {
                allocate();
            } else if (roll < 92) {
                free(pick());
            } else {
                sleep_and_wake();
            }
            if (step % 25 == 24) check();
        }
        check();
        while (!live_.empty()) free(live_.begin()->first);
        check();
    }

    /// Every allocation made, in order, with its owner (what a recorder must have seen).
    [[nodiscard]] const std::vector<std::pair<std::size_t, std::string>>& allocations() const { return allocations_; }
    [[nodiscard]] std::size_t frees() const { return frees_; }

private:
    using resource_type = typename Stack::resource_type;

    void allocate() {
        const std::string owner = Stack::single_owner ? owners[1] : owners[rng_() % owners.size()];
        const std::size_t bytes = rng_() % 10 == 0 ? (1 + rng_() % 3) * MiB / 2 + rng_() % 4096 : 1 + rng_() % (64 * KiB);
        void* p = nullptr;
        if constexpr (is_tracker<resource_type>) {
            if (rng_() % 2 == 0) p = stack_.resource->allocate(stream{}, bytes, alignment, owner); // explicit
        }
        if (p == nullptr) {
            debug::owner_scope scope(owner);
            p = stack_.resource->allocate(stream{}, bytes, alignment);
        }
        REQUIRE(p != nullptr);
        const user_block b{bytes, owner, next_seed_++, false};
        write_cookie(p, b);
        REQUIRE(live_.emplace(p, b).second);
        allocations_.emplace_back(bytes, owner);
    }

    void* pick() {
        auto it = live_.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng_() % live_.size()));
        return it->first;
    }

    /// Gives the block at `p` back, after checking its cookie (unless its memory sleeps).
    void free(void* p, bool asleep = false) {
        const user_block b = live_.at(p);
        if (!asleep) CHECK(damaged(p, b) == 0);
        stack_.resource->deallocate(stream{}, p, b.bytes, alignment);
        live_.erase(p);
        ++frees_;
    }

    /// Where memory sleeps: an owner to sleep under a random policy, maybe one of its blocks freed
    /// while it sleeps, the wake; then the contents are as the policy says, and written again.
    void sleep_and_wake() {
        auto* memory = find_layer<sleepable_layer>(*stack_.resource);
        if constexpr (!std::is_same_v<decltype(memory), void*>) {
            const std::string owner = Stack::single_owner ? owners[1] : owners[rng_() % owners.size()];
            const sleep_policy policy = rng_() % 2 == 0 ? sleep_policy::discard : sleep_policy::offload;
            memory->sleep({{owner, policy}});
            CHECK(memory->owner_statistics(owner).mapped_bytes == 0);
            for (auto& [p, b] : live_) {
                if (b.owner == owner && rng_() % 4 == 0) {
                    free(p, true); // given back asleep: no guard checked, nothing touched
                    break;
                }
            }
            memory->wake({owner});
            for (auto& [p, b] : live_) {
                if (b.owner != owner || policy == sleep_policy::offload) continue;
                b.zeroed = true;
            }
            check_contents();
            for (auto& [p, b] : live_) {
                if (b.zeroed) {
                    b.zeroed = false;
                    b.seed = next_seed_++;
                    write_cookie(p, b);
                }
            }
        }
    }

    void check_contents() {
        for (const auto& [p, b] : live_) CHECK(damaged(p, b) == 0);
    }

    void check() {
        check_contents();
        expected e;
        for (const auto& [p, b] : live_) e.blocks[reinterpret_cast<std::uintptr_t>(p)] = {b.bytes, b.owner};
        check_layers(*stack_.resource, e, *stack_.history);
    }

    Stack& stack_;
    std::mt19937 rng_;
    std::map<void*, user_block> live_;
    std::vector<std::pair<std::size_t, std::string>> allocations_;
    std::size_t frees_ = 0;
    unsigned next_seed_ = 1;
};

/// The trace a recorder in the stack wrote: one allocate per allocation, with the size the layer
/// above it asked (the user's, or with the tracker's guards) and the owner the tracker charged; one
/// deallocate per free.
template <class Stack>
void check_trace(const Stack& stack, const model<Stack>& m, const variant& v) {
    trace::reader in(stack.trace_path);
    std::vector<std::pair<std::size_t, std::string>> allocations;
    std::size_t frees = 0;
    for (trace::event e; in.next(e);) {
        if (e.kind == trace::event_kind::allocate) {
            REQUIRE(e.owner >= 1);
            allocations.emplace_back(e.bytes, in.header().owners.at(e.owner - 1));
        }
        if (e.kind == trace::event_kind::deallocate) ++frees;
    }
    REQUIRE(allocations.size() == m.allocations().size());
    for (std::size_t i = 0; i < allocations.size(); ++i) {
        CHECK(allocations[i].second == m.allocations()[i].second);
        if (is_tracker<typename Stack::resource_type> && v.canaries) {
            CHECK(allocations[i].first > m.allocations()[i].first); // the tracker's block, guards included
        } else {
            CHECK(allocations[i].first == m.allocations()[i].first);
        }
    }
    CHECK(frees == m.frees());
    std::filesystem::remove(stack.trace_path);
}

} // namespace

TEMPLATE_LIST_TEST_CASE("compose: every stack keeps contents, counts in every layer, and names each live block once",
                        "[debug][compose]", stacks) {
    std::uint32_t seed = 1;
    constexpr bool has_pool = !std::is_same_v<decltype(find_layer<pool_layer>(std::declval<typename TestType::resource_type&>())), void*>;
    for (const bool annotate : {true, false}) {
        for (const bool checked : {true, false}) {
            if (!has_pool && !checked) continue; // checked mode is the pool's
            for (const bool canaries : {true, false}) {
                const variant v{annotate, checked, canaries};
                INFO(TestType::name << ", " << describe(v));
                annotating = annotate;
                custody_nvtx_test::forget(); // names of blocks gone with earlier runs
                TestType stack(v);
                model<TestType> m(stack, seed++);
                m.run(100);
                stack.resource.reset();
                if (stack.recorder) {
                    stack.recorder.reset(); // closes the trace
                    check_trace(stack, m, v);
                }
            }
        }
    }
}

TEST_CASE("compose: the staging ring over a tracker, a pool and a recorder: one block each, named, contents intact",
          "[debug][compose][staging]") {
    for (const bool annotate : {true, false}) {
        INFO("annotate " << annotate);
        staging::ring_options ro;
        ro.capacity = 1 * MiB;
        ro.annotate = annotate;
        auto history = std::make_shared<debug::allocation_history>(64);
        variant v{annotate, true, true};
        debug::owner_scope owner("staging");
        staging::staging_ring<tracker_over<pool_over<resource::host_memory>>> ring(ro, tracker_options(v, history),
                                                                             pool_options_of(v));
        const auto blocks = ring.upstream().live_blocks();
        REQUIRE(blocks.size() == 1);
        CHECK(debug::owner_name(blocks[0].owner) == "staging");
        CHECK(blocks[0].bytes == ring.capacity());
        CHECK(ring.upstream().upstream().statistics().live_allocations == 1);

        std::vector<unsigned char> source(3 * MiB + 17), device(source.size()), back(source.size());
        for (std::size_t i = 0; i < source.size(); ++i) source[i] = cookie_byte(9, i);
        host::stream s;
        ring.copy_to_device(std::span<const unsigned char>(source), device.data(), s);
        host::platform::synchronize(s);
        ring.copy_from_device(device.data(), std::span<unsigned char>(back), s);
        CHECK(back == source);
        CHECK(ring.upstream().violation_count() == 0);
    }
}

TEST_CASE("compose: a tracker over sleepable memory keeps its guards through a discard, and its owners are the memory's",
          "[debug][compose][sleep]") {
    tracking_resource<sleepable> t(tracking_options{}, 0);
    const std::size_t n = 4 * MiB;
    void* p = nullptr;
    {
        debug::owner_scope scope("kv_cache");
        p = t.allocate(stream{}, n, 256);
    }
    std::memset(p, 0x5a, n);
    void* named = t.allocate(stream{}, 256, 256, "kv_cache"); // the owner given to the tracker
    CHECK(t.upstream().owner_statistics("kv_cache").blocks == 2);

    t.upstream().sleep({{"kv_cache", sleep_policy::discard}});
    t.upstream().wake({"kv_cache"});
    CHECK(damaged(p, user_block{n, "kv_cache", 0, true}) == 0); // what the owner wrote is gone
    t.deallocate(stream{}, p, n, 256);                           // the guards are not
    t.deallocate(stream{}, named, 256, 256);
    CHECK(t.violation_count() == 0);

    SECTION("an overwritten guard is still found after a discard") {
        debug::owner_scope scope("kv_cache");
        tracking_options o;
        o.on_violation = debug::policy::ignore;
        tracking_resource<sleepable> u(o, 0);
        auto* q = static_cast<unsigned char*>(u.allocate(stream{}, n, 256));
        q[n] = 0; // one byte past the block
        u.upstream().sleep({{"kv_cache", sleep_policy::discard}});
        u.upstream().wake({"kv_cache"});
        u.deallocate(stream{}, q, n, 256);
        REQUIRE(u.violation_count() == 1);
        CHECK(u.violations().at(0).kind == debug::violation_kind::buffer_overflow);
    }
    SECTION("a block freed while its owner sleeps is given back without its bytes being touched") {
        void* q = t.allocate(stream{}, n, 256, "kv_cache");
        t.upstream().sleep({{"kv_cache", sleep_policy::offload}});
        t.deallocate(stream{}, q, n, 256);
        CHECK(t.violation_count() == 0);
        CHECK(t.upstream().owner_statistics("kv_cache").blocks == 0);
        t.upstream().wake({"kv_cache"});
    }
}
