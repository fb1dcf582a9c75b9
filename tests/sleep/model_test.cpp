// A seeded model of sleepable_memory: 10^4 random allocations, frees, recorded uses, sleeps and
// wakes over four owners and four streams (three worker streams and the default one), with writes
// still queued on the streams when sleeps come, and a fault armed at a random step of one sleep or
// wake in ten. After every step the resource's counts, the pages the kernel reports and what the
// platform holds equal the model's exactly; blocks read back their cookie, or zeros after a
// discarding sleep.
#include "faulty_sleep.hpp"
#include "../support/host_pages.hpp"
#include "sleep_cases.hpp"

#include "../support/vmm_checks.hpp"

#include "../support/catch.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <vector>

using namespace custody_test::sleep_cases;
using namespace custody_test::faulty_sleep;

namespace {

using content = custody_test::sleep_cases::bytes;

constexpr int owner_count = 4;
constexpr int stream_count = 4; // stream 3 is the default stream
constexpr int steps = 10000;

struct model_block {
    void* ptr;
    std::size_t bytes;
    int owner;
    int stream;
    std::optional<int> recorded;
    content expected;                      // what the block holds once its streams are done
    std::shared_ptr<const content> source; // the cookie written on its stream, alive until the free
};

struct model_owner {
    bool asleep = false;
    sleep_policy policy = discard;
};

class model {
public:
    explicit model(std::uint64_t seed) : rng_(seed) {
        for (int i = 0; i < 3; ++i) streams_.emplace_back(0);
        for (int i = 0; i < owner_count; ++i) names_.push_back("model-owner-" + std::to_string(i));
        base_ = custody::test::vmm_held();
    }
    ~model() {
        for (model_block& b : blocks_) memory_.deallocate(stream(b.stream), b.ptr, b.bytes, 256);
    }

    void run() {
        for (int step = 0; step < steps; ++step) {
            INFO("step " << step);
            const int dice = pick(0, 99);
            if (dice < 30) {
                allocate();
            } else if (dice < 45) {
                free();
            } else if (dice < 50) {
                record_and_write();
            } else if (dice < 65) {
                sleep();
            } else if (dice < 80) {
                wake();
            } else {
                check_one();
            }
            check_counts();
        }
        for (model_block& b : blocks_) check_block(b);
    }

private:
    int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
    custody::test::faulty_stream_view stream(int i) const {
        return i == stream_count - 1 ? custody::test::faulty_stream_view{} : streams_[static_cast<std::size_t>(i)].view();
    }
    std::size_t span(std::size_t bytes) const { return (bytes + g_ - 1) / g_ * g_; }

    void allocate() {
        const int owner = pick(0, owner_count - 1);
        const int s = pick(0, stream_count - 1);
        const std::size_t bytes = static_cast<std::size_t>(pick(1, static_cast<int>(4 * g_)));
        const auto id = custody::debug::intern_owner(names_[static_cast<std::size_t>(owner)]);
        if (owners_[owner].asleep) {
            CHECK(refusal([&] { static_cast<void>(memory_.allocate(stream(s), bytes, 256, id)); }) ==
                  sleep_error::reason::owner_asleep);
            return;
        }
        void* p = memory_.allocate(stream(s), bytes, 256, id);
        auto source = std::make_shared<const content>(cookie(next_seed_++, bytes));
        P::memcpy_async(p, source->data(), bytes, stream(s)); // still queued when a sleep may come
        blocks_.push_back({p, bytes, owner, s, std::nullopt, *source, source});
    }

    void free() {
        if (blocks_.empty()) return;
        const auto i = static_cast<std::size_t>(pick(0, static_cast<int>(blocks_.size()) - 1));
        memory_.deallocate(stream(blocks_[i].stream), blocks_[i].ptr, blocks_[i].bytes, 256);
        blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
    }

