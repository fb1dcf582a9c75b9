// A libFuzzer target for what a caller hands custody as values of its own: the state a PyTorch-format
// snapshot is made from (device numbers, owner names, frames, states, addresses), the sleep API's
// owner lists and policies (sleepable_memory on the host platform), and the mapped pool's options
// and sizes (stream_ordered_pool over resource::virtual_memory<host::vmm>). The input's first byte
// picks the surface; the rest are its values, read as they come (an input too short reads zeros).
//
// Besides crashes, undefined behaviour, leaks and runaway memory (the sanitizers, -rss_limit_mb),
// it checks properties:
//  - snapshot: make_pytorch_snapshot throws std::invalid_argument for a device above
//    max_snapshot_device and nothing else; each segment's blocks tile it; the pickle reads back
//    (every opcode the writer uses, decoded here) to as many segments and device traces, with
//    every string valid UTF-8;
//  - sleep: every call succeeds or throws what a model of the owners says it must (an owner named
//    twice, asleep or awake); after a wake, offloaded blocks hold their bytes and discarded ones
//    zeros; live bytes and owners' states agree with the model;
//  - pool: options are refused at construction with std::invalid_argument or nothing; an
//    allocation returns an aligned, writable pointer or throws custody::out_of_memory, never
//    anything else; once everything is freed nothing is live.
#include <custody/debug/detail/json_utf8.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/pytorch_snapshot.hpp>
#include <custody/platform/host.hpp>
#include <custody/platform/host_vmm.hpp>
#include <custody/pool/stream_ordered_pool.hpp>
#include <custody/resource/host_memory.hpp>
#include <custody/resource/virtual_memory.hpp>
#include <custody/sleep/sleepable_memory.hpp>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <iterator>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

[[noreturn]] void broken(const char* what, std::string_view detail = {}) {
    std::fprintf(stderr, "surfaces_fuzz: %s\n%.*s\n", what, static_cast<int>(std::min<std::size_t>(detail.size(), 2000)),
                 detail.data());
    std::abort();
}

/// The input's bytes as values, in order; past the end every value is 0.
class values {
public:
    values(const std::uint8_t* data, std::size_t size) noexcept : data_(data), size_(size) {}
    [[nodiscard]] bool done() const noexcept { return at_ >= size_; }
    std::uint64_t number(int bytes) noexcept {
        std::uint64_t v = 0;
        for (int i = 0; i < bytes; ++i) v |= std::uint64_t{byte()} << (8 * i);
        return v;
    }
    std::uint8_t byte() noexcept { return at_ < size_ ? data_[at_++] : 0; }
    /// Up to `most` bytes: a length byte, then that many.
    std::string text(std::size_t most) {
        const std::size_t n = std::min<std::size_t>(byte(), most);
        std::string s;
        for (std::size_t i = 0; i < n && !done(); ++i) s += static_cast<char>(byte());
        return s;
    }
    /// A size from a few shapes: small, pages, powers of two up to 2^63, near SIZE_MAX, any.
    std::size_t size() noexcept {
        switch (byte() % 6) {
        case 0: return number(1);
        case 1: return number(2);
        case 2: return (number(1) + 1) * 4096;
        case 3: return std::size_t{1} << (byte() % 64);
        case 4: return SIZE_MAX - number(1);
        default: return number(8);
        }
    }

private:
    const std::uint8_t* data_;
    std::size_t size_;
    std::size_t at_ = 0;
};

// ---- the snapshot ----------------------------------------------------------------------------------

/// A value of the pickle, as far as the check needs it.
struct pickled {
    enum class kind { none, boolean, integer, text, tuple, list, dict } what = kind::none;
    std::vector<pickled> items; ///< a list's or tuple's items; a dict's keys and values alternately
};

