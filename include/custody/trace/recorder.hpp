/// @file
/// `trace::recorder`: writes one process's allocation events to a trace file (one file per rank),
/// losslessly and in sequence order, with a per-thread buffer and a writer thread so that
/// recording costs a few nanoseconds and no system call per event.
///
/// Map:
///   recorder                 the file, the sequence counter, the writer thread
///     recorder_options       how it writes, and recorder_statistics (trace/recorder_options.hpp)
///     detail::event_ring     per recording thread: a fixed single-producer ring of raw events
///     detail::thread_rings   a thread's rings, one per recorder (trace/detail/thread_rings.hpp)
///     detail::tick_clock     ticks -> nanoseconds, calibrated by the writer thread
///     trace::writer          the encoding (docs/trace-format.md)
///   recording_resource       the adaptor that feeds a recorder (trace/recording_resource.hpp)
#pragma once

#include <custody/core/error.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/core/rank.hpp>
#include <custody/core/detail/output_file.hpp>
#include <custody/debug/owner_scope.hpp>
#include <custody/trace/detail/event_ring.hpp>
#include <custody/trace/detail/thread_rings.hpp>
#include <custody/trace/detail/tick_clock.hpp>
#include <custody/trace/event.hpp>
#include <custody/trace/recorder_options.hpp>
#include <custody/trace/writer.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

namespace custody::trace {

/// Writes allocation events to one trace file. Feed it through recording_resource adaptors (any
/// number, over any upstreams, from any threads), or call record() directly.
///
/// Sequence: every event takes the next number of one counter (1, 2, ...). An allocation takes it
/// after its upstream returned, a deallocation before its upstream is called, so a block's
/// allocation always precedes its deallocation, and a deallocation precedes any reuse of the
/// address, whichever threads are involved. The file holds the events in sequence order, every
/// number once: the writer merges the threads' buffers and holds back events that arrive before an
/// earlier one (at most reorder_limit).
///
/// Memory: per recording thread a fixed buffer (thread_buffer_events); the writer holds at most
/// reorder_limit events and 256 KiB of encoded bytes before writing them. A full buffer makes its
/// thread wait: nothing is dropped, the recording slows down instead.
/// I/O: the writer thread writes in batches (when 256 KiB are encoded, once a second, at flush()
/// and at destruction); a recording thread makes no system call (but the rare wake-up of the
/// writer). A write that fails (a full disk) is reported once through custody::report_failure;
/// later events are discarded, flush() throws and the trace ends truncated.
/// Thread safety: record() and flush() from any thread. The recorder must outlive every resource
/// that feeds it and every call.
/// Ownership: owns the file and the writer thread; the destructor drains every buffer, writes the
/// end record and closes the file.
/// Complexity: record() is O(1) without locks: a ticks read, one atomic increment, a buffer store.
class recorder {
public:
    /// Opens the trace file (replacing one that exists) and writes its metadata. Throws
    /// custody::error naming the file when it cannot be created, std::invalid_argument for options
    /// that cannot work, rank_error from detect_rank().
    explicit recorder(recorder_options options = {})
        : options_(std::move(options)), rank_(options_.rank ? validate_rank(*options_.rank) : detect_rank()),
          path_(options_.path.empty() ? join(options_.directory, trace_file_name(rank_)) : options_.path),
          id_(detail::next_recorder_id()) {
        if (options_.thread_buffer_events == 0 || options_.reorder_limit == 0) {
            throw std::invalid_argument("custody recorder: thread_buffer_events and reorder_limit must be positive");
        }
        try {
            // A new file renamed into place once its metadata is in (custody::detail::output_file:
            // never written through a link planted at the name); the events follow through it.
            file_.emplace(path_);
            write_metadata();
            file_->write(writer_.buffer());
            file_->publish();
        } catch (const custody::error& e) {
            throw error(std::string("custody recorder: the trace: ") + e.what());
        }
        writer_.buffer().clear();
        thread_ = std::thread([this] { run(); });
    }

    recorder(const recorder&) = delete;
    recorder& operator=(const recorder&) = delete;

    /// Drains every buffer, writes the end record and closes the file.
    ~recorder() {
        {
            std::lock_guard lock(wake_mutex_);
            stopping_ = true;
        }
        wake_cv_.notify_one();
        thread_.join();
        if (failed_.load(std::memory_order_acquire)) {
            report_failure("custody recorder: the trace '" + path_ + "' is incomplete: " + error_);
        }
        if (const auto lost = dropped_.load(std::memory_order_relaxed); lost != 0) {
            report_failure("custody recorder: " + std::to_string(lost) + " events of '" + path_ +
                           "' were lost: a thread's buffer could not be allocated");
        }
    }

