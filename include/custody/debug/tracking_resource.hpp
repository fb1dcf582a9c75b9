/// @file
/// `tracking_resource<Upstream>`: an adaptor that keeps a ledger of every live allocation (owner,
/// rank, device, stream, sequence, time, optionally the call stack), catches bad frees before they
/// reach the upstream, guards blocks with canaries, poisons freed memory, and reports leaks,
/// snapshots, differences and per-rank reports.
///
/// Map of the debug layer:
///   rank.hpp               rank_info, detect_rank(): the rank from the launcher's environment
///   owner_scope.hpp        owner_scope: RAII, thread-local, nestable owner names
///   report.hpp             violation, tracking_error, policy, leak_report, snapshot, diff, rank_report
///   json_report.hpp        rank_report <-> JSON (docs/debug-report-schema.json)
///   merge.hpp              N rank reports -> cross-rank table and Chrome/Perfetto trace
///   tracking_options.hpp   tracking_options, watch, watch_event
///   tracking_resource.hpp  this adaptor
#pragma once

#include <custody/core/detail/format.hpp>
#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/statistics.hpp>
#include <custody/debug/detail/call_stack.hpp>
#include <custody/debug/detail/registry.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/core/rank.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/tracking_options.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace custody::debug {

/// Tracks every allocation made through it, over any stream-ordered `Upstream`.
///
/// Ledger: each live block records size, alignment, owner (an explicit owner argument, else the
/// thread's owner_scope, else "<untagged>"), rank, device (the stream's device, or the current
/// device for the synchronous calls), stream, a sequence number (1, 2, ...), the time, and with
/// `capture_stacks` the call stack.
///
/// Checks at deallocate, each reported with both sides (see violation): double free, a pointer
/// never handed out, wrong size or alignment, another device, a pointer handed out by another
/// live tracker, a stream hazard (freed on stream f while it was allocated or recorded in use on
/// another stream u, with no ordering from u to f: see record_use, order_before_free and
/// declare_ordered; the synchronous deallocate_sync is taken as ordered after everything), and
/// with canaries an overwritten guard (underflow, overflow). A bad free (every check but the
/// canaries) is NOT forwarded: the block stays live in the ledger and the upstream is untouched,
/// so the caller may still free it correctly. An overwritten guard is reported after the block
/// was given back (the free itself was right).
///
/// Canaries: the upstream block is [front guard][user bytes][back guard]; front = guard_bytes
/// rounded up to the alignment, so the user pointer keeps the requested alignment. Guards are
/// written and read through Platform::memset_async / memcpy_async, so they work for device
/// memory. At free, 2 * guard_bytes are read back on the freeing stream, before the poison and the
/// upstream free. On the default stream (and for deallocate_sync) they are compared at once; on
/// another stream an event is recorded after the read-back and the comparison runs once it is
/// ready (at a later call, check_guards(), or destruction), so a free never waits for its stream
/// (on the cuda platform a copy to pageable host memory may still block until the stream gets there).
/// Poison: freed memory is filled with poison_byte on the freeing stream before the free.
///
/// Stream semantics: as the upstream's; guard writes and poison fills are enqueued on the
/// allocating or freeing stream, so they are ordered with the user's work there.
/// Thread safety: thread-safe; one mutex guards the ledger (held for O(1) work per call, never
/// while calling the upstream, a callback or the registry).
/// Ownership: holds the upstream by value (constructed in place from the constructor's extra
/// arguments). At destruction, blocks still live are reported (policy on_leak) and, with
/// release_leaks, given back to the upstream synchronously (their streams may be gone). The
/// caller keeps the streams it passes alive until the calls that use them return, as always.
/// Complexity: allocate and deallocate are O(1) expected (hash maps) plus the guard/poison copies.
/// Equality: identity.
template <stream_ordered_resource Upstream>
class tracking_resource final {
public:
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using upstream_type = Upstream;

