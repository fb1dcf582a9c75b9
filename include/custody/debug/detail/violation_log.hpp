/// @file
/// `violation_log`: what the tracking resource does with what it finds: describes a violation (the
/// one place allocation sites are made from the ledger's records), applies the policy to it (throw,
/// keep it to throw later, abort, log, call back) and to the leaks found at destruction, and keeps
/// the most recent violations for reports.
#pragma once

#include <custody/core/detail/format.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/debug/detail/call_stack.hpp>
#include <custody/debug/detail/free_checks.hpp>
#include <custody/debug/detail/guards.hpp>
#include <custody/debug/detail/ledger.hpp>
#include <custody/debug/detail/registry.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/tracking_options.hpp>

#include <atomic>
#include <cstdint>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace custody::debug::detail {

/// The violations of one tracker (on `rank`) and the policies applied to them, from its options
/// (which the tracker keeps alive and unchanged).
/// Invariants: kept().size() <= kept_violations; count() >= the violations ever kept; a pending
/// violation exists iff has_pending (read with acquire).
/// Thread safety: thread-safe; its mutex is never held while calling back or reporting.
class violation_log {
public:
    violation_log(const tracking_options& options, int rank) noexcept : options_(options), rank_(rank) {}

    /// Where the block of `r` was allocated (its stack symbolized).
    template <class Stream>
    [[nodiscard]] allocation_site site_of(const block_record<Stream>& r) const {
        return make_site(r.allocated, rank_, r.bytes, r.alignment, r.stack.symbolize());
    }
    /// The free's side of a report (with capture_stacks, the stack of the calling thread now).
    template <class Stream>
    [[nodiscard]] allocation_site freed_site(const free_call<Stream>& call) const {
        std::vector<std::string> stack;
        if (options_.capture_stacks) stack = call_stack::capture(1).symbolize();
        return make_site(call.site, rank_, call.bytes, call.alignment, std::move(stack));
    }
    /// A violation of `kind` at `ptr`, saying `what`.
    [[nodiscard]] violation make(violation_kind kind, const void* ptr, std::string what) const {
        violation v;
        v.kind = kind;
        v.pointer = ptr;
        v.tracker = options_.name;
        v.detail = std::move(what);
        return v;
    }
    /// As above, of the block `allocated`.
    template <class Stream>
    [[nodiscard]] violation make(violation_kind kind, const void* ptr, std::string what,
                                 const block_record<Stream>& allocated) const {
        violation v = make(kind, ptr, std::move(what));
        v.has_allocated = true;
        v.allocated = site_of(allocated);
        return v;
    }

    /// Describes the bad free `call`, which the ledger classified as `verdict` (with `out`). A
    /// pointer the ledger does not know, or remembers as freed, may have been handed out by another
    /// live tracker over the same memory (the registry is asked, on behalf of tracker `self`): a
    /// foreign free. An unknown one may lie inside a live block: `containing(ptr)` gives that
    /// block's user pointer and record, if any.
    template <class Platform, class Stream, class Containing>
    [[nodiscard]] violation describe_bad_free(const void* self, const free_call<Stream>& call, free_verdict verdict,
                                              const free_outcome<block_record<Stream>>& out,
                                              const Containing& containing) const {
        if (verdict == free_verdict::misuse) {
            return make(out.misuse, call.ptr, misuse_detail<Platform>(out.misuse, *out.block, call), *out.block);
        }
        allocation_site other;
        std::string other_name;
        if (tracker_registry::instance().find_owner(self, call.ptr, other, other_name)) {
            violation v = make(violation_kind::foreign_free, call.ptr, "handed out by tracker '" + other_name + "'");
            v.has_allocated = true;
            v.allocated = std::move(other);
            v.other_tracker = std::move(other_name);
            return v;
        }
        if (verdict == free_verdict::freed_before) {
            violation v = make(violation_kind::double_free, call.ptr, "the block was already given back", *out.block);
            v.has_first_free = true;
            v.first_free = make_site(out.block->freed, rank_, out.block->bytes, out.block->alignment);
            return v;
        }
        if (const auto inside = containing(call.ptr)) {
            const auto& [start, r] = *inside;
            const auto offset = reinterpret_cast<std::uintptr_t>(call.ptr) - reinterpret_cast<std::uintptr_t>(start);
            return make(violation_kind::interior_pointer, call.ptr,
                        "the pointer lies " + std::to_string(offset) + " B inside the live block at " +
                            custody::detail::to_hex(start) + " (" + std::to_string(r.bytes) +
                            " B); give back the pointer the allocation returned",
                        r);
        }
        return make(violation_kind::unknown_pointer, call.ptr, "this pointer was never handed out (or was freed long ago)");
    }

    /// An overwritten guard of the block `r`.
    template <class Stream>
    [[nodiscard]] violation overwritten_guard(const block_record<Stream>& r, const guard_damage& damage) const {
        return make(damage.kind, r.inner(), damage.describe(r.bytes), r);
    }

    /// Applies options.on_violation to `v`. `can_throw`: throw_error throws tracking_error now;
    /// otherwise it is kept pending for rethrow_pending(). policy::abort does not return.
    void handle(violation v, bool can_throw) noexcept(false) {
        count_.fetch_add(1, std::memory_order_relaxed);
        std::string text;
        try {
            text = v.describe();
            std::lock_guard lock(mutex_);
            kept_.push_back(v);
            while (kept_.size() > options_.kept_violations) kept_.pop_front();
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

    /// Applies options.on_leak to the leaks found at destruction (throw_error logs).
    void handle_leaks(const leak_report& report) const {
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

    /// Whether a violation waits to be thrown (a hint for the fast path: relaxed).
    [[nodiscard]] bool may_have_pending() const noexcept { return has_pending_.load(std::memory_order_relaxed); }

    /// Throws the violation kept pending, if any.
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

    /// The most recent violations, oldest first.
    [[nodiscard]] std::vector<violation> kept() const {
        std::lock_guard lock(mutex_);
        return {kept_.begin(), kept_.end()};
    }
    /// Every violation handled so far.
    [[nodiscard]] std::uint64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }

private:
    const tracking_options& options_;
    int rank_;
    mutable custody::detail::mutex mutex_; // guards kept_ and pending_
    std::deque<violation> kept_;
    std::optional<violation> pending_;
    std::atomic<std::uint64_t> count_{0};
    std::atomic<bool> has_pending_{false};
};

} // namespace custody::debug::detail