    /// Records one event. Never throws, never drops an event (but see recorder_statistics::dropped).
    /// `alignment` must be a power of two (the upstream has checked it).
    void record(event_kind kind, std::uint64_t stream, std::int32_t device, std::uint64_t bytes,
                std::size_t alignment, const void* address) noexcept {
        detail::event_ring* r = ring();
        if (r == nullptr) [[unlikely]] {
            dropped_.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        detail::raw_event* slot = r->claim();
        if (slot == nullptr) [[unlikely]] slot = wait_for_slot(*r);
        slot->ticks = detail::ticks();
        slot->sequence = next_sequence_.fetch_add(1, std::memory_order_relaxed) + 1;
        slot->stream = stream;
        slot->bytes = bytes;
        slot->address = reinterpret_cast<std::uintptr_t>(address);
        slot->owner = record_owner_ ? debug::current_owner() : nullptr;
        slot->device = device;
        slot->kind = static_cast<std::uint8_t>(kind);
        slot->alignment_log2 = static_cast<std::uint8_t>(std::min(std::countr_zero(alignment | (std::size_t{1} << 40)), 40));
        slot->thread = r->thread_index();
        if (r->publish()) [[unlikely]] wake();
    }

    /// Blocks until every event recorded before the call is in the file (handed to the operating
    /// system). Throws custody::error when the trace could not be written.
    void flush() {
        const std::uint64_t target = next_sequence_.load(std::memory_order_acquire);
        std::unique_lock lock(wake_mutex_);
        flush_target_ = std::max(flush_target_, target);
        wake_cv_.notify_one();
        flushed_cv_.wait(lock, [&] {
            return written_.load(std::memory_order_acquire) >= target || failed_.load(std::memory_order_acquire);
        });
        if (failed_.load(std::memory_order_acquire)) {
            throw error("custody recorder: cannot write the trace '" + path_ + "': " + error_);
        }
    }

    [[nodiscard]] recorder_statistics statistics() const {
        recorder_statistics s;
        s.events = next_sequence_.load(std::memory_order_relaxed);
        s.events_written = written_.load(std::memory_order_relaxed);
        s.bytes_written = bytes_written_.load(std::memory_order_relaxed);
        s.writes = writes_.load(std::memory_order_relaxed);
        s.full_waits = full_waits_.load(std::memory_order_relaxed);
        s.dropped = dropped_.load(std::memory_order_relaxed);
        s.largest_reorder = largest_reorder_.load(std::memory_order_relaxed);
        std::lock_guard lock(rings_mutex_);
        s.threads = threads_;
        return s;
    }

    [[nodiscard]] const std::string& path() const noexcept { return path_; }
    [[nodiscard]] const rank_info& rank() const noexcept { return rank_; }

private:
    /// An event drained from a ring, waiting for its turn.
    using pending_event = detail::raw_event;

    static std::string join(const std::string& directory, const std::string& name) {
        if (directory.empty() || directory == ".") return name;
        return directory.back() == '/' ? directory + name : directory + "/" + name;
    }

    void write_metadata() {
        const auto unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
        char host[256] = {};
        if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
        writer_.metadata("source", "custody-recorder");
        writer_.metadata("rank", std::to_string(rank_.rank));
        writer_.metadata("local_rank", std::to_string(rank_.local_rank));
        writer_.metadata("world_size", std::to_string(rank_.world_size));
        writer_.metadata("rank_source", rank_.source);
        if (!options_.platform.empty()) writer_.metadata("platform", options_.platform);
        writer_.metadata("host", host);
        writer_.metadata("pid", std::to_string(::getpid()));
        writer_.metadata("started_unix_ns", std::to_string(unix_ns));
    }

    // ---- recording threads ------------------------------------------------------------------

    detail::event_ring* ring() noexcept {
        detail::thread_rings& t = detail::local_rings();
        if (t.last_recorder == id_) [[likely]] return t.last;
        return find_or_register(t);
    }

    detail::event_ring* find_or_register(detail::thread_rings& t) noexcept {
        for (auto& [id, r] : t.all) {
            if (id == id_) {
                t.last_recorder = id_;
                t.last = r.get();
                return t.last;
            }
        }
        try {
            std::erase_if(t.all, [](const auto& entry) { return entry.second.use_count() == 1; }); // recorders gone
            std::shared_ptr<detail::event_ring> r;
            {
                std::lock_guard lock(rings_mutex_);
                r = std::make_shared<detail::event_ring>(options_.thread_buffer_events,
                                                         static_cast<std::uint32_t>(++threads_),
                                                         detail::this_thread_os_id(), detail::this_thread_name());
                rings_.push_back(r);
            }
            t.all.emplace_back(id_, r);
            t.last_recorder = id_;
            t.last = r.get();
            return t.last;
        } catch (...) {
            return nullptr;
        }
    }

    detail::raw_event* wait_for_slot(detail::event_ring& r) noexcept {
        full_waits_.fetch_add(1, std::memory_order_relaxed);
        for (;;) {
            wake();
            std::this_thread::sleep_for(std::chrono::microseconds(20));
            if (detail::raw_event* slot = r.claim()) return slot;
        }
    }

    void wake() noexcept {
        wake_flag_.store(true, std::memory_order_relaxed);
        wake_cv_.notify_one();
    }

    // ---- the writer thread --------------------------------------------------------------------

    void run() {
        auto last_write = std::chrono::steady_clock::now();
        for (;;) {
            std::uint64_t target = 0;
            {
                std::unique_lock lock(wake_mutex_);
                wake_cv_.wait_for(lock, options_.flush_interval, [&] {
                    return stopping_ || wake_flag_.load(std::memory_order_relaxed) ||
                           (flush_target_ > written_.load(std::memory_order_relaxed) &&
                            !failed_.load(std::memory_order_relaxed));
                });
                wake_flag_.store(false, std::memory_order_relaxed);
                if (stopping_) break;
                target = flush_target_;
            }
            drain_round();
            while (next_to_write_ <= target && !failed_.load(std::memory_order_relaxed)) {
                if (drain_round() == 0) std::this_thread::yield(); // an event between its number and its publication
            }
            const auto now = std::chrono::steady_clock::now();
            const bool flushing = target > written_.load(std::memory_order_relaxed);
            if (flushing || now - last_write >= std::chrono::seconds(1) || writer_.buffered() >= batch_bytes) {
                write_out();
                last_write = now;
            }
            if (flushing || failed_.load(std::memory_order_relaxed)) {
                std::lock_guard lock(wake_mutex_);
                flushed_cv_.notify_all();
            }
        }
        finish();
        std::lock_guard lock(wake_mutex_);
        flushed_cv_.notify_all();
    }

    /// Moves what the rings hold into the reorder buffer and writes what is now in order. Returns
    /// the number of events drained.
    std::size_t drain_round() {
        std::vector<std::shared_ptr<detail::event_ring>> rings;
        {
            std::lock_guard lock(rings_mutex_);
            rings = rings_;
        }
        try {
            for (const auto& r : rings) {
                if (r->thread_index() > declared_threads_) {
                    writer_.thread({r->thread_index(), r->os_id(), r->name()});
                    declared_threads_ = r->thread_index();
                }
            }
        } catch (const std::exception& e) {
            fail(e.what());
        }
        clock_.calibrate();
        std::size_t drained = 0;
        const std::uint64_t limit = next_to_write_ + options_.reorder_limit;
        for (const auto& r : rings) {
            const std::size_t before = pending_.size();
            drained += r->drain(limit, [&](const detail::raw_event& e) {
                if (pending_.empty() && e.sequence == next_to_write_) {
                    emit_next(e); // the common case: in order already, encoded straight from the ring
                } else {
                    pending_.push_back(e);
                }
            });
            // Each ring's events are in sequence order: merging them in keeps pending_ sorted.
            const auto by_sequence = [](const pending_event& a, const pending_event& b) { return a.sequence < b.sequence; };
            if (before != 0 && pending_.size() != before) {
                std::inplace_merge(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(before),
                                   pending_.end(), by_sequence);
            }
        }
        if (pending_.size() > largest_reorder_.load(std::memory_order_relaxed)) {
            largest_reorder_.store(pending_.size(), std::memory_order_relaxed);
        }
        emit_ready();
        prune(rings);
        return drained;
    }

    /// Encodes the events of pending_ (sorted by sequence) that continue the sequence.
    void emit_ready() {
        std::size_t k = 0;
        while (k < pending_.size() && pending_[k].sequence == next_to_write_) emit_next(pending_[k++]);
        pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(k));
    }

