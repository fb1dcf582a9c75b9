/// @file
/// `tracker_state`: what a tracking resource knows, behind one mutex: its ledger, its watches, its
/// timeline and its trends. Every operation holds the mutex for O(1) work (listings and samples
/// aside) and copies out what a report needs, so that strings are built and stacks symbolized after
/// the lock is released.
#pragma once

#include <custody/core/detail/mutex.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/statistics.hpp>
#include <custody/debug/detail/free_checks.hpp>
#include <custody/debug/detail/ledger.hpp>
#include <custody/debug/detail/timeline.hpp>
#include <custody/debug/detail/trends.hpp>
#include <custody/debug/detail/watches.hpp>
#include <custody/debug/history.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/debug/report.hpp>
#include <custody/debug/tracking_options.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace custody::debug::detail {

/// The ledger, watches, timeline and trends of one tracker and the mutex that guards them.
/// Thread safety: thread-safe. The mutex is never held while calling a callback, the upstream,
/// the platform or the registry. Complexity: O(1) expected per call but the listings (O(records)).
template <class Stream>
class tracker_state {
public:
    using ledger_type = ledger<Stream>;
    using record = typename ledger_type::record;
    using outcome = free_outcome<record>;

    /// `start_unix_ns`: the Unix time of the tracker's time 0 (its clock's start), for the history;
    /// `budget`: the bytes the trends' time left counts down to (trend_budget), when known.
    tracker_state(const tracking_options& options, int rank, std::int64_t start_unix_ns,
                  std::optional<std::size_t> budget = std::nullopt)
        : ledger_(options.remembered_frees), timeline_(options.kept_samples), trends_(options.trend, budget),
          history_(options.history), start_unix_ns_(start_unix_ns), rank_(rank), check_device_(options.check_device),
          check_streams_(options.check_streams) {}

    /// Records a block (see ledger::admit; strong guarantee), runs the threshold watches and takes
    /// a trend sample when one is due, appending the watches that fire to `fired`.
    void admit(const void* inner, const admission<Stream>& a, std::vector<fired_watch>& fired) {
        std::lock_guard lock(mutex_);
        if (!watches_.empty()) fired.reserve(watches_.size()); // before the first change
        const record& r = ledger_.admit(inner, a);
        watch_change_locked(r.allocated.owner, r.totals->bytes, r.allocated.device, fired);
        remember_locked(history_action::alloc, inner, r, r.allocated.time_ns);
        if (trends_.due(a.site.time_ns)) sample_after_admit_locked(a.site.time_ns, fired);
    }

    /// Records an allocation of `bytes` that found no memory, in the history (when kept).
    void note_out_of_memory(std::size_t bytes, std::uintptr_t stream, std::int64_t time_ns) noexcept {
        if (history_) history_->record(history_event{history_action::oom, 0, bytes, stream, start_unix_ns_ + time_ns, current_owner(), {}});
    }

    /// Numbers the free `call` and looks it up. A good free takes the block out of the ledger (and
    /// copies its record into `out` when `keep_good`); a bad one leaves the ledger as it is, with
    /// the record copied into `out` (but for an unknown pointer).
    [[nodiscard]] free_verdict classify(free_call<Stream>& call, outcome& out, bool keep_good,
                                        std::vector<fired_watch>& fired) noexcept {
        std::lock_guard lock(mutex_);
        call.site.sequence = ledger_.next_free_sequence();
        typename ledger_type::entry* e = ledger_.find(call.ptr);
        if (e == nullptr) return free_verdict::unknown;
        const record& r = e->second;
        if (!r.live) {
            out.keep(r);
            return free_verdict::freed_before;
        }
        if (const auto kind = misuse_of(r, call, check_device_, check_streams_)) {
            out.misuse = *kind;
            out.keep(r);
            return free_verdict::misuse;
        }
        out.outer = r.outer;
        out.total = r.total;
        out.alignment = r.alignment;
        if (keep_good) out.keep(r);
        const owner_id owner = r.allocated.owner;
        const owner_totals& totals = *r.totals;
        const int device = r.allocated.device;
        remember_locked(history_action::free_requested, call.ptr, r, call.site.time_ns);
        remember_locked(history_action::free_completed, call.ptr, r, call.site.time_ns);
        ledger_.release(*e, call.site); // `r` may be gone from here on
        watch_change_locked(owner, totals.bytes, device, fired);
        return free_verdict::good;
    }