/// Decodes the opcodes pickle_writer writes; anything else is a finding.
pickled read_pickle(std::string_view p) {
    std::vector<pickled> stack;
    std::vector<std::size_t> marks;
    std::size_t at = 0;
    const auto need = [&](std::size_t n) {
        if (p.size() - at < n) broken("the pickle ends early");
    };
    const auto little = [&](std::size_t n) {
        need(n);
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t{static_cast<unsigned char>(p[at + i])} << (8 * i);
        at += n;
        return v;
    };
    const auto to_mark = [&] {
        if (marks.empty()) broken("a pickle opcode without its mark");
        std::vector<pickled> top(stack.begin() + static_cast<std::ptrdiff_t>(marks.back()), stack.end());
        stack.resize(marks.back());
        marks.pop_back();
        if (stack.empty()) broken("a pickle's items with no container");
        return top;
    };
    if (p.substr(0, 2) != "\x80\x02") broken("the pickle does not start with protocol 2");
    at = 2;
    while (true) {
        need(1);
        const char op = p[at++];
        switch (op) {
        case '.':
            if (stack.size() != 1 || !marks.empty() || at != p.size()) broken("the pickle does not end with one value");
            return stack.back();
        case '}': stack.push_back({pickled::kind::dict, {}}); break;
        case ']': stack.push_back({pickled::kind::list, {}}); break;
        case '(': marks.push_back(stack.size()); break;
        case 'N': stack.push_back({pickled::kind::none, {}}); break;
        case '\x88':
        case '\x89': stack.push_back({pickled::kind::boolean, {}}); break;
        case 'K': at += (need(1), 1); stack.push_back({pickled::kind::integer, {}}); break;
        case 'J': at += (need(4), 4); stack.push_back({pickled::kind::integer, {}}); break;
        case '\x8a': {
            const std::size_t n = little(1);
            at += (need(n), n);
            stack.push_back({pickled::kind::integer, {}});
            break;
        }
        case 'X': {
            const std::size_t n = little(4);
            need(n);
            if (!custody::debug::detail::json::is_valid_utf8(p.substr(at, n))) broken("a pickled string is not UTF-8");
            at += n;
            stack.push_back({pickled::kind::text, {}});
            break;
        }
        case '\x86': {
            if (stack.size() < 2) broken("TUPLE2 with fewer than two values");
            pickled t{pickled::kind::tuple, {stack[stack.size() - 2], stack.back()}};
            stack.resize(stack.size() - 2);
            stack.push_back(std::move(t));
            break;
        }
        case 'u':
        case 'e': {
            std::vector<pickled> items = to_mark();
            pickled& into = stack.back();
            if (into.what != (op == 'u' ? pickled::kind::dict : pickled::kind::list)) broken("items into the wrong container");
            if (op == 'u' && items.size() % 2 != 0) broken("a dict's items are not pairs");
            for (pickled& i : items) into.items.push_back(std::move(i));
            break;
        }
        default: broken("an opcode pickle_writer does not write");
        }
    }
}

/// The dict's value under the key at position `k` (keys are in the writer's order).
const pickled& value_at(const pickled& dict, std::size_t k) {
    if (dict.what != pickled::kind::dict || dict.items.size() < 2 * k + 2) broken("a dict without its key");
    return dict.items[2 * k + 1];
}

