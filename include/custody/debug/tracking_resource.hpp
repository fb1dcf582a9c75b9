/// @file
/// `tracking_resource<Upstream>`: an adaptor that keeps a ledger of every live allocation (owner,
/// rank, device, stream, sequence, time, optionally the call stack), catches bad frees before they
/// reach the upstream, guards blocks with canaries, poisons freed memory, and reports leaks,
/// snapshots, differences and per-rank reports.
///
/// Map of the debug layer (docs/debug.md tells it in full):
///   tracking_resource.hpp      this adaptor: classifies each free, then reports or forwards it
///   tracking_options.hpp       tracking_options; watch and watch_event (live-bytes alarms)
///   owner_scope.hpp            owner_scope: RAII, thread-local, nestable owner names
///   report.hpp                 violation, tracking_error, policy, leak_report, snapshot, diff, rank_report
///   json_report.hpp            rank_report <-> JSON (docs/debug-report-schema.json)
///   merge.hpp                  N rank reports -> cross-rank table and Chrome/Perfetto trace
///   detail/tracker_state.hpp   what a tracker knows, behind its mutex: ledger, watches, timeline
///     detail/ledger.hpp        live and remembered freed blocks; totals per owner and device
///     detail/watches.hpp       threshold and growth alarms
///     detail/timeline.hpp      live bytes per owner over time
///   detail/free_checks.hpp     a free as asked, what the ledger makes of it, the checks it must pass
///   detail/guards.hpp          canaries (written, read back, compared) and poison
///   detail/violation_log.hpp   violations described, policies applied, the recent ones kept
///   detail/tracker_clock.hpp   the tracker's time
///   detail/registry.hpp        the live trackers, asked who handed out a foreign pointer
///   detail/call_stack.hpp      call stacks, captured cheaply, symbolized for reports
///     detail/symbolizer.hpp    addresses -> function, file, line (libdw)
///     detail/dwarf_unit_index.hpp  one DWARF unit's functions, for the symbolizer's search
///     detail/frame_text.hpp    one frame's text in a report, written and read back
///     detail/function_name.hpp a function's name as frames show it; the runtime's frames
/// The rank itself (rank_info, detect_rank()) is core/rank.hpp; the rank from an NCCL communicator
/// and the live cross-rank view gathered over NCCL are in interop/nccl/.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/format.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/rank.hpp>
#include <custody/core/statistics.hpp>
#include <custody/debug/detail/call_stack.hpp>
#include <custody/debug/detail/free_checks.hpp>
#include <custody/debug/detail/guards.hpp>
#include <custody/debug/detail/registry.hpp>
#include <custody/debug/detail/tracker_clock.hpp>
#include <custody/debug/detail/tracker_state.hpp>
#include <custody/debug/detail/violation_log.hpp>
#include <custody/debug/detail/watches.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/tracking_options.hpp>
#include <custody/platform/platform.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
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
/// Canaries: the upstream block is [front guard][user bytes][back guard], the front guard rounded
/// up to the alignment. The guards are written and read back with the platform's asynchronous
/// copies (device memory included): on the default stream the check is immediate; on another
/// stream it runs once the stream gets there, so a free never waits for its stream (see
/// detail/guards.hpp). Poison: freed memory is filled with poison_byte on the freeing stream.
///
/// Stream semantics: as the upstream's; guard writes and poison fills are enqueued on the
/// allocating or freeing stream, so they are ordered with the user's work there.
/// Thread safety: thread-safe; one mutex guards the ledger (held for O(1) work per call, never
/// while calling the upstream, a callback or the registry); the pending guard checks and the kept
/// violations have a mutex each.
/// Ownership: holds the upstream by value (constructed in place from the constructor's extra
/// arguments). At destruction, blocks still live are reported (policy on_leak) and, with
/// release_leaks, given back to the upstream synchronously (their streams may be gone). The
/// caller keeps the streams it passes alive until the calls that use them return, as always.
/// Complexity: allocate and deallocate are O(1) expected (hash maps) plus the guard/poison copies.
/// CUDA's tools: with tracking_options::annotate and an NVTX tool named to the process, each block is
/// named after its owner (the upstream's block, guards included: the region a pool announced, or
/// an allocation of its own).
/// Equality: identity.
template <stream_ordered_resource Upstream>
class tracking_resource final {
public:
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using upstream_type = Upstream;

