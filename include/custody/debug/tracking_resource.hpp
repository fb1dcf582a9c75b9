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
///   detail/tracker_core.hpp    how a block is admitted and a free judged, reported or forwarded
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

#include <custody/core/concepts.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/rank.hpp>
#include <custody/core/statistics.hpp>
#include <custody/debug/detail/tracker_core.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/tracking_options.hpp>
#include <custody/debug/trend.hpp>
#include <custody/platform/platform.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
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
        : core_(std::move(options), std::forward<Args>(upstream_args)...) {}

    /// A tracker with default options over a default-constructed Upstream.
    tracking_resource() : tracking_resource(tracking_options{}) {}

    tracking_resource(const tracking_resource&) = delete;
    tracking_resource& operator=(const tracking_resource&) = delete;

    // ---- the resource interface ---------------------------------------------------------------

    /// Allocates `bytes` on `stream` for the current owner. Throws what the upstream throws
    /// (out_of_memory carries this request), std::invalid_argument for a bad alignment, and a
    /// pending tracking_error under policy::throw_error. Strong guarantee.
    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment) {
        return core_.allocate(stream, bytes, alignment, current_owner(), false);
    }
    /// As allocate, for an explicit owner (overrides the thread's owner scope).
    [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment,
                                 std::string_view owner) {
        return core_.allocate(stream, bytes, alignment, intern_owner(owner), false);
    }
    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment) {
        return core_.allocate(stream_type{}, bytes, alignment, current_owner(), true);
    }
    [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment, std::string_view owner) {
        return core_.allocate(stream_type{}, bytes, alignment, intern_owner(owner), true);
    }

    /// Non-throwing allocate: nullptr when the upstream is exhausted (or the request overflows).
    /// Precondition: `alignment` passed check_alignment. Pending errors are not thrown here.
    [[nodiscard]] void* try_allocate(stream_type stream, std::size_t bytes, std::size_t alignment) noexcept {
        return core_.try_allocate(stream, bytes, alignment, current_owner());
    }

    /// Gives a block back on `stream` after checking it. A violation is handled by the policy
    /// (under throw_error: thrown by the next throwing call); a bad free is not forwarded.
    void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        core_.free(stream, false, ptr, bytes, alignment, false);
    }
    void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
        if (ptr == nullptr) return;
        core_.free(stream_type{}, true, ptr, bytes, alignment, false);
    }

    /// As deallocate, but a violation under policy::throw_error throws tracking_error at once.
    void deallocate_checked(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) {
        if (ptr == nullptr) return;
        core_.free(stream, false, ptr, bytes, alignment, true);
    }
    void deallocate_sync_checked(void* ptr, std::size_t bytes, std::size_t alignment) {
        if (ptr == nullptr) return;
        core_.free(stream_type{}, true, ptr, bytes, alignment, true);
    }

    /// Statistics of what this tracker handed out: live_bytes counts user bytes, reserved_bytes
    /// what it holds from the upstream (guards included).
    [[nodiscard]] resource_statistics statistics() const noexcept { return core_.state().statistics(); }

    /// The upstream's device (-1 when it has none).
    [[nodiscard]] int device() const noexcept { return core_.device(); }

    [[nodiscard]] Upstream& upstream() noexcept { return core_.upstream(); }
    [[nodiscard]] const Upstream& upstream() const noexcept { return core_.upstream(); }
    [[nodiscard]] const tracking_options& options() const noexcept { return core_.options(); }
    [[nodiscard]] const rank_info& rank() const noexcept { return core_.rank(); }

    friend bool operator==(const tracking_resource& a, const tracking_resource& b) noexcept { return &a == &b; }
    CUSTODY_FORWARD_PROPERTIES(tracking_resource, Upstream)

    // ---- stream ordering -----------------------------------------------------------------------

    /// Declares that work on `stream` uses the live block `ptr` too: freeing it on any other stream
    /// then needs an ordering (order_before_free or declare_ordered). Throws std::invalid_argument
    /// when `ptr` is not live in this tracker (nothing changes).
    void record_use(const void* ptr, stream_type stream) {
        if (!core_.state().add_use(ptr, stream)) core_.throw_not_live(ptr);
    }

    /// Makes `free_stream` wait (an event per stream, without blocking the host) for the work
    /// enqueued so far on every stream the block is used on, and notes that the block may now be
    /// freed on `free_stream`. Throws std::invalid_argument when `ptr` is not live.
    void order_before_free(const void* ptr, stream_type free_stream) {
        const auto uses = core_.state().uses_of(ptr);
        if (!uses) core_.throw_not_live(ptr);
        for (int i = 0; i < uses->count; ++i) {
            order_after<platform_type>(uses->streams[static_cast<std::size_t>(i)], free_stream);
        }
        declare_ordered(ptr, free_stream);
    }

    /// Notes that the caller has ordered `free_stream` after every use of `ptr` (with its own
    /// event), so freeing it there is not a hazard. Throws std::invalid_argument when not live.
    void declare_ordered(const void* ptr, stream_type free_stream) {
        if (!core_.state().declare_ordered(ptr, platform_type::stream_key(free_stream))) core_.throw_not_live(ptr);
    }

    // ---- checks and queries --------------------------------------------------------------------

    /// Throws the violation kept under policy::throw_error from a noexcept path, if any.
    void rethrow_pending() { core_.violations().rethrow_pending(); }

    /// Finishes every guard check still waiting on a stream (waits for those streams), and
    /// handles what they found; under throw_error the first is thrown.
    void check_guards() {
        core_.drain_guard_checks(true);
        rethrow_pending();
    }

    /// The violations found so far (the most recent kept_violations).
    [[nodiscard]] std::vector<violation> violations() const { return core_.violations().kept(); }
    [[nodiscard]] std::uint64_t violation_count() const noexcept { return core_.violations().count(); }

    /// Is `ptr` live in this tracker? If so, where was it allocated?
    [[nodiscard]] std::optional<allocation_site> find(const void* ptr) const {
        const auto r = core_.state().find_live(ptr);
        if (!r) return std::nullopt;
        return core_.violations().site_of(*r);
    }

    /// The live allocations, in sequence order. Also takes a timeline sample and a trend sample
    /// (see sample()). O(n log n) in the live blocks.
    [[nodiscard]] debug::snapshot snapshot() {
        debug::snapshot s;
        std::vector<detail::fired_watch> fired;
        s.rank = rank().rank;
        s.time_ns = core_.clock().now_ns();
        std::tie(s.last_sequence, s.entries) = core_.state().snapshot(s.time_ns, fired);
        std::sort(s.entries.begin(), s.entries.end(),
                  [](const snapshot_entry& a, const snapshot_entry& b) { return a.sequence < b.sequence; });
        core_.fire(fired);
        return s;
    }

    /// Takes a trend sample now, as snapshot() does but without listing the live blocks: each
    /// owner's and device's floor since the previous sample is tested (trend.hpp), and the growth
    /// and trend watches run. Call it once per step (a decode step) for rates per step.
    /// O(owners + devices + watches).
    void sample() {
        std::vector<detail::fired_watch> fired;
        core_.state().sample(core_.clock().now_ns(), fired);
        core_.fire(fired);
    }

    /// The floor trend of one owner (exact name; "" or "<untagged>" for untagged memory) at the
    /// latest sample; empty before its first.
    [[nodiscard]] std::optional<trend> trend_of(std::string_view owner) const {
        return core_.state().owner_trend((owner.empty() || owner == untagged_owner) ? nullptr : intern_owner(owner));
    }

    /// Every live block as the ledger holds it (what debug/pytorch_snapshot.hpp lays out in its
    /// segments), in no particular order. O(n) in the live blocks; symbolizes nothing.
    [[nodiscard]] std::vector<live_block> live_blocks() const {
        std::vector<live_block> blocks;
        const auto records = core_.state().live_records();
        blocks.reserve(records.size());
        for (const record& r : records) {
            blocks.push_back(live_block{reinterpret_cast<std::uintptr_t>(r.inner()), r.bytes,
                                        reinterpret_cast<std::uintptr_t>(r.outer), r.total, r.allocated.owner,
                                        r.allocated.device, r.allocated.stream,
                                        core_.clock().start_unix_ns() + r.allocated.time_ns, r.stack});
        }
        return blocks;
    }

    /// The live allocations grouped by owner and call stack.
    [[nodiscard]] leak_report leaks() const {
        return detail::group_entries(rank().rank, core_.state().live_entries());
    }

    /// Live bytes and blocks of one owner (exact name; "" or "<untagged>" for untagged memory).
    [[nodiscard]] owner_usage owner_live(std::string_view owner) const {
        const owner_id id = intern_owner(owner);
        const detail::owner_totals t = core_.state().owner(id);
        return owner_usage{std::string(owner_name(id)), t.bytes, t.count, t.peak};
    }

    /// Installs a watch; returns its id (for remove_watch). Throws std::invalid_argument for a
    /// watch without a callback.
    int add_watch(watch w) {
        if (!w.callback) throw std::invalid_argument("custody: a watch needs a callback");
        const owner_id id = w.what == watch::subject::owner ? intern_owner(w.owner) : nullptr;
        return core_.state().add_watch(std::move(w), id);
    }
    /// Removes a watch; false when no such id.
    bool remove_watch(int id) { return core_.state().remove_watch(id); }

    /// Everything a per-rank JSON report holds (json_report.hpp writes it), with the upstream's
    /// reserve when it keeps statistics (a pool). Takes a timeline sample. O(n) in the live blocks
    /// plus symbolizing one stack per group.
    [[nodiscard]] rank_report make_report() {
        rank_report r;
        r.rank = rank();
        r.tracker = options().name;
        r.platform = std::string(platform_type::name);
        r.started_unix_ns = core_.clock().start_unix_ns();
        r.upstream = detail::upstream_usage_of(upstream());
        const std::vector<snapshot_entry> entries =
            core_.state().fill_report(r, core_.clock().now_ns(), core_.clock().start_unix_ns());
        std::sort(r.owners.begin(), r.owners.end(),
                  [](const owner_usage& a, const owner_usage& b) { return a.owner < b.owner; });
        r.live = detail::group_entries(rank().rank, entries);
        r.violations = core_.violations().kept();
        r.written_unix_ns = detail::tracker_clock::unix_now_ns();
        return r;
    }

private:
    using record = typename detail::tracker_core<Upstream>::record;

    detail::tracker_core<Upstream> core_; ///< the upstream and every part of the tracker
};

} // namespace custody::debug
