/// @file
/// `tracker_core`: the tracking resource's mechanics: a block admitted (its guards written, its
/// record kept), a free judged and then reported or forwarded, guard checks drained, watches fired
/// and leaks settled at the end; debug/tracking_resource.hpp is the face a user calls.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/format.hpp>
#include <custody/core/discarding.hpp>
#include <custody/core/detail/memory_annotations.hpp>
#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/owner.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/rank.hpp>
#include <custody/core/statistics.hpp>
#include <custody/debug/detail/call_stack.hpp>
#include <custody/debug/detail/free_checks.hpp>
#include <custody/debug/detail/guards.hpp>
#include <custody/debug/detail/registry.hpp>
#include <custody/debug/detail/tracker_clock.hpp>
#include <custody/debug/detail/tracker_state.hpp>
#include <custody/debug/detail/trends.hpp>
#include <custody/debug/detail/violation_log.hpp>
#include <custody/debug/detail/watches.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/tracking_options.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace custody::debug::detail {

/// What one tracker is made of (its upstream, options, rank, clock, guards, state, violations and
/// annotations) and the paths an allocation and a free take through them. The tracker's public
/// calls and queries are tracking_resource's; the parts are lent to it by reference.
/// Thread safety: as tracking_resource (guards, state and violations have a mutex each; none is held
/// while another is taken, nor while calling the upstream or a callback).
/// Ownership: holds the upstream by value; registers itself with the tracker registry for its life.
///
/// Layers below see what the tracker sees: each block is allocated from the upstream with its
/// owner current (custody::owner_binding), so a sleepable_memory or a recorder below charges the
/// owner the tracker charges; over memory that discards contents (core/discarding.hpp) the guards
/// are kept through a discard, and a block whose memory sleeps is given back without touching it.
template <stream_ordered_resource Upstream>
class tracker_core {
    static_assert(!has_property<Upstream, discards_contents> || discarding_resource<Upstream>,
                  "custody: tracking_resource over memory that discards contents (sleepable_memory) through an "
                  "adaptor that forwards the discards_contents property but not keep_through_discard, release_kept "
                  "and is_resident: a discard would zero the tracker's guards and a free would touch sleeping memory. "
                  "Add CUSTODY_FORWARD_DISCARDING(Upstream, upstream_) to the adaptor (core/discarding.hpp).");

public:
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using state_type = tracker_state<stream_type>;
    using record = typename state_type::record;

    /// Throws std::invalid_argument for guard_bytes outside 1..max_guard_bytes (with canaries on),
    /// and custody::rank_error for an impossible rank or a malformed launcher environment.
    template <class... Args>
    explicit tracker_core(tracking_options options, Args&&... upstream_args)
        : upstream_(std::forward<Args>(upstream_args)...), options_(std::move(options)),
          rank_(options_.rank ? validate_rank(*options_.rank) : detect_rank()),
          clock_(options_.precise_time, options_.clock), guards_(options_),
          state_(options_, rank_.rank, clock_.start_unix_ns(),
                 trend_budget<platform_type>(options_.trend, upstream_, device())),
          violations_(options_, rank_.rank), annotations_(options_.annotate) {
        tracker_registry::instance().add(tracker_entry{this, &registry_lookup});
    }

    tracker_core(const tracker_core&) = delete;
    tracker_core& operator=(const tracker_core&) = delete;

    ~tracker_core() {
        tracker_registry::instance().remove(this);
        drain_guard_checks(true);
        settle_leaks();
    }

    [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
    [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }
    [[nodiscard]] const tracking_options& options() const noexcept { return options_; }
    [[nodiscard]] const rank_info& rank() const noexcept { return rank_; }
    [[nodiscard]] const tracker_clock& clock() const noexcept { return clock_; }
    [[nodiscard]] state_type& state() noexcept { return state_; }
    [[nodiscard]] const state_type& state() const noexcept { return state_; }
    [[nodiscard]] violation_log& violations() noexcept { return violations_; }
    [[nodiscard]] const violation_log& violations() const noexcept { return violations_; }

    /// The upstream's device (-1 when it has none).
    [[nodiscard]] int device() const noexcept {
        if constexpr (device_bound_resource<Upstream>) {
            return static_cast<int>(upstream_.device());
        } else {
            return -1;
        }
    }

    /// One path for both allocations: `synchronous` selects the upstream's synchronous pair (and
    /// records the block as made on the default stream).
    void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment, owner_id owner, bool synchronous) {
        check_alignment(alignment, SIZE_MAX);
        if (guards_.has_pending()) drain_guard_checks(false);
        if (violations_.may_have_pending()) violations_.rethrow_pending();
        if (bytes == 0) return nullptr;
        const guard_layout l = guards_.layout_for(bytes, alignment);
        if (!l.valid) throw_out_of_memory(bytes, alignment, "the request plus its guards overflows");
        void* outer = nullptr;
        try {
            const owner_binding as_owner(owner);
            outer = synchronous ? upstream_.allocate_sync(l.total, alignment)
                                : upstream_.allocate(stream, l.total, alignment);
        } catch (const out_of_memory& e) {
            state_.note_out_of_memory(bytes, synchronous ? 0 : platform_type::stream_key(stream), clock_.now_ns());
            throw_out_of_memory(bytes, alignment, std::string("upstream: ") + e.what());
        }
        if (outer == nullptr) throw_out_of_memory(bytes, alignment, "upstream returned null");
        return admit(outer, l, stream, synchronous, bytes, alignment, owner, false);
    }