    /// A tracker with `options` over an Upstream constructed from `upstream_args`.
    /// Throws std::invalid_argument for guard_bytes outside 1..max_guard_bytes (with canaries on),
    /// and custody::rank_error for an impossible rank (see custody::validate_rank) or a malformed
    /// launcher environment.
    template <class... Args>
    explicit tracking_resource(tracking_options options, Args&&... upstream_args)
        : upstream_(std::forward<Args>(upstream_args)...), options_(std::move(options)),
          rank_(options_.rank ? validate_rank(*options_.rank) : detect_rank()), clock_(options_.precise_time),
          guards_(options_), state_(options_, rank_.rank, clock_.start_unix_ns()), violations_(options_, rank_.rank),
          annotations_(options_.annotate) {
        detail::tracker_registry::instance().add(detail::tracker_entry{this, &registry_lookup});
    }

    /// A tracker with default options over a default-constructed Upstream.
    tracking_resource() : tracking_resource(tracking_options{}) {}

    tracking_resource(const tracking_resource&) = delete;
    tracking_resource& operator=(const tracking_resource&) = delete;

    ~tracking_resource() {
        detail::tracker_registry::instance().remove(this);
        drain_guard_checks(true);
        settle_leaks();
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
        const detail::guard_layout l = guards_.layout_for(bytes, alignment);
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
    [[nodiscard]] resource_statistics statistics() const noexcept { return state_.statistics(); }

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
        if (!state_.add_use(ptr, stream)) throw_not_live(ptr);
    }

    /// Makes `free_stream` wait (an event per stream, without blocking the host) for the work
    /// enqueued so far on every stream the block is used on, and notes that the block may now be
    /// freed on `free_stream`. Throws std::invalid_argument when `ptr` is not live.
    void order_before_free(const void* ptr, stream_type free_stream) {
        const auto uses = state_.uses_of(ptr);
        if (!uses) throw_not_live(ptr);
        for (int i = 0; i < uses->count; ++i) {
            order_after<platform_type>(uses->streams[static_cast<std::size_t>(i)], free_stream);
        }
        declare_ordered(ptr, free_stream);
    }

    /// Notes that the caller has ordered `free_stream` after every use of `ptr` (with its own
    /// event), so freeing it there is not a hazard. Throws std::invalid_argument when not live.
    void declare_ordered(const void* ptr, stream_type free_stream) {
        if (!state_.declare_ordered(ptr, platform_type::stream_key(free_stream))) throw_not_live(ptr);
    }

    // ---- checks and queries --------------------------------------------------------------------

    /// Throws the violation kept under policy::throw_error from a noexcept path, if any.
    void rethrow_pending() { violations_.rethrow_pending(); }

    /// Finishes every guard check still waiting on a stream (waits for those streams), and
    /// handles what they found; under throw_error the first is thrown.
    void check_guards() {
        drain_guard_checks(true);
        rethrow_pending();
    }

    /// The violations found so far (the most recent kept_violations).
    [[nodiscard]] std::vector<violation> violations() const { return violations_.kept(); }
    [[nodiscard]] std::uint64_t violation_count() const noexcept { return violations_.count(); }

    /// Is `ptr` live in this tracker? If so, where was it allocated?
    [[nodiscard]] std::optional<allocation_site> find(const void* ptr) const {
        const auto r = state_.find_live(ptr);
        if (!r) return std::nullopt;
        return violations_.site_of(*r);
    }

    /// The live allocations, in sequence order. Also takes a timeline sample and runs the growth
    /// watches. O(n log n) in the live blocks.
    [[nodiscard]] debug::snapshot snapshot() {
        debug::snapshot s;
        std::vector<detail::fired_watch> fired;
        s.rank = rank_.rank;
        s.time_ns = clock_.now_ns();
        std::tie(s.last_sequence, s.entries) = state_.snapshot(s.time_ns, fired);
        std::sort(s.entries.begin(), s.entries.end(),
                  [](const snapshot_entry& a, const snapshot_entry& b) { return a.sequence < b.sequence; });
        fire(fired);
        return s;
    }