    /// A tracker with `options` over an Upstream constructed from `upstream_args`.
    /// Throws std::invalid_argument for guard_bytes outside 1..256 (with canaries on), and
    /// custody::rank_error for an impossible rank (see custody::validate_rank) or a malformed launcher
    /// environment.
    template <class... Args>
    explicit tracking_resource(tracking_options options, Args&&... upstream_args)
        : upstream_(std::forward<Args>(upstream_args)...), options_(std::move(options)),
          rank_(options_.rank ? validate_rank(*options_.rank) : detect_rank()), start_(std::chrono::steady_clock::now()),
          start_unix_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count()) {
        if (options_.canaries && (options_.guard_bytes == 0 || options_.guard_bytes > max_guard_bytes)) {
            throw std::invalid_argument("custody: guard_bytes must be within 1..256");
        }
        ledger_.reserve(1024);
        freed_ring_.resize(options_.remembered_frees);
        detail::tracker_registry::instance().add(detail::tracker_entry{this, &registry_lookup});
    }

    /// A tracker with default options over a default-constructed Upstream.
    tracking_resource() : tracking_resource(tracking_options{}) {}

    tracking_resource(const tracking_resource&) = delete;
    tracking_resource& operator=(const tracking_resource&) = delete;

    ~tracking_resource() {
        detail::tracker_registry::instance().remove(this);
        try {
            drain_guard_checks(true);
        } catch (...) {
            report_failure("custody: tracking_resource could not finish its guard checks");
        }
        std::vector<record> records;
        try {
            std::lock_guard lock(mutex_);
            records.reserve(stats_.live_allocations);
            for (auto& [p, r] : ledger_)
                if (r.live) records.push_back(r);
        } catch (...) {
            report_failure("custody: tracking_resource could not list its leaks");
            return;
        }
        if (!records.empty()) {
            try {
                std::vector<snapshot_entry> entries;
                entries.reserve(records.size());
                for (const record& r : records) entries.push_back(entry_of(r));
                const leak_report report = detail::group_entries(rank_.rank, entries);
                handle_leaks(report);
            } catch (...) {
                report_failure("custody: tracking_resource could not build its leak report");
            }
            if (options_.release_leaks) {
                // Synchronously: the streams the blocks were allocated on may be gone by now.
                for (const record& r : records) upstream_.deallocate_sync(r.outer, r.total, r.alignment);
            }
        }
    }

    // ---- the resource interface ---------------------------------------------------------------

    /// Allocates `bytes` on `stream` for the current owner. Throws what the upstream throws
    /// (out_of_memory carries this request), std::invalid_argument for a bad alignment, and a
    /// pending tracking_error under policy::throw_error. Strong guarantee.
    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        return allocate_for(stream, bytes, alignment, current_owner());
    }
    /// As allocate, for an explicit owner (overrides the thread's owner scope).
    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment,
                                 std::string_view owner) {
        return allocate_for(stream, bytes, alignment, intern_owner(owner));
    }
    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        return allocate_for(stream_type{}, bytes, alignment, current_owner(), true);
    }
    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment, std::string_view owner) {
        return allocate_for(stream_type{}, bytes, alignment, intern_owner(owner), true);
    }

    /// Non-throwing allocate: nullptr when the upstream is exhausted (or the request overflows).
    /// Precondition: `alignment` passed check_alignment. Pending errors are not thrown here.
    [[nodiscard]] void* try_allocate(stream_type stream, std::size_t bytes, std::size_t alignment) noexcept {
        if (bytes == 0 || !is_pow2(alignment)) return nullptr;
        const layout l = layout_for(bytes, alignment);
        if (!l.valid) return nullptr;
        void* outer = custody::try_allocate(upstream_, stream, l.total, alignment);
        if (outer == nullptr) return nullptr;
        return admit(outer, l, stream, false, bytes, alignment, current_owner(), /*noexcept_path=*/true);
    }

    /// Gives a block back on `stream` after checking it. A violation is handled by the policy
    /// (under throw_error: thrown by the next throwing call); a bad free is not forwarded.
    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        free_impl(stream, false, ptr, bytes, alignment, false);
    }
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        free_impl(stream_type{}, true, ptr, bytes, alignment, false);
    }

    /// As deallocate, but a violation under policy::throw_error throws tracking_error at once.
    void deallocate_checked(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) {
        if (ptr == nullptr) return;
        free_impl(stream, false, ptr, bytes, alignment, true);
    }
    void deallocate_sync_checked(void* ptr, std::size_t bytes, std::size_t alignment) {
        if (ptr == nullptr) return;
        free_impl(stream_type{}, true, ptr, bytes, alignment, true);
    }

    /// Statistics of what this tracker handed out: live_bytes counts user bytes, reserved_bytes
    /// what it holds from the upstream (guards included).
    [[nodiscard]] resource_statistics statistics() const noexcept {
        std::lock_guard lock(mutex_);
        return stats_;
    }

    /// The upstream's device (-1 when it has none).
    [[nodiscard]] int device() const noexcept {
        if constexpr (device_bound_resource<Upstream>) {
            return static_cast<int>(upstream_.device());
        } else {
            return -1;
        }
    }

    [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
    [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }
    [[nodiscard]] const tracking_options& options() const noexcept { return options_; }
    [[nodiscard]] const rank_info& rank() const noexcept { return rank_; }

    friend bool operator==(const tracking_resource& a, const tracking_resource& b) noexcept { return &a == &b; }
    CUSTODY_FORWARD_PROPERTIES(tracking_resource, Upstream)

    // ---- stream ordering -----------------------------------------------------------------------

    /// Declares that work on `stream` uses the live block `ptr` too: freeing it on any other stream
    /// then needs an ordering (order_before_free or declare_ordered). Throws std::invalid_argument
    /// when `ptr` is not live in this tracker (nothing changes).
    void record_use(const void* ptr, stream_type stream) {
        std::lock_guard lock(mutex_);
        record& r = live_record(ptr);
        if (!r.uses_stream(stream)) {
            // At most max_uses streams are remembered; beyond, the latest takes the last slot.
            const int slot = r.use_count == record::max_uses ? record::max_uses - 1 : r.use_count++;
            r.uses[static_cast<std::size_t>(slot)] = stream;
        }
        r.ordered = false;
    }

    /// Makes `free_stream` wait (an event per stream, without blocking the host) for the work
    /// enqueued so far on every stream the block is used on, and notes that the block may now be
    /// freed on `free_stream`. Throws std::invalid_argument when `ptr` is not live.
    void order_before_free(const void* ptr, stream_type free_stream) {
        std::array<stream_type, record::max_uses> uses{};
        int count = 0;
        {
            std::lock_guard lock(mutex_);
            const record& r = live_record(ptr);
            uses = r.uses;
            count = r.use_count;
        }
        for (int i = 0; i < count; ++i) {
            const stream_type u = uses[static_cast<std::size_t>(i)];
            if (u == free_stream) continue;
            typename platform_type::event e(platform_type::stream_device(u));
            e.record(u);
            platform_type::wait(free_stream, e);
        }
        declare_ordered(ptr, free_stream);
    }

    /// Notes that the caller has ordered `free_stream` after every use of `ptr` (with its own
    /// event), so freeing it there is not a hazard. Throws std::invalid_argument when not live.
    void declare_ordered(const void* ptr, stream_type free_stream) {
        std::lock_guard lock(mutex_);
        record& r = live_record(ptr);
        r.ordered = true;
        r.ordered_onto = platform_type::stream_key(free_stream);
    }

    // ---- queries -------------------------------------------------------------------------------

    /// Throws the violation kept under policy::throw_error from a noexcept path, if any.
    void rethrow_pending() {
        if (!has_pending_.load(std::memory_order_acquire)) return;
        std::optional<violation> v;
        {
            std::lock_guard lock(mutex_);
            v.swap(pending_);
            has_pending_.store(false, std::memory_order_release);
        }
        if (v) throw tracking_error(std::move(*v));
    }

    /// The violations found so far (the most recent kept_violations).
    [[nodiscard]] std::vector<violation> violations() const {
        std::lock_guard lock(mutex_);
        return {violations_.begin(), violations_.end()};
    }
    [[nodiscard]] std::uint64_t violation_count() const noexcept {
        return violation_count_.load(std::memory_order_relaxed);
    }

    /// Is `ptr` live in this tracker? If so, where was it allocated?
    [[nodiscard]] std::optional<allocation_site> find(const void* ptr) const {
        std::lock_guard lock(mutex_);
        const auto it = ledger_.find(ptr);
        if (it == ledger_.end() || !it->second.live) return std::nullopt;
        return site_of(it->second);
    }

    /// The live allocations, in sequence order. Also takes a timeline sample and runs the growth
    /// watches. O(n log n) in the live blocks.
    [[nodiscard]] debug::snapshot snapshot() {
        debug::snapshot s;
        std::vector<std::pair<int, watch_event>> fired;
        {
            std::lock_guard lock(mutex_);
            s.rank = rank_.rank;
            s.last_sequence = sequence_;
            s.time_ns = now_ns();
            s.entries.reserve(stats_.live_allocations);
            for (const auto& [p, r] : ledger_)
                if (r.live) s.entries.push_back(entry_of(r));
            sample_locked(s.time_ns);
            check_growth_locked(fired);
        }
        std::sort(s.entries.begin(), s.entries.end(),
                  [](const snapshot_entry& a, const snapshot_entry& b) { return a.sequence < b.sequence; });
        fire(fired);
        return s;
    }

    /// The live allocations grouped by owner and call stack.
    [[nodiscard]] leak_report leaks() const {
        std::vector<snapshot_entry> entries;
        {
            std::lock_guard lock(mutex_);
            entries.reserve(stats_.live_allocations);
            for (const auto& [p, r] : ledger_)
                if (r.live) entries.push_back(entry_of(r));
        }
        return detail::group_entries(rank_.rank, entries);
    }

    /// Live bytes and blocks of one owner (exact name; "" or "<untagged>" for untagged memory).
    [[nodiscard]] owner_usage owner_live(std::string_view owner) const {
        const owner_id id = (owner.empty() || owner == untagged_owner) ? nullptr : intern_owner(owner);
        std::lock_guard lock(mutex_);
        owner_usage u;
        u.owner = std::string(owner_name(id));
        if (const auto it = owners_.find(id); it != owners_.end()) {
            u.live_bytes = it->second.bytes;
            u.live_count = it->second.count;
            u.peak_bytes = it->second.peak;
        }
        return u;
    }

    /// Installs a watch; returns its id (for remove_watch). Throws std::invalid_argument for a
    /// watch without a callback.
    int add_watch(watch w) {
        if (!w.callback) throw std::invalid_argument("custody: a watch needs a callback");
        const owner_id id = w.what == watch::subject::owner ? intern_owner(w.owner) : nullptr;
        std::lock_guard lock(mutex_);
        const int wid = ++last_watch_id_;
        installed_watch iw{wid, id, std::move(w)};
        iw.last_bytes = live_of_locked(iw);
        iw.armed = iw.last_bytes <= iw.spec.threshold_bytes;
        watches_.push_back(std::move(iw));
        has_watches_.store(true, std::memory_order_release);
        return wid;
    }
    /// Removes a watch; false when no such id.
    bool remove_watch(int id) {
        std::lock_guard lock(mutex_);
        const auto n = std::erase_if(watches_, [&](const installed_watch& w) { return w.id == id; });
        has_watches_.store(!watches_.empty(), std::memory_order_release);
        return n != 0;
    }

    /// Everything a per-rank JSON report holds (json_report.hpp writes it). Takes a timeline
    /// sample. O(n) in the live blocks plus symbolizing one stack per group.
    [[nodiscard]] rank_report make_report() {
        rank_report r;
        r.rank = rank_;
        r.tracker = options_.name;
        r.platform = std::string(platform_type::name);
        r.started_unix_ns = start_unix_ns_;
        r.totals = statistics();
        std::vector<snapshot_entry> entries;
        {
            std::lock_guard lock(mutex_);
            sample_locked(now_ns());
            for (const auto& [id, o] : owners_) {
                if (o.count == 0 && o.peak == 0) continue;
                r.owners.push_back(owner_usage{std::string(owner_name(id)), o.bytes, o.count, o.peak});
            }
            for (std::size_t i = 0; i < devices_.size(); ++i) {
                if (devices_[i].count != 0 || devices_[i].bytes != 0) {
                    r.devices.push_back(device_usage{static_cast<int>(i) - 1, devices_[i].bytes, devices_[i].count});
                }
            }
            entries.reserve(stats_.live_allocations);
            for (const auto& [p, rec] : ledger_)
                if (rec.live) entries.push_back(entry_of(rec));
            r.violations.assign(violations_.begin(), violations_.end());
            for (const auto& s : timeline_) {
                timeline_sample t;
                t.unix_ns = start_unix_ns_ + s.time_ns;
                for (const auto& [id, b] : s.owners) t.owners.emplace_back(std::string(owner_name(id)), b);
                std::sort(t.owners.begin(), t.owners.end());
                r.timeline.push_back(std::move(t));
            }
        }
        std::sort(r.owners.begin(), r.owners.end(),
                  [](const owner_usage& a, const owner_usage& b) { return a.owner < b.owner; });
        r.live = detail::group_entries(rank_.rank, entries);
        r.written_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
        return r;
    }

private:
    /// Where the user block sits in the upstream block.
    /// Invariants (valid): total = front + bytes + back; front % alignment == 0; inner = outer + front.
    struct layout {
        std::size_t front = 0;
        std::size_t back = 0;
        std::size_t total = 0;
        bool valid = true;
    };

    struct owner_totals {
        std::size_t bytes = 0; ///< live bytes of the owner
        std::size_t count = 0;
        std::size_t peak = 0;  ///< max over time of bytes
    };
    /// One block: live, or freed and still remembered (to tell a double free).
    /// Invariants: 1 <= use_count <= max_uses for a stream allocation (uses[0] = stream), 0 for a
    /// synchronous one until record_use; freed_* are meaningful only when !live.
    struct record {
        static constexpr int max_uses = 4;
        void* outer = nullptr;
        std::size_t bytes = 0;
        std::size_t alignment = 0;
        std::size_t total = 0; ///< bytes taken from the upstream
        std::size_t front = 0; ///< user pointer = outer + front
        bool live = true;      ///< false: freed, kept only to tell a double free
        owner_id owner = nullptr;
        owner_totals* totals = nullptr; ///< owners_[owner]: node-based map, the address is stable
        int rank = 0;
        int device = -1;
        stream_type stream{};
        bool synchronous = false;
        bool ordered = false;            ///< declared ordered before a free on ordered_onto
        int use_count = 0;
        std::uintptr_t ordered_onto = 0;
        std::array<stream_type, max_uses> uses{};
        std::uint64_t sequence = 0;
        std::int64_t time_ns = 0;
        detail::call_stack stack;
        // Graveyard only: the free that took it out of the ledger.
        owner_id freed_owner = nullptr;
        int freed_device = -1;
        std::uintptr_t freed_stream = 0;
        bool freed_synchronous = false;
        std::uint64_t freed_sequence = 0;
        std::int64_t freed_time_ns = 0;

        [[nodiscard]] bool uses_stream(stream_type s) const noexcept {
            for (int i = 0; i < use_count; ++i)
                if (uses[static_cast<std::size_t>(i)] == s) return true;
            return false;
        }
    };

    struct device_totals {
        std::size_t bytes = 0;
        std::size_t count = 0;
    };
    struct installed_watch {
        int id = 0;
        owner_id owner = nullptr;
        watch spec;
        bool armed = true;          ///< the threshold may fire (live bytes were <= threshold since)
        std::size_t last_bytes = 0; ///< at the previous snapshot
        int growths = 0;            ///< consecutive snapshots with growth
    };
    struct sample {
        std::int64_t time_ns = 0;
        std::vector<std::pair<owner_id, std::size_t>> owners;
    };

    /// Nanoseconds since the tracker was made. With `precise_time` off, Linux's coarse monotonic
    /// clock (a few ms resolution, ~5 ns a read instead of up to ~100 ns in some VMs): the
    /// sequence numbers order events exactly; times only place them.
    [[nodiscard]] std::int64_t now_ns() const noexcept {
#ifdef CLOCK_MONOTONIC_COARSE
        if (!options_.precise_time) {
            timespec ts{};
            ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
            return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec - start_coarse_ns_;
        }
#endif
        return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
    }

    static std::array<unsigned char, 2 * max_guard_bytes> filled(unsigned char value) noexcept {
        std::array<unsigned char, 2 * max_guard_bytes> a;
        a.fill(value);
        return a;
    }

    static std::int64_t coarse_now() noexcept {
#ifdef CLOCK_MONOTONIC_COARSE
        timespec ts{};
        ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
#else
        return 0;
#endif
    }

    [[nodiscard]] layout layout_for(std::size_t bytes, std::size_t alignment) const noexcept {
        layout l;
        if (options_.canaries) {
            l.front = align_up(options_.guard_bytes, alignment);
            l.back = options_.guard_bytes;
        }
        if (bytes > SIZE_MAX - l.front - l.back) {
            l.valid = false;
            return l;
        }
        l.total = l.front + bytes + l.back;
        return l;
    }

    [[nodiscard]] static int device_of(stream_type stream, bool synchronous) noexcept {
        return synchronous ? platform_type::current_device() : platform_type::stream_device(stream);
    }

    /// One path for both allocations: `synchronous` selects the upstream's synchronous pair (and
    /// records the block as made on the default stream).
    void* allocate_for(stream_type stream, std::size_t bytes, std::size_t alignment, owner_id owner,
                       bool synchronous = false) {
        check_alignment(alignment, SIZE_MAX);
        if (guard_checks_pending_.load(std::memory_order_relaxed) != 0) drain_guard_checks(false);
        if (has_pending_.load(std::memory_order_relaxed)) rethrow_pending();
        if (bytes == 0) return nullptr;
        const layout l = layout_for(bytes, alignment);
        if (!l.valid) throw_out_of_memory(bytes, alignment, "the request plus its guards overflows");
        void* outer = nullptr;
        try {
            outer = synchronous ? upstream_.allocate_sync(l.total, alignment)
                                : upstream_.allocate(stream, l.total, alignment);
        } catch (const out_of_memory& e) {
            throw_out_of_memory(bytes, alignment, std::string("upstream: ") + e.what());
        }
        if (outer == nullptr) throw_out_of_memory(bytes, alignment, "upstream returned null");
        return admit(outer, l, stream, synchronous, bytes, alignment, owner, false);
    }

    [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::size_t alignment, std::string detail) const {
        throw out_of_memory(bytes, alignment, device(), statistics(), "tracking_resource '" + options_.name + "'",
                            std::move(detail));
    }

    /// Records the block the upstream just gave and writes its guards. On any failure (no memory
    /// for the ledger node), gives the block back and throws (or returns nullptr on the noexcept
    /// path): the strong guarantee.
    void* admit(void* outer, const layout& l, stream_type stream, bool synchronous, std::size_t bytes,
                std::size_t alignment, owner_id owner, bool noexcept_path) noexcept(false) {
        auto* inner = static_cast<unsigned char*>(outer) + l.front;
        if (options_.canaries) {
            try {
                const stream_type s = synchronous ? stream_type{} : stream;
                platform_type::memset_async(outer, options_.canary_byte, l.front, s);
                platform_type::memset_async(inner + bytes, options_.canary_byte, l.back, s);
                if (synchronous) platform_type::synchronize(s);
            } catch (...) {
                give_back(outer, l.total, alignment, stream, synchronous);
                if (noexcept_path) return nullptr;
                throw;
            }
        }
        // Heap, not std::optional: GCC zero-fills an empty optional's storage on every call.
        std::unique_ptr<detail::call_stack> stack;
        if (options_.capture_stacks) stack = std::make_unique<detail::call_stack>(detail::call_stack::capture(1));
        const int device = device_of(stream, synchronous);
        std::vector<std::pair<int, watch_event>> fired;
        try {
            std::lock_guard lock(mutex_);
            // Everything that may throw comes before the first change.
            owner_totals& totals = owners_.try_emplace(owner).first->second;
            if (static_cast<std::size_t>(device + 1) >= devices_.size()) devices_.resize(static_cast<std::size_t>(device + 2));
            if (watches_.size() > 0) fired.reserve(watches_.size());
            // A remembered free at this address (the upstream reused it) is overwritten in place.
            record* r = &ledger_.try_emplace(inner).first->second;
            r->live = true;
            r->ordered = false;
            r->ordered_onto = 0;
            r->use_count = 0;
            r->outer = outer;
            r->bytes = bytes;
            r->alignment = alignment;
            r->total = l.total;
            r->front = l.front;
            r->owner = owner;
            r->rank = rank_.rank;
            r->device = device;
            r->stream = stream;
            r->synchronous = synchronous;
            if (!synchronous) {
                r->uses[0] = stream;
                r->use_count = 1;
            }
            r->sequence = ++sequence_;
            r->time_ns = now_ns();
            if (stack) {
                r->stack = *stack;
            } else {
                r->stack.depth = 0; // frames past depth are never read
            }
            stats_.allocations += 1;
            stats_.live_allocations += 1;
            stats_.live_bytes += bytes;
            stats_.reserved_bytes += l.total;
            stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
            stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
            r->totals = &totals;
            account_locked(totals, owner, device, bytes, true, fired);
        } catch (...) {
            give_back(outer, l.total, alignment, stream, synchronous);
            if (noexcept_path) return nullptr;
            throw;
        }
        if (!fired.empty()) fire(fired);
        return inner;
    }

    void give_back(void* outer, std::size_t total, std::size_t alignment, stream_type stream, bool synchronous) noexcept {
        if (synchronous) {
            upstream_.deallocate_sync(outer, total, alignment);
        } else {
            upstream_.deallocate(stream, outer, total, alignment);
        }
    }

    /// Updates the per-owner and per-device totals and runs the threshold watches.
    void account_locked(owner_totals& o, owner_id owner, int device, std::size_t bytes, bool up,
                        std::vector<std::pair<int, watch_event>>& fired) noexcept {
        const auto slot = static_cast<std::size_t>(device + 1);
        if (slot >= devices_.size()) devices_.resize(slot + 1);
        device_totals& d = devices_[slot];
        if (up) {
            o.bytes += bytes;
            ++o.count;
            o.peak = std::max(o.peak, o.bytes);
            d.bytes += bytes;
            ++d.count;
        } else {
            o.bytes -= bytes;
            --o.count;
            d.bytes -= bytes;
            --d.count;
        }
        if (!has_watches_.load(std::memory_order_relaxed)) return;
        for (installed_watch& w : watches_) {
            if (w.spec.threshold_bytes == SIZE_MAX) continue;
            const bool mine = w.spec.what == watch::subject::owner ? w.owner == owner : w.spec.device == device;
            if (!mine) continue;
            const std::size_t live = w.spec.what == watch::subject::owner ? o.bytes : d.bytes;
            if (live <= w.spec.threshold_bytes) {
                w.armed = true;
            } else if (w.armed) {
                w.armed = false;
                try {
                    fired.emplace_back(w.id, event_of(w, live, false));
                } catch (...) {
                    report_failure("custody: no memory to report a watch");
                }
            }
        }
    }

    [[nodiscard]] std::size_t live_of_locked(const installed_watch& w) const {
        if (w.spec.what == watch::subject::owner) {
            const auto it = owners_.find(w.owner);
            return it == owners_.end() ? 0 : it->second.bytes;
        }
        const auto slot = static_cast<std::size_t>(w.spec.device + 1);
        return slot < devices_.size() ? devices_[slot].bytes : 0;
    }

    [[nodiscard]] watch_event event_of(const installed_watch& w, std::size_t live, bool growth) const {
        watch_event e;
        e.watch_id = w.id;
        e.subject = w.spec.what == watch::subject::owner ? "owner '" + std::string(owner_name(w.owner)) + "'"
                                                         : "device " + std::to_string(w.spec.device);
        e.rank = rank_.rank;
        e.live_bytes = live;
        e.growth = growth;
        e.consecutive_growths = w.growths;
        return e;
    }

    void check_growth_locked(std::vector<std::pair<int, watch_event>>& fired) {
        for (installed_watch& w : watches_) {
            const std::size_t live = live_of_locked(w);
            w.growths = live > w.last_bytes ? w.growths + 1 : 0;
            w.last_bytes = live;
            if (w.spec.growth_snapshots > 0 && w.growths == w.spec.growth_snapshots) {
                fired.emplace_back(w.id, event_of(w, live, true));
            }
        }
    }

    /// Calls the callbacks of watches that fired (outside the lock). A watch removed meanwhile is
    /// skipped; its callback is copied under the lock so removal cannot race with the call.
    void fire(const std::vector<std::pair<int, watch_event>>& fired) {
        for (const auto& [id, event] : fired) {
            std::function<void(const watch_event&)> callback;
            {
                std::lock_guard lock(mutex_);
                for (const auto& w : watches_)
                    if (w.id == id) callback = w.spec.callback;
            }
            if (callback) callback(event);
        }
    }

    void sample_locked(std::int64_t time_ns) {
        sample s;
        s.time_ns = time_ns;
        for (const auto& [id, o] : owners_) {
            if (o.count != 0 || o.peak != 0) s.owners.emplace_back(id, o.bytes);
        }
        timeline_.push_back(std::move(s));
        while (timeline_.size() > options_.kept_samples) timeline_.pop_front();
    }

    [[nodiscard]] allocation_site site_of(const record& r) const {
        allocation_site s;
        s.owner = std::string(owner_name(r.owner));
        s.rank = r.rank;
        s.device = r.device;
        s.stream = r.synchronous ? 0 : platform_type::stream_key(r.stream);
        s.synchronous = r.synchronous;
        s.sequence = r.sequence;
        s.time_ns = r.time_ns;
        s.bytes = r.bytes;
        s.alignment = r.alignment;
        s.stack = r.stack.symbolize();
        return s;
    }

    [[nodiscard]] allocation_site freed_site_of(const record& r) const {
        allocation_site s;
        s.owner = std::string(owner_name(r.freed_owner));
        s.rank = r.rank;
        s.device = r.freed_device;
        s.stream = r.freed_stream;
        s.synchronous = r.freed_synchronous;
        s.sequence = r.freed_sequence;
        s.time_ns = r.freed_time_ns;
        s.bytes = r.bytes;
        s.alignment = r.alignment;
        return s;
    }

    [[nodiscard]] static snapshot_entry entry_of(const record& r) {
        snapshot_entry e;
        e.pointer = static_cast<const unsigned char*>(r.outer) + r.front;
        e.sequence = r.sequence;
        e.bytes = r.bytes;
        e.owner = r.owner;
        e.device = r.device;
        e.stack = r.stack;
        return e;
    }

    /// The live record of `ptr`; throws std::invalid_argument when there is none. Lock held.
    record& live_record(const void* ptr) {
        const auto it = ledger_.find(ptr);
        if (it == ledger_.end() || !it->second.live) {
            throw std::invalid_argument("custody: " + custody::detail::to_hex(ptr) + " is not live in tracker '" +
                                        options_.name + "'");
        }
        return it->second;
    }

    /// Whether `ptr` lies inside a live block (past its start); if so, fills `v` with the block.
    /// O(live blocks): only a bad free asks.
    bool interior_of(const void* ptr, violation& v) const {
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        std::lock_guard lock(mutex_);
        for (const auto& [start, r] : ledger_) {
            const auto begin = reinterpret_cast<std::uintptr_t>(start);
            if (r.live && begin < address && address < begin + r.bytes) {
                v.has_allocated = true;
                v.allocated = site_of(r);
                v.detail = "the pointer lies " + std::to_string(address - begin) + " B inside the live block at " +
                           custody::detail::to_hex(start) + " (" + std::to_string(r.bytes) +
                           " B); give back the pointer the allocation returned";
                return true;
            }
        }
        return false;
    }

    static bool registry_lookup(const void* self, const void* ptr, allocation_site& site, std::string& name) {
        const auto* t = static_cast<const tracking_resource*>(self);
        std::lock_guard lock(t->mutex_);
        const auto it = t->ledger_.find(ptr);
        if (it == t->ledger_.end() || !it->second.live) return false;
        site = t->site_of(it->second);
        name = t->options_.name;
        return true;
    }

    /// The checks and the free. `can_throw`: a violation under throw_error is thrown here.
    void free_impl(stream_type stream, bool synchronous, void* ptr, std::size_t bytes, std::size_t alignment,
                   bool can_throw) noexcept(false) {
        const int device = device_of(stream, synchronous);
        std::uint64_t free_sequence = 0;
        const auto freed_site = [&] {
            allocation_site s;
            s.owner = std::string(owner_name(current_owner()));
            s.rank = rank_.rank;
            s.device = device;
            s.stream = synchronous ? 0 : platform_type::stream_key(stream);
            s.synchronous = synchronous;
            s.sequence = free_sequence;
            s.time_ns = now_ns();
            s.bytes = bytes;
            s.alignment = alignment;
            if (options_.capture_stacks) s.stack = detail::call_stack::capture(1).symbolize();
            return s;
        };

        std::unique_ptr<violation> bad; // rare; heap keeps the common path free of a large zero-fill
        struct {
            void* outer;
            std::size_t total;
            std::size_t alignment;
        } taken{}; // what the upstream needs back
        // The whole record, for a guard check's report: copied into raw storage only when canaries
        // are on (record is trivially copyable; std::optional would zero-fill it on every call).
        static_assert(std::is_trivially_copyable_v<record> && std::is_trivially_destructible_v<record>);
        alignas(record) unsigned char guarded_storage[sizeof(record)];
        const record* guarded = nullptr;
        std::vector<std::pair<int, watch_event>> fired;
        bool known = false;
        {
            std::unique_lock lock(mutex_);
            free_sequence = ++free_sequence_;
            const auto it = ledger_.find(ptr);
            if (it != ledger_.end() && it->second.live) {
                known = true;
                record& r = it->second;
                std::string what;
                violation_kind kind{};
                if (r.bytes != bytes) {
                    kind = violation_kind::wrong_size;
                    what = "freed with " + std::to_string(bytes) + " B, allocated with " + std::to_string(r.bytes) + " B";
                } else if (r.alignment != alignment) {
                    kind = violation_kind::wrong_alignment;
                    what = "freed with alignment " + std::to_string(alignment) + ", allocated with " +
                           std::to_string(r.alignment);
                } else if (options_.check_device && device != r.device) {
                    kind = violation_kind::wrong_device;
                    what = "freed on device " + std::to_string(device) + ", allocated on device " +
                           std::to_string(r.device);
                } else if (options_.check_streams && !synchronous && hazard(r, stream)) {
                    kind = violation_kind::stream_hazard;
                    what = "freed on stream " + custody::detail::to_hex(reinterpret_cast<const void*>(
                                                    platform_type::stream_key(stream))) +
                           " with no ordering after its use on stream " +
                           custody::detail::to_hex(reinterpret_cast<const void*>(
                               platform_type::stream_key(first_unordered_use(r, stream))));
                }
                if (!what.empty()) {
                    try {
                        violation v;
                        v.kind = kind;
                        v.pointer = ptr;
                        v.tracker = options_.name;
                        v.has_allocated = true;
                        v.allocated = site_of(r);
                        v.detail = std::move(what);
                        bad = std::make_unique<violation>(std::move(v));
                    } catch (...) {
                        report_failure("custody: no memory to describe a bad free");
                        return;
                    }
                } else {
                    taken = {r.outer, r.total, r.alignment};
                    if (options_.canaries) guarded = ::new (static_cast<void*>(guarded_storage)) record(r);
                    stats_.deallocations += 1;
                    stats_.live_allocations -= 1;
                    stats_.live_bytes -= r.bytes;
                    stats_.reserved_bytes -= r.total;
                    account_locked(*r.totals, r.owner, r.device, r.bytes, false, fired);
                    remember_free_locked(it, device, stream, synchronous, free_sequence);
                }
            } else if (const auto dead = it; dead != ledger_.end()) {
                violation v;
                v.kind = violation_kind::double_free;
                v.pointer = ptr;
                v.tracker = options_.name;
                v.has_allocated = true;
                v.allocated = site_of(dead->second);
                v.has_first_free = true;
                v.first_free = freed_site_of(dead->second);
                v.detail = "the block was already given back";
                bad = std::make_unique<violation>(std::move(v));
            }
        }
        if (bad) {
            if (bad->kind == violation_kind::double_free) {
                // The address may have been handed out again by another tracker over the same
                // memory: then this is a free through the wrong tracker, not a second free.
                allocation_site other;
                std::string other_name;
                if (detail::tracker_registry::instance().find_owner(this, ptr, other, other_name)) {
                    bad->kind = violation_kind::foreign_free;
                    bad->allocated = std::move(other);
                    bad->other_tracker = std::move(other_name);
                    bad->has_first_free = false;
                    bad->detail = "handed out by tracker '" + bad->other_tracker + "'";
                }
            }
            bad->freed = freed_site();
            handle_violation(std::move(*bad), can_throw);
            return;
        }
        if (!known) {
            violation v;
            v.pointer = ptr;
            v.tracker = options_.name;
            allocation_site other;
            std::string other_name;
            if (detail::tracker_registry::instance().find_owner(this, ptr, other, other_name)) {
                v.kind = violation_kind::foreign_free;
                v.has_allocated = true;
                v.allocated = std::move(other);
                v.other_tracker = std::move(other_name);
                v.detail = "handed out by tracker '" + v.other_tracker + "'";
            } else if (interior_of(ptr, v)) {
                v.kind = violation_kind::interior_pointer;
            } else {
                v.kind = violation_kind::unknown_pointer;
                v.detail = "this pointer was never handed out (or was freed long ago)";
            }
            v.freed = freed_site();
            handle_violation(std::move(v), can_throw);
            return;
        }

        // A good free: read the guards back, poison, give back (all ordered on the freeing stream).
        std::unique_ptr<violation> guard_violation; // heap: see admit
        const stream_type s = synchronous ? stream_type{} : stream;
        if (options_.canaries) {
            if (s == stream_type{}) {
                if (auto v = check_guards_now(*guarded, ptr, s)) guard_violation = std::make_unique<violation>(std::move(*v));
            } else {
                enqueue_guard_check(*guarded, ptr, s, freed_site);
            }
        }
        if (options_.poison) {
            try {
                platform_type::memset_async(taken.outer, options_.poison_byte, taken.total, s);
                if (synchronous) platform_type::synchronize(s);
            } catch (...) {
                report_failure("custody: could not poison a freed block");
            }
        }
        give_back(taken.outer, taken.total, taken.alignment, stream, synchronous);
        if (!fired.empty()) fire(fired);
        if (guard_checks_pending_.load(std::memory_order_relaxed) != 0) drain_guard_checks(false);
        if (guard_violation) {
            guard_violation->freed = freed_site();
            handle_violation(std::move(*guard_violation), can_throw);
        }
    }

    [[nodiscard]] bool hazard(const record& r, stream_type free_stream) const noexcept {
        if (r.ordered && r.ordered_onto == platform_type::stream_key(free_stream)) return false;
        for (int i = 0; i < r.use_count; ++i)
            if (!(r.uses[static_cast<std::size_t>(i)] == free_stream)) return true;
        return false;
    }
    [[nodiscard]] static stream_type first_unordered_use(const record& r, stream_type free_stream) noexcept {
        for (int i = 0; i < r.use_count; ++i)
            if (!(r.uses[static_cast<std::size_t>(i)] == free_stream)) return r.uses[static_cast<std::size_t>(i)];
        return stream_type{};
    }

    /// Marks a block freed and remembers it, forgetting the oldest beyond remembered_frees.
    template <class Iterator>
    void remember_free_locked(Iterator it, int device, stream_type stream, bool synchronous,
                              std::uint64_t free_sequence) noexcept {
        if (options_.remembered_frees == 0) {
            ledger_.erase(it);
            return;
        }
        record& r = it->second;
        r.live = false;
        r.freed_owner = current_owner();
        r.freed_device = device;
        r.freed_stream = synchronous ? 0 : platform_type::stream_key(stream);
        r.freed_synchronous = synchronous;
        r.freed_sequence = free_sequence;
        r.freed_time_ns = now_ns();
        auto& slot = freed_ring_[ring_next_];
        if (slot.first != nullptr) {
            // Forget the oldest remembered free, unless its address was reused (or freed again)
            // since. The element is still there: only its latest slot, which comes later, erases it.
            const auto& [key, old] = *slot.first;
            if (!old.live && old.freed_sequence == slot.second) ledger_.erase(key);
        }
        slot = {&*it, free_sequence};
        ring_next_ = ring_next_ + 1 == freed_ring_.size() ? 0 : ring_next_ + 1;
    }

    /// Reads both guards back on the default stream (or a synchronous free), waits, compares.
    std::optional<violation> check_guards_now(const record& r, const void* inner, stream_type s) noexcept {
        const std::size_t g = options_.guard_bytes;
        std::array<unsigned char, 2 * max_guard_bytes> seen; // filled by the copies below
        try {
            platform_type::memcpy_async(seen.data(), static_cast<const unsigned char*>(inner) - g, g, s);
            platform_type::memcpy_async(seen.data() + g, static_cast<const unsigned char*>(inner) + r.bytes, g, s);
            platform_type::synchronize(s);
        } catch (...) {
            report_failure("custody: could not read a block's guards back");
            return std::nullopt;
        }
        return compare_guards(r, inner, seen.data());
    }

    /// On a stream, the read-back is enqueued (before the poison and the free) and checked later,
    /// once an event recorded after it has completed: a free never waits for the stream.
    template <class FreedSite>
    void enqueue_guard_check(const record& r, const void* inner, stream_type s, const FreedSite& freed_site) noexcept {
        const std::size_t g = options_.guard_bytes;
        std::optional<guard_check> c; // outlives the handler below: the copies may still be pending
        try {
            c.emplace(guard_check{r, inner, std::make_unique<unsigned char[]>(2 * g),
                                  typename platform_type::event(platform_type::stream_device(s)), freed_site()});
        } catch (...) {
            report_failure("custody: no memory for a guard check; the block goes unchecked");
            return;
        }
        try {
            platform_type::memcpy_async(c->seen.get(), static_cast<const unsigned char*>(inner) - g, g, s);
            platform_type::memcpy_async(c->seen.get() + g, static_cast<const unsigned char*>(inner) + r.bytes, g, s);
            c->done.record(s);
            std::lock_guard lock(checks_mutex_);
            guard_checks_.push_back(std::move(*c)); // strong guarantee: *c intact if it throws
            guard_checks_pending_.fetch_add(1, std::memory_order_relaxed);
        } catch (...) {
            // A copy may be enqueued into c's buffer: wait for the stream before the buffer goes.
            try {
                platform_type::synchronize(s);
            } catch (...) {
            }
            report_failure("custody: could not enqueue a guard check; the block goes unchecked");
        }
    }

public:
    /// Finishes every guard check still waiting on a stream (waits for those streams), and
    /// handles what they found; under throw_error the first is thrown.
    void check_guards() {
        drain_guard_checks(true);
        rethrow_pending();
    }

private:
    /// Handles the guard checks whose read-back has completed (all of them when `wait`).
    void drain_guard_checks(bool wait) {
        std::vector<guard_check> done;
        {
            std::lock_guard lock(checks_mutex_);
            for (auto it = guard_checks_.begin(); it != guard_checks_.end();) {
                if (wait || it->done.ready()) {
                    done.push_back(std::move(*it));
                    it = guard_checks_.erase(it);
                } else {
                    ++it;
                }
            }
            guard_checks_pending_.fetch_sub(done.size(), std::memory_order_relaxed);
        }
        for (guard_check& c : done) {
            c.done.synchronize();
            if (auto v = compare_guards(c.block, c.inner, c.seen.get())) {
                v->freed = std::move(c.freed);
                handle_violation(std::move(*v), false);
            }
        }
    }

    std::optional<violation> compare_guards(const record& r, const void* inner, const unsigned char* seen) const noexcept {
        const std::size_t g = options_.guard_bytes;
        if (std::memcmp(seen, canary_pattern_.data(), 2 * g) == 0) return std::nullopt; // the common case
        std::size_t first_bad_front = g;
        for (std::size_t i = g; i-- > 0;) // the byte nearest the block first
            if (seen[i] != options_.canary_byte) {
                first_bad_front = i;
                break;
            }
        std::size_t first_bad_back = g;
        for (std::size_t i = 0; i < g; ++i)
            if (seen[g + i] != options_.canary_byte) {
                first_bad_back = i;
                break;
            }
        if (first_bad_front == g && first_bad_back == g) return std::nullopt;
        try {
            violation v;
            v.pointer = inner;
            v.tracker = options_.name;
            v.has_allocated = true;
            v.allocated = site_of(r);
            if (first_bad_back != g) {
                v.kind = violation_kind::buffer_overflow;
                v.detail = "guard byte " + std::to_string(first_bad_back) + " after the block (offset " +
                           std::to_string(r.bytes + first_bad_back) + ") was overwritten";
            } else {
                v.kind = violation_kind::buffer_underflow;
                v.detail = "guard byte " + std::to_string(g - first_bad_front) + " before the block was overwritten";
            }
            return v;
        } catch (...) {
            return std::nullopt;
        }
    }

    /// Applies the policy. `can_throw`: throw_error throws now; otherwise it is kept pending.
    void handle_violation(violation v, bool can_throw) noexcept(false) {
        violation_count_.fetch_add(1, std::memory_order_relaxed);
        std::string text;
        try {
            text = v.describe();
            std::lock_guard lock(mutex_);
            violations_.push_back(v);
            while (violations_.size() > options_.kept_violations) violations_.pop_front();
        } catch (...) {
        }
        switch (options_.on_violation) {
        case policy::throw_error:
            if (can_throw) throw tracking_error(std::move(v));
            {
                std::lock_guard lock(mutex_);
                if (!pending_) pending_ = std::move(v);
                has_pending_.store(true, std::memory_order_release);
            }
            break;
        case policy::abort:
            report_failure(text);
            std::abort();
        case policy::log: report_failure(text); break;
        case policy::callback:
            if (options_.violation_callback) {
                options_.violation_callback(v);
            } else {
                report_failure(text);
            }
            break;
        case policy::ignore: break;
        }
    }

    /// A guard read-back enqueued on a stream. Invariant: `seen` holds 2 * guard_bytes once
    /// `done` is ready (front guard, then back guard).
    struct guard_check {
        record block;
        const void* inner = nullptr;
        std::unique_ptr<unsigned char[]> seen;
        typename platform_type::event done;
        allocation_site freed;
    };

    void handle_leaks(const leak_report& report) {
        switch (options_.on_leak) {
        case policy::abort:
            report_failure(report.describe());
            std::abort();
        case policy::throw_error:
        case policy::log: report_failure("leak in tracker '" + options_.name + "': " + report.describe()); break;
        case policy::callback:
            if (options_.leak_callback) options_.leak_callback(report);
            break;
        case policy::ignore: break;
        }
    }

    Upstream upstream_;
    tracking_options options_;
    rank_info rank_;
    std::chrono::steady_clock::time_point start_;
    std::int64_t start_coarse_ns_ = coarse_now();
    std::array<unsigned char, 2 * max_guard_bytes> canary_pattern_ = filled(options_.canary_byte); // both guards
    std::int64_t start_unix_ns_;

    mutable std::mutex mutex_; // guards everything below but the atomics
    // User pointer -> block: the live ones, and the last remembered_frees freed ones.
    // Invariant: count of live records == stats_.live_allocations.
    std::unordered_map<const void*, record> ledger_;
    // The frees remembered in ledger_ as (element, free sequence), a ring; ring_next_ is the oldest
    // slot. An element is erased only by the slot of its latest free (the one whose sequence it
    // holds), and slots are evicted in order, so every slot's element exists (unordered_map
    // elements keep their address across rehashes).
    std::vector<std::pair<const std::pair<const void* const, record>*, std::uint64_t>> freed_ring_;
    std::size_t ring_next_ = 0;
    resource_statistics stats_;                         // of the blocks in ledger_ (user bytes)
    std::uint64_t sequence_ = 0;                        // allocations handed out so far
    std::uint64_t free_sequence_ = 0;                   // deallocate calls so far
    std::unordered_map<owner_id, owner_totals> owners_; // sum over live blocks of each owner
    std::vector<device_totals> devices_;                // index device + 1
    std::vector<installed_watch> watches_;
    int last_watch_id_ = 0;
    std::deque<sample> timeline_; // size <= kept_samples
    std::deque<violation> violations_; // size <= kept_violations
    std::optional<violation> pending_;

    std::mutex checks_mutex_; // guards guard_checks_; never held with mutex_
    std::deque<guard_check> guard_checks_;
    std::atomic<std::size_t> guard_checks_pending_{0}; // == guard_checks_.size()
    std::atomic<std::uint64_t> violation_count_{0};
    std::atomic<bool> has_pending_{false};
    std::atomic<bool> has_watches_{false};
};

} // namespace custody::debug