    // ---- the streams a live block is used on: false (nothing changed) when it is not live -------

    bool add_use(const void* ptr, Stream s) {
        std::lock_guard lock(mutex_);
        record* r = ledger_.find_live(ptr);
        if (r != nullptr) r->uses.add(s);
        return r != nullptr;
    }
    [[nodiscard]] std::optional<stream_uses<Stream>> uses_of(const void* ptr) const {
        std::lock_guard lock(mutex_);
        const record* r = ledger_.find_live(ptr);
        if (r == nullptr) return std::nullopt;
        return r->uses;
    }
    bool declare_ordered(const void* ptr, std::uintptr_t free_stream_key) {
        std::lock_guard lock(mutex_);
        record* r = ledger_.find_live(ptr);
        if (r == nullptr) return false;
        r->uses.ordered = true;
        r->uses.ordered_onto = free_stream_key;
        return true;
    }

    // ---- queries: copies -----------------------------------------------------------------------

    [[nodiscard]] resource_statistics statistics() const noexcept {
        std::lock_guard lock(mutex_);
        return ledger_.statistics();
    }
    [[nodiscard]] std::optional<record> find_live(const void* ptr) const {
        std::lock_guard lock(mutex_);
        const record* r = ledger_.find_live(ptr);
        if (r == nullptr) return std::nullopt;
        return *r;
    }
    /// The live block `ptr` lies inside, past its start: its user pointer and record. O(records).
    [[nodiscard]] std::optional<std::pair<const void*, record>> containing(const void* ptr) const {
        std::lock_guard lock(mutex_);
        const auto* e = ledger_.containing(ptr);
        if (e == nullptr) return std::nullopt;
        return std::pair<const void*, record>(e->first, e->second);
    }
    [[nodiscard]] std::vector<record> live_records() const {
        std::vector<record> records;
        std::lock_guard lock(mutex_);
        records.reserve(ledger_.statistics().live_allocations);
        ledger_.for_each_live([&](const record& r) { records.push_back(r); });
        return records;
    }
    [[nodiscard]] std::vector<snapshot_entry> live_entries() const {
        std::lock_guard lock(mutex_);
        return ledger_.live_entries();
    }
    [[nodiscard]] owner_totals owner(owner_id id) const noexcept {
        std::lock_guard lock(mutex_);
        return ledger_.owner(id);
    }

    /// The live blocks (in no order) and the last sequence for a snapshot at `time_ns`; also takes
    /// a timeline sample and a trend sample (which runs the growth and trend watches).
    [[nodiscard]] std::pair<std::uint64_t, std::vector<snapshot_entry>> snapshot(std::int64_t time_ns,
                                                                               std::vector<fired_watch>& fired) {
        std::lock_guard lock(mutex_);
        timeline_.sample(time_ns, ledger_.owners());
        sample_locked(time_ns, fired);
        return {ledger_.last_sequence(), ledger_.live_entries()};
    }

    /// Takes a trend sample at `time_ns`: every owner's and device's floor since the previous one
    /// is tested (trend_set), and the growth and trend watches run. O(owners + devices + watches).
    void sample(std::int64_t time_ns, std::vector<fired_watch>& fired) {
        std::lock_guard lock(mutex_);
        sample_locked(time_ns, fired);
    }