    /// Every live block as the ledger holds it (what debug/pytorch_snapshot.hpp lays out in its
    /// segments), in no particular order. O(n) in the live blocks; symbolizes nothing.
    [[nodiscard]] std::vector<live_block> live_blocks() const {
        std::vector<live_block> blocks;
        const auto records = state_.live_records();
        blocks.reserve(records.size());
        for (const record& r : records) {
            blocks.push_back(live_block{reinterpret_cast<std::uintptr_t>(r.inner()), r.bytes,
                                        reinterpret_cast<std::uintptr_t>(r.outer), r.total, r.allocated.owner,
                                        r.allocated.device, r.allocated.stream,
                                        clock_.start_unix_ns() + r.allocated.time_ns, r.stack});
        }
        return blocks;
    }

    /// The live allocations grouped by owner and call stack.
    [[nodiscard]] leak_report leaks() const { return detail::group_entries(rank_.rank, state_.live_entries()); }

    /// Live bytes and blocks of one owner (exact name; "" or "<untagged>" for untagged memory).
    [[nodiscard]] owner_usage owner_live(std::string_view owner) const {
        const owner_id id = intern_owner(owner);
        const detail::owner_totals t = state_.owner(id);
        return owner_usage{std::string(owner_name(id)), t.bytes, t.count, t.peak};
    }

    /// Installs a watch; returns its id (for remove_watch). Throws std::invalid_argument for a
    /// watch without a callback.
    int add_watch(watch w) {
        if (!w.callback) throw std::invalid_argument("custody: a watch needs a callback");
        const owner_id id = w.what == watch::subject::owner ? intern_owner(w.owner) : nullptr;
        return state_.add_watch(std::move(w), id);
    }
    /// Removes a watch; false when no such id.
    bool remove_watch(int id) { return state_.remove_watch(id); }

    /// Everything a per-rank JSON report holds (json_report.hpp writes it), with the upstream's
    /// reserve when it keeps statistics (a pool). Takes a timeline sample. O(n) in the live blocks plus symbolizing one stack per group.
    [[nodiscard]] rank_report make_report() {
        rank_report r;
        r.rank = rank_;
        r.tracker = options_.name;
        r.platform = std::string(platform_type::name);
        r.started_unix_ns = clock_.start_unix_ns();
        r.upstream = detail::upstream_usage_of(upstream_);
        const std::vector<snapshot_entry> entries = state_.fill_report(r, clock_.now_ns(), clock_.start_unix_ns());
        std::sort(r.owners.begin(), r.owners.end(),
                  [](const owner_usage& a, const owner_usage& b) { return a.owner < b.owner; });
        r.live = detail::group_entries(rank_.rank, entries);
        r.violations = violations_.kept();
        r.written_unix_ns = detail::tracker_clock::unix_now_ns();
        return r;
    }

private:
    using state_type = detail::tracker_state<stream_type>;
    using record = typename state_type::record;
    using free_call = detail::free_call<stream_type>;
    using free_outcome = typename state_type::outcome;

    /// The device of a call: the stream's, or the current one for a synchronous call. Throws what
    /// the platform's query throws (a CUDA error for a stream that is gone).
    [[nodiscard]] static int device_of(stream_type stream, bool synchronous) {
        return synchronous ? platform_type::current_device() : platform_type::stream_device(stream);
    }

    /// One path for both allocations: `synchronous` selects the upstream's synchronous pair (and
    /// records the block as made on the default stream).
    void* allocate_for(stream_type stream, std::size_t bytes, std::size_t alignment, owner_id owner,
                       bool synchronous = false) {
        check_alignment(alignment, SIZE_MAX);
        if (guards_.has_pending()) drain_guard_checks(false);
        if (violations_.may_have_pending()) violations_.rethrow_pending();
        if (bytes == 0) return nullptr;
        const detail::guard_layout l = guards_.layout_for(bytes, alignment);
        if (!l.valid) throw_out_of_memory(bytes, alignment, "the request plus its guards overflows");
        void* outer = nullptr;
        try {
            outer = synchronous ? upstream_.allocate_sync(l.total, alignment)
                                : upstream_.allocate(stream, l.total, alignment);
        } catch (const out_of_memory& e) {
            state_.note_out_of_memory(bytes, synchronous ? 0 : platform_type::stream_key(stream), clock_.now_ns());
            throw_out_of_memory(bytes, alignment, std::string("upstream: ") + e.what());
        }
        if (outer == nullptr) throw_out_of_memory(bytes, alignment, "upstream returned null");
        return admit(outer, l, stream, synchronous, bytes, alignment, owner, false);
    }