    /// Encodes `raw`, the event with sequence next_to_write_, and moves on.
    void emit_next(const detail::raw_event& raw) {
        emit(raw);
        ++next_to_write_;
        if (writer_.buffered() >= batch_bytes) write_out();
    }

    void emit(const detail::raw_event& raw) {
        if (failed_.load(std::memory_order_relaxed)) return;
        try {
            event e;
            e.time_ns = clock_.to_ns(raw.ticks);
            e.kind = static_cast<event_kind>(raw.kind);
            e.thread = raw.thread;
            e.stream = raw.stream;
            e.device = raw.device;
            e.bytes = raw.bytes;
            e.alignment = std::uint64_t{1} << raw.alignment_log2;
            e.address = raw.address;
            if (raw.owner != nullptr) {
                auto [it, added] = owner_index_.try_emplace(raw.owner, 0);
                if (added) it->second = writer_.owner(*static_cast<const std::string*>(raw.owner));
                e.owner = it->second;
            }
            writer_.write(e);
        } catch (const std::exception& ex) {
            fail(ex.what());
        }
    }

    /// Frees the rings of threads that exited, once drained.
    void prune(const std::vector<std::shared_ptr<detail::event_ring>>& rings) {
        bool any = false;
        for (const auto& r : rings) any = any || (r->abandoned() && r->drained());
        if (!any) return;
        std::lock_guard lock(rings_mutex_);
        std::erase_if(rings_, [](const auto& r) { return r->abandoned() && r->drained(); });
    }