    /// Another stream uses an awake block (ordered after its own stream's write): recorded, then a
    /// fill of its first bytes queued there.
    void record_and_write() {
        if (blocks_.empty()) return;
        model_block& b = blocks_[static_cast<std::size_t>(pick(0, static_cast<int>(blocks_.size()) - 1))];
        if (owners_[b.owner].asleep || b.recorded) return;
        const int other = (b.stream + 1) % 3; // a worker stream other than its own
        memory_.record(b.ptr, stream(other));
        b.recorded = other;
        P::event e(0);
        e.record(stream(b.stream));
        P::wait(stream(other), e);
        const std::size_t n = std::min<std::size_t>(b.bytes, 64);
        const auto value = static_cast<unsigned char>(pick(1, 255));
        P::memset_async(b.ptr, value, n, stream(other));
        std::fill(b.expected.begin(), b.expected.begin() + static_cast<std::ptrdiff_t>(n), value);
    }

    std::vector<int> some_owners() {
        std::vector<int> chosen;
        for (int o = 0; o < owner_count; ++o) {
            if (pick(0, 2) == 0) chosen.push_back(o);
        }
        if (chosen.empty()) chosen.push_back(pick(0, owner_count - 1));
        return chosen;
    }

    void sleep() {
        const std::vector<int> chosen = some_owners();
        std::vector<owner_sleep> request;
        std::vector<sleep_policy> policies;
        for (int o : chosen) {
            policies.push_back(pick(0, 1) == 0 ? offload : discard);
            request.push_back({names_[static_cast<std::size_t>(o)], policies.back()});
        }
        if (std::any_of(chosen.begin(), chosen.end(), [&](int o) { return owners_[o].asleep; })) {
            CHECK(refusal([&] { memory_.sleep(request); }) == sleep_error::reason::owner_asleep);
            return;
        }
        int offloaded_blocks = 0;
        for (std::size_t k = 0; k < chosen.size(); ++k) {
            for (const model_block& b : blocks_) offloaded_blocks += b.owner == chosen[k] && policies[k] == offload;
        }
        if (pick(0, 9) == 0) { // a fault at one step: nothing changes
            switch (offloaded_blocks == 0 ? 2 : pick(0, 2)) {
            case 0: memory_.backing().fail_at(static_cast<std::uint64_t>(pick(1, offloaded_blocks))); break;
            case 1: platform_faults::copy_at = pick(1, offloaded_blocks); break;
            default: platform_faults::event_synchronize = 1; break; // the fence's wait
            }
            CHECK_THROWS(memory_.sleep(request));
            disarm();
            return;
        }
        memory_.sleep(request);
        for (std::size_t k = 0; k < chosen.size(); ++k) owners_[chosen[k]] = {true, policies[k]};
        for (model_block& b : blocks_) {
            if (owners_[b.owner].asleep) CHECK(custody_test::host_pages::resident_bytes(b.ptr, span(b.bytes)) == 0);
        }
    }

    void wake() {
        const std::vector<int> chosen = some_owners();
        std::vector<std::string_view> request;
        for (int o : chosen) request.emplace_back(names_[static_cast<std::size_t>(o)]);
        if (std::any_of(chosen.begin(), chosen.end(), [&](int o) { return !owners_[o].asleep; })) {
            CHECK(refusal([&] { memory_.wake(request); }) == sleep_error::reason::owner_awake);
            return;
        }
        int blocks = 0;
        int offloaded = 0;
        int discarded = 0;
        for (const model_block& b : blocks_) {
            if (std::find(chosen.begin(), chosen.end(), b.owner) == chosen.end()) continue;
            ++blocks;
            (owners_[b.owner].policy == offload ? offloaded : discarded) += 1;
        }
        if (pick(0, 9) == 0) {
            const int kind = pick(0, 4);
            if (kind == 0 && blocks > 0) {
                vmm_faults::arm(vmm_op::create, pick(1, blocks), vmm_fault::exhausted);
            } else if (kind == 1 && blocks > 0) {
                vmm_faults::arm(vmm_op::map, pick(1, blocks));
            } else if (kind == 2 && offloaded > 0) {
                platform_faults::copy_at = pick(1, offloaded);
            } else if (kind == 3 && discarded > 0) {
                platform_faults::fill_at = pick(1, discarded);
            } else {
                platform_faults::stream_synchronize = 1;
            }
            CHECK_THROWS(memory_.wake(request));
            disarm();
            return;
        }
        memory_.wake(request);
        for (int o : chosen) {
            for (model_block& b : blocks_) {
                if (b.owner == o && owners_[o].policy == discard) b.expected.assign(b.bytes, 0);
            }
            owners_[o].asleep = false;
        }
    }