void fuzz_snapshot(values& in) {
    std::vector<custody::debug::device_memory_state> devices(1 + in.byte() % 3);
    std::vector<custody::debug::owner_id> owners{nullptr};
    for (int i = 0; i < 3; ++i) owners.push_back(custody::debug::intern_owner(in.text(12)));
    for (auto& d : devices) {
        const std::uint8_t how = in.byte();
        d.device = how < 200 ? how % 8 - 1 : static_cast<int>(static_cast<std::int32_t>(in.number(4)));
        for (std::size_t n = in.byte() % 5; n > 0; --n) {
            d.segments.push_back({static_cast<std::uintptr_t>(in.number(2)) << 12, in.size() & ((std::size_t{1} << 40) - 1),
                                  in.number(1), static_cast<std::int64_t>(in.number(8))});
        }
        for (std::size_t n = in.byte() % 9; n > 0; --n) {
            custody::debug::live_block b;
            b.outer = static_cast<std::uintptr_t>(in.number(2)) << 8;
            b.address = b.outer + in.number(1);
            b.total = in.size();
            b.bytes = in.size();
            b.owner = owners[in.byte() % owners.size()];
            b.stream = in.number(1);
            if (in.byte() % 4 == 0) d.pending_free.push_back(b.address);
            d.blocks.push_back(std::move(b));
        }
        for (std::size_t n = in.byte() % 9; n > 0; --n) {
            custody::debug::history_event e;
            e.action = static_cast<custody::debug::history_action>(in.byte() % 6);
            e.address = in.number(8);
            e.bytes = in.size();
            e.stream = in.number(8);
            e.unix_ns = static_cast<std::int64_t>(in.number(8));
            e.owner = owners[in.byte() % owners.size()];
            d.history.push_back(std::move(e));
        }
    }
    // The frame text of custody's call stacks, parsed as the snapshot parses it.
    for (int i = 0; i < 2; ++i) static_cast<void>(custody::debug::detail::parse_frame(in.text(80)));

    int highest = -1;
    for (const auto& d : devices) highest = std::max(highest, d.device);
    custody::debug::pytorch_snapshot s;
    try {
        s = custody::debug::make_pytorch_snapshot(devices);
    } catch (const std::invalid_argument&) {
        if (highest <= custody::debug::max_snapshot_device) broken("a snapshot of devices in range was refused");
        return;
    }
    if (highest > custody::debug::max_snapshot_device) broken("a device above the highest was taken");
    if (s.device_traces.size() != static_cast<std::size_t>(highest + 1)) broken("a trace list per device");
    for (const custody::debug::snapshot_segment& seg : s.segments) {
        if (seg.address > UINTPTR_MAX - seg.total_size) continue; // a segment past the address space: no tiling to check
        std::uintptr_t at = seg.address;
        for (const custody::debug::snapshot_block& b : seg.blocks) {
            if (b.address != at) broken("a segment's blocks do not tile it");
            at += b.size;
        }
        if (at != seg.address + seg.total_size) broken("a segment's blocks do not cover it");
    }
    const pickled root = read_pickle(custody::debug::to_pickle(s));
    if (value_at(root, 0).items.size() != s.segments.size()) broken("the pickle's segments differ");
    if (value_at(root, 1).items.size() != s.device_traces.size()) broken("the pickle's device traces differ");
}

// ---- sleep and wake --------------------------------------------------------------------------------

using sleepable = custody::sleep::sleepable_memory<custody::host::vmm, custody::resource::host_memory>;

struct model_block {
    std::size_t bytes;
    custody::debug::owner_id owner;
    std::vector<unsigned char> contents;
};

void fill(void* p, model_block& b, std::uint8_t seed) {
    for (std::size_t i = 0; i < b.bytes; ++i) b.contents[i] = static_cast<unsigned char>(seed + i * 7);
    std::memcpy(p, b.contents.data(), b.bytes);
}

/// The owners a request names: up to four of the table's names, by the input's choice (the same
/// one twice, "" and "<untagged>" included).
std::vector<std::string_view> names_of(values& in, const std::vector<std::string>& table) {
    std::vector<std::string_view> out;
    for (std::size_t n = in.byte() % 5; n > 0; --n) out.emplace_back(table[in.byte() % table.size()]);
    return out;
}