    /// Fills the totals, owners, devices, timeline and trends of a report (taking a timeline
    /// sample at `time_ns`) and returns the live blocks for its leak groups.
    [[nodiscard]] std::vector<snapshot_entry> fill_report(rank_report& r, std::int64_t time_ns,
                                                          std::int64_t start_unix_ns) {
        std::lock_guard lock(mutex_);
        r.totals = ledger_.statistics();
        timeline_.sample(time_ns, ledger_.owners());
        for (const auto& [id, o] : ledger_.owners()) {
            if (o.count != 0 || o.peak != 0) r.owners.push_back(owner_usage{std::string(owner_name(id)), o.bytes, o.count, o.peak});
        }
        r.devices = ledger_.device_usages();
        r.timeline = timeline_.report(start_unix_ns);
        r.trends.samples = trends_.samples();
        r.trends.budget_bytes = trends_.budget();
        r.trends.owners = trends_.owners(start_unix_ns);
        r.trends.devices = trends_.devices(start_unix_ns);
        return ledger_.live_entries();
    }

    /// The trend of one owner now (empty before its first sample).
    [[nodiscard]] std::optional<trend> owner_trend(owner_id id) const {
        std::lock_guard lock(mutex_);
        return trends_.of_owner(id, start_unix_ns_);
    }

    // ---- watches -------------------------------------------------------------------------------

    /// Installs `w` (`owner`: w.owner interned); returns its id.
    int add_watch(watch w, owner_id owner) {
        std::lock_guard lock(mutex_);
        const std::size_t live = live_of_locked(w, owner);
        return watches_.add(std::move(w), owner, live);
    }
    bool remove_watch(int id) {
        std::lock_guard lock(mutex_);
        return watches_.remove(id);
    }
    /// The callback of watch `id` (empty when removed), copied: the caller calls it unlocked.
    [[nodiscard]] std::function<void(const watch_event&)> watch_callback(int id) const {
        std::lock_guard lock(mutex_);
        return watches_.callback_of(id);
    }

private:
    /// Records `action` on the block `r` at user pointer `inner` in the history (when kept): the
    /// allocation's owner, stream and stack, at tracker time `time_ns`.
    void remember_locked(history_action action, const void* inner, const record& r, std::int64_t time_ns) noexcept {
        if (!history_) return;
        history_->record(history_event{action, reinterpret_cast<std::uintptr_t>(inner), r.bytes, r.allocated.stream,
                                       start_unix_ns_ + time_ns, r.allocated.owner, r.stack});
    }

    /// A trend sample (see sample): the trends, then the watches that samples and trends fire.
    void sample_locked(std::int64_t time_ns, std::vector<fired_watch>& fired) {
        std::vector<raised_trend> raised;
        trends_.sample(ledger_, time_ns, start_unix_ns_, raised);
        const auto live_of = [&](const watch& w, owner_id owner) { return live_of_locked(w, owner); };
        watches_.on_sample(live_of, rank_, fired);
        if (!raised.empty()) watches_.on_trends(raised, live_of, rank_, fired);
    }

    /// A sample due at an allocation: after the block was recorded, so a failure (no memory for a
    /// new owner's test) is reported and the allocation stands.
    void sample_after_admit_locked(std::int64_t time_ns, std::vector<fired_watch>& fired) noexcept {
        try {
            sample_locked(time_ns, fired);
        } catch (...) {
            report_failure("custody: no memory for a trend sample; it is skipped");
        }
    }

    void watch_change_locked(owner_id owner, std::size_t owner_bytes, int device, std::vector<fired_watch>& fired) noexcept {
        if (!watches_.empty()) watches_.on_change(owner, owner_bytes, device, ledger_.device(device).bytes, rank_, fired);
    }
    [[nodiscard]] std::size_t live_of_locked(const watch& w, owner_id owner) const noexcept {
        return w.what == watch::subject::owner ? ledger_.owner(owner).bytes : ledger_.device(w.device).bytes;
    }

    mutable custody::detail::mutex mutex_; // guards the four below
    ledger_type ledger_;
    watch_set watches_;
    timeline timeline_;
    trend_set trends_;
    std::shared_ptr<allocation_history> history_; ///< null: none kept
    std::int64_t start_unix_ns_;
    int rank_;
    bool check_device_;
    bool check_streams_;
};

} // namespace custody::debug::detail