    void write_out() {
        std::string& bytes = writer_.buffer();
        if (!bytes.empty() && !failed_.load(std::memory_order_relaxed)) {
            if (custody::detail::write_all(file_->descriptor(), bytes)) {
                writes_.fetch_add(1, std::memory_order_relaxed);
                bytes_written_.fetch_add(bytes.size(), std::memory_order_relaxed);
            } else {
                fail(std::strerror(errno));
            }
        }
        bytes.clear();
        if (!failed_.load(std::memory_order_relaxed)) written_.store(next_to_write_ - 1, std::memory_order_release);
    }

    /// At destruction: drains everything (every recording thread is done), writes the end record.
    void finish() {
        for (int idle = 0; idle < 1000;) {
            const std::size_t n = drain_round();
            bool empty = pending_.empty();
            {
                std::lock_guard lock(rings_mutex_);
                for (const auto& r : rings_) empty = empty && r->drained();
            }
            if (empty) break;
            if (n == 0) {
                ++idle;
                std::this_thread::yield();
            }
        }
        if (!pending_.empty()) {
            // A sequence number was taken and its event never published: a thread recorded while
            // the recorder was destroyed. Keep the rest, in order.
            fail("events after a missing one (sequence " + std::to_string(next_to_write_) +
                 "): a thread was still recording when the recorder was destroyed");
        }
        if (!failed_.load(std::memory_order_relaxed)) {
            try {
                writer_.finish();
            } catch (const std::exception& e) {
                fail(e.what());
            }
        }
        write_out();
        try {
            file_->commit();
        } catch (const custody::error& e) {
            fail(e.what());
        }
    }

    void fail(const std::string& why) {
        if (failed_.load(std::memory_order_relaxed)) return;
        error_ = why;
        failed_.store(true, std::memory_order_release);
    }

    static constexpr std::size_t batch_bytes = std::size_t{256} << 10;

    recorder_options options_;
    rank_info rank_;
    std::string path_;
    const std::uint64_t id_;
    const bool record_owner_ = options_.record_owner;
    std::optional<custody::detail::output_file> file_; ///< published at construction

    alignas(64) std::atomic<std::uint64_t> next_sequence_{0}; // the last sequence number handed out

    mutable std::mutex rings_mutex_;
    std::vector<std::shared_ptr<detail::event_ring>> rings_; // rings of live threads, and of exited ones not yet drained
    std::size_t threads_ = 0;                                 // threads registered, ever (= the last thread index)

    // The writer thread's own state.
    trace::writer writer_;
    detail::tick_clock clock_;
    std::vector<pending_event> pending_;   // drained, sorted by sequence, all >= next_to_write_
    std::uint64_t next_to_write_ = 1;      // every event below it is encoded
    std::uint32_t declared_threads_ = 0;
    std::unordered_map<const void*, std::uint32_t> owner_index_;

    // Waking the writer, flushing, stopping.
    std::mutex wake_mutex_;
    std::condition_variable wake_cv_;
    std::condition_variable flushed_cv_;
    std::atomic<bool> wake_flag_{false};
    bool stopping_ = false;            // guarded by wake_mutex_
    std::uint64_t flush_target_ = 0;   // guarded by wake_mutex_
    std::atomic<std::uint64_t> written_{0}; // every event up to it is in the file

    std::atomic<std::uint64_t> bytes_written_{0};
    std::atomic<std::uint64_t> writes_{0};
    std::atomic<std::uint64_t> full_waits_{0};
    std::atomic<std::uint64_t> dropped_{0};
    std::atomic<std::size_t> largest_reorder_{0};
    std::atomic<bool> failed_{false};
    std::string error_; // written once before failed_ is set

    std::thread thread_; // last: started once everything else is built
};

} // namespace custody::trace