    void check_one() {
        if (blocks_.empty()) return;
        check_block(blocks_[static_cast<std::size_t>(pick(0, static_cast<int>(blocks_.size()) - 1))]);
    }

    void check_block(const model_block& b) {
        if (owners_[b.owner].asleep) {
            CHECK(custody_test::host_pages::resident_bytes(b.ptr, span(b.bytes)) == 0);
            return;
        }
        P::synchronize(stream(b.stream));
        if (b.recorded) P::synchronize(stream(*b.recorded));
        CHECK(get<P>(b.ptr, b.bytes) == b.expected);
    }

    void disarm() {
        vmm_faults::reset();
        platform_faults::reset();
        memory_.backing().disarm();
    }

    /// The resource's counts and what the platform holds, against the model's.
    void check_counts() {
        std::size_t live = 0;
        std::size_t awake = 0;
        std::size_t asleep = 0;
        std::size_t offloaded = 0;
        long awake_blocks = 0;
        for (const model_block& b : blocks_) {
            live += b.bytes;
            const model_owner& o = owners_[b.owner];
            (o.asleep ? asleep : awake) += span(b.bytes);
            awake_blocks += o.asleep ? 0 : 1;
            if (o.asleep && o.policy == offload) offloaded += b.bytes;
        }
        const auto stats = memory_.statistics();
        const auto detail = memory_.detailed_statistics();
        CHECK(stats.live_bytes == live);
        CHECK(stats.live_allocations == blocks_.size());
        CHECK(stats.reserved_bytes == awake);
        CHECK(detail.awake_bytes == awake);
        CHECK(detail.asleep_bytes == asleep);
        CHECK(detail.mapped_bytes == awake);
        CHECK(detail.offloaded_bytes == offloaded);
        CHECK(detail.stuck_bytes == 0);
        CHECK(detail.sleeping_owners ==
              static_cast<std::size_t>(std::count_if(owners_.begin(), owners_.end(), [](const model_owner& o) { return o.asleep; })));
        const auto held = custody::test::vmm_held();
        CHECK(held.mappings - base_.mappings == awake_blocks);
        CHECK(held.handles - base_.handles == awake_blocks);
        CHECK(held.reservations - base_.reservations == static_cast<long>(blocks_.size()));
        CHECK(memory_.backing().upstream().statistics().live_bytes == offloaded);
    }

    std::mt19937_64 rng_;
    memory_type memory_{0};
    std::size_t g_ = memory_.granularity();
    std::vector<custody::test::faulty_stream> streams_;
    std::vector<std::string> names_;
    std::array<model_owner, owner_count> owners_{};
    std::vector<model_block> blocks_;
    unsigned next_seed_ = 1;
    custody::test::vmm_holding base_{};
};

} // namespace

TEST_CASE("sleepable_memory: a seeded model of 10^4 allocations, frees, sleeps and wakes keeps every count exact",
          "[sleep][model]") {
    custody_test::faulty_sleep::all_faults_reset reset;
    for (const std::uint64_t seed : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{20261126}}) {
        INFO("seed " << seed);
        model m(seed);
        m.run();
    }
}