    /// Non-throwing allocate: nullptr when the upstream is exhausted (or the request overflows).
    /// Precondition: `alignment` passed check_alignment. Pending errors are not thrown here.
    [[nodiscard]] void* try_allocate(stream_type stream, std::size_t bytes, std::size_t alignment,
                                     owner_id owner) noexcept {
        if (bytes == 0 || !is_pow2(alignment)) return nullptr;
        const guard_layout l = guards_.layout_for(bytes, alignment);
        if (!l.valid) return nullptr;
        void* outer = nullptr;
        {
            const owner_binding as_owner(owner);
            outer = custody::try_allocate(upstream_, stream, l.total, alignment);
        }
        if (outer == nullptr) return nullptr;
        return admit(outer, l, stream, false, bytes, alignment, owner, /*noexcept_path=*/true);
    }

    /// Classifies the free, then reports it or forwards it. `can_throw`: a violation under
    /// throw_error is thrown here; nothing else is.
    void free(stream_type stream, bool synchronous, void* ptr, std::size_t bytes, std::size_t alignment,
              bool can_throw) noexcept(false) {
        free_call call{ptr, bytes, alignment, stream,
                       site_record{current_owner(), -1, synchronous ? 0 : platform_type::stream_key(stream),
                                   synchronous, 0, clock_.now_ns()}};
        try {
            call.site.device = device_of(stream, synchronous);
        } catch (...) {
            call.device_known = false;
            report_failure("custody: tracker '" + options_.name +
                           "' could not tell the device of a free's stream; its device check is skipped");
        }
        free_outcome out; // raw: filled as the verdict needs
        std::vector<fired_watch> fired;
        const free_verdict verdict = state_.classify(call, out, guards_.canaries(), fired);
        if (verdict == free_verdict::good) {
            forward_free(call, out, fired, can_throw);
        } else {
            report_bad_free(call, verdict, out, can_throw);
        }
    }