    [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::size_t alignment, std::string detail) const {
        throw out_of_memory(bytes, alignment, device(), statistics(), "tracking_resource '" + options_.name + "'",
                            std::move(detail));
    }
    [[noreturn]] void throw_not_live(const void* ptr) const {
        throw std::invalid_argument("custody: " + custody::detail::to_hex(ptr) + " is not live in tracker '" +
                                    options_.name + "'");
    }

    /// Writes the guards of the block the upstream just gave and records it. On any failure (the
    /// guard writes, the stream's device query, no memory for the call stack or the ledger node),
    /// gives the block back and throws (or returns nullptr on the noexcept path): the strong
    /// guarantee.
    void* admit(void* outer, const detail::guard_layout& l, stream_type stream, bool synchronous, std::size_t bytes,
                std::size_t alignment, owner_id owner, bool noexcept_path) noexcept(false) {
        auto* inner = static_cast<unsigned char*>(outer) + l.front;
        std::vector<detail::fired_watch> fired;
        try {
            guards_.write(outer, l, bytes, synchronous ? stream_type{} : stream, synchronous);
            // Heap, not std::optional: GCC zero-fills an empty optional's storage on every call.
            std::unique_ptr<detail::call_stack> stack;
            if (options_.capture_stacks) stack = std::make_unique<detail::call_stack>(detail::call_stack::capture(1));
            const detail::site_record site{owner, device_of(stream, synchronous),
                                           synchronous ? 0 : platform_type::stream_key(stream), synchronous, 0,
                                           clock_.now_ns()};
            state_.admit(inner, {{outer, bytes, alignment, l.total, l.front}, site, stream, stack.get()}, fired);
        } catch (...) {
            give_back(outer, l.total, alignment, stream, synchronous);
            if (noexcept_path) return nullptr;
            throw;
        }
        annotations_.name(outer, owner_name(owner));
        fire(fired);
        return inner;
    }

    void give_back(void* outer, std::size_t total, std::size_t alignment, stream_type stream, bool synchronous) noexcept {
        if (synchronous) {
            upstream_.deallocate_sync(outer, total, alignment);
        } else {
            upstream_.deallocate(stream, outer, total, alignment);
        }
    }

    /// Classifies the free, then reports it or forwards it. `can_throw`: a violation under
    /// throw_error is thrown here; nothing else is.
    void free_impl(stream_type stream, bool synchronous, void* ptr, std::size_t bytes, std::size_t alignment,
                   bool can_throw) noexcept(false) {
        free_call call{ptr, bytes, alignment, stream,
                       detail::site_record{current_owner(), -1, synchronous ? 0 : platform_type::stream_key(stream),
                                           synchronous, 0, clock_.now_ns()}};
        try {
            call.site.device = device_of(stream, synchronous);
        } catch (...) {
            call.device_known = false;
            report_failure("custody: tracker '" + options_.name +
                           "' could not tell the device of a free's stream; its device check is skipped");
        }
        free_outcome out; // raw: filled as the verdict needs
        std::vector<detail::fired_watch> fired;
        const detail::free_verdict verdict = state_.classify(call, out, guards_.canaries(), fired);
        if (verdict == detail::free_verdict::good) {
            forward_free(call, out, fired, can_throw);
        } else {
            report_bad_free(call, verdict, out, can_throw);
        }
    }

    /// Describes a bad free (outside the state's lock), then hands it to the policy.
    void report_bad_free(const free_call& call, detail::free_verdict verdict, const free_outcome& out,
                         bool can_throw) {
        violation v;
        try {
            v = violations_.describe_bad_free<platform_type>(this, call, verdict, out,
                                                             [&](const void* p) { return state_.containing(p); });
            v.freed = violations_.freed_site(call);
        } catch (...) {
            report_failure("custody: no memory to describe a bad free");
            return;
        }
        violations_.handle(std::move(v), can_throw);
    }