void fuzz_sleep(values& in) {
    std::vector<std::string> table{"", std::string(custody::debug::untagged_owner)};
    for (int i = 0; i < 3; ++i) table.push_back(in.text(10));
    sleepable memory(0);
    const std::size_t page = memory.granularity();
    std::map<void*, model_block> live;
    std::map<custody::debug::owner_id, custody::sleep::sleep_policy> asleep;
    // What the model says of a request, owner by owner as the resource checks them: 0 it goes
    // ahead, 1 an owner named twice, 2 an owner asleep (a sleep) or awake (a wake).
    const auto expected = [&](const std::vector<custody::debug::owner_id>& ids, bool waking) -> int {
        for (auto it = ids.begin(); it != ids.end(); ++it) {
            if (std::find(ids.begin(), it, *it) != it) return 1;
            if ((asleep.count(*it) != 0) != waking) return 2;
        }
        return 0;
    };
    const auto ids_of = [](const std::vector<std::string_view>& names) {
        std::vector<custody::debug::owner_id> ids;
        for (const std::string_view name : names) ids.push_back(custody::debug::intern_owner(name));
        return ids;
    };
    for (int step = 0; step < 48 && !in.done(); ++step) {
        switch (in.byte() % 5) {
        case 0: { // allocate for an owner
            const std::size_t bytes = 1 + in.number(2) % (3 * page);
            const auto owner = custody::debug::intern_owner(table[in.byte() % table.size()]);
            try {
                void* p = memory.allocate(custody::host::stream_view{}, bytes, 256, owner);
                if (asleep.count(owner) != 0) broken("allocated for a sleeping owner");
                model_block b{bytes, owner, std::vector<unsigned char>(bytes)};
                fill(p, b, in.byte());
                live.emplace(p, std::move(b));
            } catch (const custody::sleep::sleep_error& e) {
                if (asleep.count(owner) == 0) broken("an awake owner refused", e.what());
            }
            break;
        }
        case 1: { // free a block, asleep or not
            if (live.empty()) break;
            auto it = live.begin();
            std::advance(it, static_cast<std::ptrdiff_t>(in.byte() % live.size()));
            memory.deallocate_sync(it->first, it->second.bytes, 256);
            live.erase(it);
            break;
        }
        case 2: { // sleep
            const std::vector<std::string_view> names = names_of(in, table);
            const std::vector<custody::debug::owner_id> ids = ids_of(names);
            std::vector<custody::sleep::owner_sleep> request;
            for (const std::string_view name : names) {
                request.push_back({name, in.byte() % 2 != 0 ? custody::sleep::sleep_policy::offload
                                                             : custody::sleep::sleep_policy::discard});
            }
            const int must = expected(ids, false);
            try {
                memory.sleep(std::span<const custody::sleep::owner_sleep>(request));
                if (must != 0) broken("a sleep the owners forbid went ahead");
                for (std::size_t i = 0; i < ids.size(); ++i) asleep[ids[i]] = request[i].policy;
            } catch (const std::invalid_argument& e) {
                if (must != 1) broken("a sleep refused as naming an owner twice", e.what());
            } catch (const custody::sleep::sleep_error& e) {
                if (must != 2) broken("a sleep refused for an owner's state", e.what());
            }
            break;
        }
        case 3: { // wake, then check what the woken blocks hold
            const std::vector<std::string_view> names = names_of(in, table);
            const std::vector<custody::debug::owner_id> ids = ids_of(names);
            const int must = expected(ids, true);
            try {
                memory.wake(std::span<const std::string_view>(names));
                if (must != 0) broken("a wake the owners forbid went ahead");
            } catch (const std::invalid_argument& e) {
                if (must != 1) broken("a wake refused as naming an owner twice", e.what());
                break;
            } catch (const custody::sleep::sleep_error& e) {
                if (must != 2) broken("a wake refused for an owner's state", e.what());
                break;
            }
            for (auto& [p, b] : live) {
                const auto slept = asleep.find(b.owner);
                if (slept == asleep.end() || std::find(ids.begin(), ids.end(), b.owner) == ids.end()) continue;
                if (slept->second == custody::sleep::sleep_policy::discard) std::fill(b.contents.begin(), b.contents.end(), 0);
                if (std::memcmp(p, b.contents.data(), b.bytes) != 0) broken("a woken block does not hold what it should");
            }
            for (const auto id : ids) asleep.erase(id);
            break;
        }
        default: { // the counts
            std::size_t bytes = 0;
            for (const auto& [p, b] : live) bytes += b.bytes;
            if (memory.statistics().live_bytes != bytes) broken("live bytes differ from the model's");
            for (const std::string& name : table) {
                if (memory.is_asleep(name) != (asleep.count(custody::debug::intern_owner(name)) != 0)) broken("an owner's state differs");
            }
        }
        }
    }
    for (const auto& [p, b] : live) memory.deallocate_sync(p, b.bytes, 256);
    if (memory.statistics().live_bytes != 0) broken("bytes live after every block was freed");
}