    /// Handles the guard checks whose read-back has completed (all of them, waiting, when `wait`).
    void drain_guard_checks(bool wait) noexcept {
        guards_.drain(wait, [&](const record& r, const guard_damage& damage, allocation_site& freed) {
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

    /// Calls the callbacks of watches that fired (outside the lock). A watch removed meanwhile is
    /// skipped; its callback is copied under the lock so removal cannot race with the call. What a
    /// callback throws is reported and dropped: it must not undo the call that fired it.
    void fire(const std::vector<fired_watch>& fired) noexcept {
        for (const auto& [id, event] : fired) {
            try {
                if (const auto callback = state_.watch_callback(id)) callback(event);
            } catch (...) {
                report_failure("custody: a watch's callback failed (or there was no memory to call it)");
            }
        }
    }

    [[noreturn]] void throw_not_live(const void* ptr) const {
        throw std::invalid_argument("custody: " + custody::detail::to_hex(ptr) + " is not live in tracker '" +
                                    options_.name + "'");
    }

private:
    using free_call = detail::free_call<stream_type>;
    using free_outcome = typename state_type::outcome;

    /// The device of a call: the stream's, or the current one for a synchronous call. Throws what
    /// the platform's query throws (a CUDA error for a stream that is gone).
    [[nodiscard]] static int device_of(stream_type stream, bool synchronous) {
        return synchronous ? platform_type::current_device() : platform_type::stream_device(stream);
    }

    [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::size_t alignment, std::string detail) const {
        throw out_of_memory(bytes, alignment, device(), state_.statistics(),
                            "tracking_resource '" + options_.name + "'", std::move(detail));
    }

    /// Writes the guards of the block the upstream just gave and records it. On any failure (the
    /// guard writes, the stream's device query, no memory for the call stack or the ledger node),
    /// gives the block back and throws (or returns nullptr on the noexcept path): the strong
    /// guarantee.
    void* admit(void* outer, const guard_layout& l, stream_type stream, bool synchronous, std::size_t bytes,
                std::size_t alignment, owner_id owner, bool noexcept_path) noexcept(false) {
        auto* inner = static_cast<unsigned char*>(outer) + l.front;
        std::vector<fired_watch> fired;
        try {
            guards_.write(outer, l, bytes, synchronous ? stream_type{} : stream, synchronous);
            keep_guards(inner, bytes);
            // Heap, not std::optional: GCC zero-fills an empty optional's storage on every call.
            std::unique_ptr<call_stack> stack;
            if (options_.capture_stacks) stack = std::make_unique<call_stack>(call_stack::capture(1));
            const site_record site{owner, device_of(stream, synchronous),
                                   synchronous ? 0 : platform_type::stream_key(stream), synchronous, 0,
                                   clock_.now_ns()};
            state_.admit(inner, {{outer, bytes, alignment, l.total, l.front}, site, stream, stack.get()}, fired);
        } catch (...) {
            release_guards(inner, bytes);
            give_back(outer, l.total, alignment, stream, synchronous);
            if (noexcept_path) return nullptr;
            throw;
        }
        annotations_.name(outer, owner_name(owner));
        fire(fired);
        return inner;
    }

    /// Over memory that discards contents: asks it to keep the guards of the block at `inner`
    /// through a discard (throws what it throws), and to forget them again.
    void keep_guards(const void* inner, std::size_t bytes) {
        if constexpr (discarding_resource<Upstream>) {
            if (!guards_.canaries()) return;
            for (const auto& g : guards_.checked_spans(inner, bytes)) upstream_.keep_through_discard(g.ptr, g.bytes);
        }
    }
    void release_guards(const void* inner, std::size_t bytes) noexcept {
        if constexpr (discarding_resource<Upstream>) {
            if (!guards_.canaries()) return;
            for (const auto& g : guards_.checked_spans(inner, bytes)) upstream_.release_kept(g.ptr, g.bytes);
        }
    }
    /// Whether the block at `inner` has its memory now (false while it sleeps in a sleepable_memory).
    [[nodiscard]] bool resident(const void* inner) const noexcept {
        if constexpr (discarding_resource<Upstream>) {
            return upstream_.is_resident(inner);
        } else {
            return true;
        }
    }

    void give_back(void* outer, std::size_t total, std::size_t alignment, stream_type stream, bool synchronous) noexcept {
        if (synchronous) {
            upstream_.deallocate_sync(outer, total, alignment);
        } else {
            upstream_.deallocate(stream, outer, total, alignment);
        }
    }

    /// Describes a bad free (outside the state's lock), then hands it to the policy.
    void report_bad_free(const free_call& call, free_verdict verdict, const free_outcome& out, bool can_throw) {
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
    /// freeing stream), then does what the free made due. A block whose memory sleeps is given back
    /// untouched.
    void forward_free(const free_call& call, const free_outcome& out, const std::vector<fired_watch>& fired,
                      bool can_throw) {
        std::unique_ptr<violation> overwritten; // rare; on the heap, so the common path zero-fills nothing
        const bool touchable = resident(call.ptr);
        if (out.block != nullptr && touchable) {
            if (call.stream == stream_type{}) {
                if (const auto damage = guards_.check_now(call.ptr, out.block->bytes, call.stream)) {
                    overwritten = describe_overwritten(*out.block, *damage, call);
                }
            } else {
                guards_.check_later(*out.block, call.ptr, call.stream, [&] { return violations_.freed_site(call); });
            }
        }
        if (touchable) guards_.poison(out.outer, out.total, call.stream, call.site.synchronous);
        if (out.block != nullptr) release_guards(call.ptr, out.block->bytes);
        give_back(out.outer, out.total, out.alignment, call.stream, call.site.synchronous);
        fire(fired);
        if (guards_.has_pending()) drain_guard_checks(false);
        if (overwritten) violations_.handle(std::move(*overwritten), can_throw);
    }

    /// The violation an overwritten guard of `r` is, freed by `call`; nullptr (reported) when there
    /// is no memory to describe it.
    [[nodiscard]] std::unique_ptr<violation> describe_overwritten(const record& r, const guard_damage& damage,
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
            violations_.handle_leaks(group_entries(rank_.rank, entries));
        } catch (...) {
            report_failure("custody: tracking_resource could not build its leak report");
        }
        if (options_.release_leaks) {
            for (const record& r : records) {
                release_guards(r.inner(), r.bytes);
                upstream_.deallocate_sync(r.outer, r.total, r.alignment);
            }
        }
    }

    static bool registry_lookup(const void* self, const void* ptr, allocation_site& site, std::string& name) {
        const auto* t = static_cast<const tracker_core*>(self);
        const auto r = t->state_.find_live(ptr);
        if (!r) return false;
        site = t->violations_.site_of(*r);
        name = t->options_.name;
        return true;
    }

    Upstream upstream_;
    tracking_options options_;
    rank_info rank_;
    tracker_clock clock_;
    block_guards<platform_type, record> guards_; // the three below have a mutex each; none is
    state_type state_;                          // held while another is taken, nor while
    violation_log violations_;                  // calling the upstream or a callback
    custody::detail::memory_annotations annotations_; // names for CUDA's tools
};

} // namespace custody::debug::detail