    /// A good free: reads the guards back, poisons, gives the block back (all ordered on the
    /// freeing stream), then does what the free made due.
    void forward_free(const free_call& call, const free_outcome& out, const std::vector<detail::fired_watch>& fired,
                      bool can_throw) {
        std::unique_ptr<violation> overwritten; // rare; on the heap, so the common path zero-fills nothing
        if (out.block != nullptr) {
            if (call.stream == stream_type{}) {
                if (const auto damage = guards_.check_now(call.ptr, out.block->bytes, call.stream)) {
                    overwritten = describe_overwritten(*out.block, *damage, call);
                }
            } else {
                guards_.check_later(*out.block, call.ptr, call.stream, [&] { return violations_.freed_site(call); });
            }
        }
        guards_.poison(out.outer, out.total, call.stream, call.site.synchronous);
        give_back(out.outer, out.total, out.alignment, call.stream, call.site.synchronous);
        fire(fired);
        if (guards_.has_pending()) drain_guard_checks(false);
        if (overwritten) violations_.handle(std::move(*overwritten), can_throw);
    }

    /// The violation an overwritten guard of `r` is, freed by `call`; nullptr (reported) when there
    /// is no memory to describe it.
    [[nodiscard]] std::unique_ptr<violation> describe_overwritten(const record& r, const detail::guard_damage& damage,
                                                                  const free_call& call) const noexcept {
        try {
            auto v = std::make_unique<violation>(violations_.overwritten_guard(r, damage));
            v->freed = violations_.freed_site(call);
            return v;
        } catch (...) {
            report_failure("custody: no memory to describe an overwritten guard");
            return nullptr;
        }
    }

    /// Handles the guard checks whose read-back has completed (all of them, waiting, when `wait`).
    void drain_guard_checks(bool wait) noexcept {
        guards_.drain(wait, [&](const record& r, const detail::guard_damage& damage, allocation_site& freed) {
            std::optional<violation> v;
            try {
                v = violations_.overwritten_guard(r, damage);
            } catch (...) {
                report_failure("custody: no memory to describe an overwritten guard");
                return;
            }
            v->freed = std::move(freed);
            violations_.handle(std::move(*v), false);
        });
    }

    /// At destruction: reports the blocks still live (policy on_leak) and, with release_leaks,
    /// gives them back to the upstream synchronously (their streams may be gone).
    void settle_leaks() noexcept {
        std::vector<record> records;
        try {
            records = state_.live_records();
        } catch (...) {
            report_failure("custody: tracking_resource could not list its leaks");
            return;
        }
        if (records.empty()) return;
        try {
            std::vector<snapshot_entry> entries;
            entries.reserve(records.size());
            for (const record& r : records) entries.push_back(state_type::ledger_type::entry_of(r));
            violations_.handle_leaks(detail::group_entries(rank_.rank, entries));
        } catch (...) {
            report_failure("custody: tracking_resource could not build its leak report");
        }
        if (options_.release_leaks) {
            for (const record& r : records) upstream_.deallocate_sync(r.outer, r.total, r.alignment);
        }
    }

    /// Calls the callbacks of watches that fired (outside the lock). A watch removed meanwhile is
    /// skipped; its callback is copied under the lock so removal cannot race with the call. What a
    /// callback throws is reported and dropped: it must not undo the call that fired it.
    void fire(const std::vector<detail::fired_watch>& fired) noexcept {
        for (const auto& [id, event] : fired) {
            try {
                if (const auto callback = state_.watch_callback(id)) callback(event);
            } catch (...) {
                report_failure("custody: a watch's callback failed (or there was no memory to call it)");
            }
        }
    }

    static bool registry_lookup(const void* self, const void* ptr, allocation_site& site, std::string& name) {
        const auto* t = static_cast<const tracking_resource*>(self);
        const auto r = t->state_.find_live(ptr);
        if (!r) return false;
        site = t->violations_.site_of(*r);
        name = t->options_.name;
        return true;
    }

    Upstream upstream_;
    tracking_options options_;
    rank_info rank_;
    detail::tracker_clock clock_;
    detail::block_guards<platform_type, record> guards_; // the three below have a mutex each; none is
    state_type state_;                                  // held while another is taken, nor while
    detail::violation_log violations_;                  // calling the upstream or a callback
    custody::detail::memory_annotations annotations_;   // names for CUDA's tools
};

} // namespace custody::debug