// ---- the mapped pool -------------------------------------------------------------------------------

using mapped_pool = custody::pool::stream_ordered_pool<custody::resource::virtual_memory<custody::host::vmm>>;

void fuzz_pool(values& in) {
    custody::pool::pool_options o;
    o.initial_size = in.byte() % 4 == 0 ? in.size() : 0;
    o.growth_step = in.byte() % 2 == 0 ? in.size() : o.growth_step;
    o.growth_divisor = in.number(1);
    o.maximum_size = in.byte() % 2 == 0 ? in.size() : SIZE_MAX;
    o.release_threshold = in.byte() % 2 == 0 ? in.size() : SIZE_MAX;
    o.reuse = static_cast<custody::pool::reuse_policy>(in.byte() % 3);
    o.record_interval = in.number(1);
    o.max_streams = in.number(1) % 8;
    o.device_capacity = in.byte() % 2 == 0 ? in.size() : 0;
    o.device_headroom = in.byte() % 2 == 0 ? in.size() : custody::pool::automatic_headroom;
    // Granules of a GPU's 2 MiB, or of a page (the host's own) over at most 256 MiB: the range maps,
    // and keeps its books, granule by granule, so that a page granule over gigabytes costs an input
    // seconds of system calls and nothing the smaller range does not show.
    custody::resource::reservation_options r;
    const bool pages = in.byte() % 4 == 0;
    r.granule = pages ? 0 : std::size_t{2} << 20;
    const std::size_t capacity = std::max<std::size_t>(in.size() & ((std::size_t{1} << (pages ? 28 : 36)) - 1), 1);
    std::unique_ptr<mapped_pool> pool;
    try {
        pool = std::make_unique<mapped_pool>(o, 0, capacity, r);
    } catch (const std::invalid_argument&) {
        return; // options it refuses, by name
    } catch (const custody::out_of_memory&) {
        return; // no address space, or an initial size it cannot map
    }
    std::vector<std::pair<void*, std::pair<std::size_t, std::size_t>>> held;
    for (int step = 0; step < 32 && !in.done(); ++step) {
        const std::uint8_t what = in.byte();
        if (what % 4 == 3 && !held.empty()) {
            const std::size_t i = in.byte() % held.size();
            pool->deallocate_sync(held[i].first, held[i].second.first, held[i].second.second);
            held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
            continue;
        }
        if (what == 0xFF) {
            static_cast<void>(pool->trim());
            continue;
        }
        const std::size_t bytes = in.size();
        const std::size_t alignment = std::size_t{1} << (in.byte() % 13);
        try {
            void* p = pool->allocate_sync(bytes, alignment);
            if (bytes == 0) {
                if (p != nullptr) pool->deallocate_sync(p, bytes, alignment);
                continue;
            }
            if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) broken("a block not aligned as asked");
            static_cast<unsigned char*>(p)[0] = 1;
            static_cast<unsigned char*>(p)[bytes - 1] = 2;
            held.push_back({p, {bytes, alignment}});
        } catch (const custody::out_of_memory&) {
        } catch (const std::exception& e) {
            broken("an allocation failed with something other than out_of_memory", e.what());
        }
    }
    for (const auto& [p, size] : held) pool->deallocate_sync(p, size.first, size.second);
    if (pool->statistics().live_bytes != 0) broken("bytes live after every block was freed");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    values in(data, size);
    switch (in.byte() % 3) {
    case 0: fuzz_snapshot(in); break;
    case 1: fuzz_sleep(in); break;
    default: fuzz_pool(in); break;
    }
    return 0;
}
