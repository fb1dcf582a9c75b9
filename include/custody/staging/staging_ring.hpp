/// @file
/// `staging_ring`: one pinned host region, allocated once, used as a ring of asynchronous copies to
/// and from devices, bounded, with back-pressure.
///
/// Where the ring's parts live (staging_ring.hpp includes them all):
///   staging/ring_options.hpp          ring_options, staging_statistics
///   staging/reservation.hpp           reservation<T, Ring>: a typed span of the ring to fill, then commit
///   staging/ticket.hpp                ticket<T, Ring>: a staged download; wait() gives a read-only span
///   staging/errors.hpp                the errors
///   staging/detail/ring_regions.hpp   the regions behind one lock: placement, reclaim, waits, events
///   staging/detail/ring_index.hpp     where regions go, which are live, in what order they come back
///   staging/detail/ring_requests.hpp  the checks on options and requests
///   staging/detail/ring_wait.hpp      wait modes, deadlines, waiting on one event
///   staging/detail/event_table.hpp    one event per region slot and device
///   staging/detail/chunked_copy.hpp   the loops of copy_to_device and copy_from_device
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/error.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/failure_callback.hpp>
#include <custody/platform/platform.hpp>
#include <custody/staging/detail/chunked_copy.hpp>
#include <custody/staging/detail/ring_regions.hpp>
#include <custody/staging/detail/ring_requests.hpp>
#include <custody/staging/detail/ring_wait.hpp>
#include <custody/staging/errors.hpp>
#include <custody/staging/reservation.hpp>
#include <custody/staging/ring_options.hpp>
#include <custody/staging/ticket.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace custody::staging {

/// A pinned staging ring: one host-accessible region taken once from `Upstream` (pinned host
/// memory on the cuda platform, host memory on the host platform) and handed out as a ring of
/// regions for asynchronous copies to and from devices.
///
/// Upload: `reserve<T>(n)` gives a typed span that never straddles the wrap; the producer fills it
/// and `commit(std::move(r), destination, stream)` enqueues the copy on `stream` (under the
/// stream's device) and records an event that marks when the region may be refilled.
/// `copy_to_device` streams a transfer of any size through the ring in chunks, so the host copy
/// of one chunk into pinned memory overlaps the transfer of the previous ones.
/// Download: `stage<T>(source, n, stream)` enqueues a copy into the ring and gives a ticket whose
/// wait() yields a read-only span.
///
/// Back-pressure: regions come back in placement order; a region is reused only when every
/// region placed before it is reclaimed (its copy finished, its reservation given back unused, or
/// its ticket released). When there is no room, `reserve` waits for the oldest copy (optionally
/// up to a timeout, then timeout_error); `try_reserve` returns an empty reservation instead. The
/// ring never overflows; a request larger than the ring is std::length_error.
///
/// Stream semantics: a committed copy runs in `stream`'s order; its destination may be used by
/// work enqueued on `stream` after the commit. A destination allocated on another stream must be
/// usable on `stream` first: commit a custody::buffer itself (commit orders `stream` after the
/// buffer's stream), or order the streams yourself before committing a pointer or span. The region is reclaimed when the event recorded
/// after the copy has completed, whichever stream the next producer uses. copy_to_device returns
/// once the source has been copied into the ring: the source may be reused at once, the
/// destination when `stream` reaches the end of the transfer.
///
/// Thread safety: thread-safe; any number of producers may reserve, commit, stage and release
/// at once, on any streams and devices. Each reservation and ticket has one owner at a time.
/// Ownership: holds `Upstream` by value (constructed in place from the constructor's arguments)
/// and the region it allocates; reservations and tickets refer to the ring, which must outlive
/// them. Destruction waits for every copy in flight, then gives the region back; no reservation
/// or ticket may be alive then (checked: terminates).
/// Events: one per region slot and device, created up front (or at the first copy on a device
/// not named in the options), never on the hot path.
/// Complexity: reserve, commit, stage and release are O(1) plus, when room is short, one event
/// query per region reclaimed. Neither copyable nor movable.
/// CUDA's tools: with ring_options::annotate and an NVTX tool named to the process, the ring's memory is
/// a heap and each region is announced from placement until it is reclaimed or given back unused.
template <class Upstream>
    requires stream_ordered_resource<Upstream> && has_property<Upstream, host_accessible>
class staging_ring final {
public:
    using upstream_type = Upstream;
    using stream_type = typename Upstream::stream_type;
    using platform_type = typename stream_type::platform_type;
    using event_type = typename platform_type::event;
    template <class T>
    using reservation_type = reservation<T, staging_ring>;
    template <class T>
    using ticket_type = ticket<T, staging_ring>;

    /// Alignment of the region and the largest alignment of an element type; the capacity is a
    /// multiple of it.
    static constexpr std::size_t alignment = 256;

    /// Allocates the region from an `Upstream` constructed from `upstream_args` and creates the
    /// events. Throws std::invalid_argument for a zero capacity or region count, or a device that
    /// does not exist; the upstream's out_of_memory if the region cannot be allocated.
    template <class... Args>
    explicit staging_ring(ring_options options, Args&&... upstream_args)
        : upstream_(std::forward<Args>(upstream_args)...),
          regions_(detail::checked_capacity(options, alignment), detail::checked_regions(options), options.annotate),
          chunk_bytes_(options.chunk_bytes != 0
                           ? std::min(options.chunk_bytes, regions_.capacity())
                           : std::clamp<std::size_t>(regions_.capacity() / 4, 1, ring_options::default_chunk_limit)) {
        if (options.devices.empty()) options.devices.push_back(platform_type::current_device());
        for (const int d : options.devices) regions_.prepare(d); // validates, creates events
        base_ = static_cast<std::byte*>(upstream_.allocate_sync(regions_.capacity(), alignment));
        regions_.attach(base_);
    }

    staging_ring(const staging_ring&) = delete;
    staging_ring& operator=(const staging_ring&) = delete;
    staging_ring(staging_ring&&) = delete;
    staging_ring& operator=(staging_ring&&) = delete;

    /// Waits for every copy in flight, then gives the region back to the upstream.
    ~staging_ring() {
        regions_.drain();
        upstream_.deallocate_sync(base_, regions_.capacity(), alignment);
    }

    /// Bytes of the ring (the requested capacity rounded up to a multiple of `alignment`).
    [[nodiscard]] std::size_t capacity() const noexcept { return regions_.capacity(); }
    /// The chunk copy_to_device and copy_from_device use.
    [[nodiscard]] std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }
    [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
    [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }

    /// A region for `count` elements of T, waiting for room as long as it takes.
    /// Throws std::invalid_argument for count == 0, std::length_error above the capacity.
    template <class T>
    [[nodiscard]] reservation_type<T> reserve(std::size_t count) {
        const std::size_t bytes = request_bytes<T>(count);
        const auto p = regions_.acquire(bytes, alignof(T), wait_mode::block, {}, {});
        return reservation_type<T>(this, p->slot, p->offset, std::span<T>(pointer<T>(p->offset), count));
    }

    /// As reserve(count), but waits at most `timeout`, then throws timeout_error (ring unchanged).
    /// A NaN timeout is std::invalid_argument.
    template <class T, class Rep, class Period>
    [[nodiscard]] reservation_type<T> reserve(std::size_t count, std::chrono::duration<Rep, Period> timeout) {
        const std::size_t bytes = request_bytes<T>(count);
        const auto limit = detail::clamp_timeout(timeout);
        const auto [mode, deadline] = detail::deadline_after(limit);
        const auto p = regions_.acquire(bytes, alignof(T), mode, deadline, limit);
        return reservation_type<T>(this, p->slot, p->offset, std::span<T>(pointer<T>(p->offset), count));
    }

    /// As reserve(count), but returns an empty reservation instead of waiting when there is no
    /// room now (it reclaims what has completed first). Bad requests throw as for reserve.
    template <class T>
    [[nodiscard]] reservation_type<T> try_reserve(std::size_t count) {
        const std::size_t bytes = request_bytes<T>(count);
        const auto p = regions_.acquire(bytes, alignof(T), wait_mode::never, {}, {});
        if (!p) return {};
        return reservation_type<T>(this, p->slot, p->offset, std::span<T>(pointer<T>(p->offset), count));
    }

    /// Enqueues on `stream` the copy of the reservation's elements to `destination` (any pointer
    /// the platform's memcpy reaches: device memory on cuda), under the stream's device, and
    /// records the event that gives the region back when the copy has run. Consumes `r`.
    /// Throws std::invalid_argument for an empty reservation, one of another ring, or a null
    /// destination; `r` and the ring are then unchanged.
    template <class T>
    void commit(reservation_type<T>&& r, T* destination, stream_type stream) {
        check_reservation(r);
        if (destination == nullptr) throw std::invalid_argument("custody: staging ring: null destination");
        const int device = platform_type::stream_device(stream);
        event_type& e = regions_.event(device, r.slot_); // may create the device's events; nothing changed yet
        enqueue_then_record(e, device, stream, [&] {
            platform_type::memcpy_async(destination, r.data(), r.size_bytes(), stream);
        });
        const std::size_t slot = r.slot_;
        r.ring_ = nullptr;
        r.span_ = {};
        regions_.committed(slot, device);
    }

    /// As commit(r, destination.data(), stream), after checking that `destination` holds the
    /// reservation: a smaller one is std::invalid_argument (`r` and the ring unchanged).
    template <class T>
    void commit(reservation_type<T>&& r, std::span<T> destination, stream_type stream) {
        check_reservation(r);
        detail::check_destination(destination.size(), r.size());
        commit(std::move(r), destination.data(), stream);
    }

    /// As commit(r, destination.span(), stream) into a destination that knows its stream (a
    /// custody::buffer), made safe across streams: when the buffer is ordered on another stream
    /// than `stream`, `stream` first waits for the work enqueued on the buffer's stream so far
    /// (order_after: an event, no host wait). A pool hands out a block on the buffer's stream that
    /// earlier work there may still be using; without that wait the copy could land first.
    template <class T, class Destination>
        requires requires(Destination& d) {
            { d.span() } -> std::same_as<std::span<T>>;
            { d.stream() } -> std::convertible_to<stream_type>;
        }
    void commit(reservation_type<T>&& r, Destination& destination, stream_type stream) {
        check_reservation(r);
        detail::check_destination(destination.span().size(), r.size());
        order_after<platform_type>(destination.stream(), stream);
        commit(std::move(r), destination.span().data(), stream);
    }

    /// Copies `source` (pageable or not) to `destination` on `stream` through the ring, in chunks
    /// of chunk_bytes(): the host copy of each chunk into the ring overlaps the transfer of the
    /// previous ones. Returns once the whole source is in the ring (the source may be reused); the
    /// destination is complete when `stream` reaches the end of the transfer.
    /// Throws std::invalid_argument for an empty source or a null destination.
    template <class T>
    void copy_to_device(std::span<const T> source, T* destination, stream_type stream) {
        static_assert(std::is_trivially_copyable_v<T>, "the ring copies bytes");
        if (source.empty()) throw std::invalid_argument("custody: staging ring: empty source");
        if (destination == nullptr) throw std::invalid_argument("custody: staging ring: null destination");
        detail::copy_to_device_in_chunks(*this, source, destination, stream, elements_per_chunk<T>());
    }

    /// As copy_to_device(source, destination.data(), stream), after checking that `destination`
    /// is large enough (std::invalid_argument otherwise, nothing enqueued).
    template <class T>
    void copy_to_device(std::span<const T> source, std::span<T> destination, stream_type stream) {
        detail::check_destination(destination.size(), source.size());
        copy_to_device(source, destination.data(), stream);
    }

    /// Enqueues on `stream` a copy of `count` elements from `source` (device memory on cuda) into
    /// the ring and returns its ticket; waits for room as reserve does.
    /// Throws std::invalid_argument for count == 0 or a null source, std::length_error above the
    /// capacity.
    template <class T>
    [[nodiscard]] ticket_type<T> stage(const T* source, std::size_t count, stream_type stream) {
        return stage_impl(source, count, stream, wait_mode::block, {}, {});
    }

    /// As stage, but waits at most `timeout` for room, then throws timeout_error. A NaN timeout is
    /// std::invalid_argument.
    template <class T, class Rep, class Period>
    [[nodiscard]] ticket_type<T> stage(const T* source, std::size_t count, stream_type stream,
                                       std::chrono::duration<Rep, Period> timeout) {
        const auto limit = detail::clamp_timeout(timeout);
        const auto [mode, deadline] = detail::deadline_after(limit);
        return stage_impl(source, count, stream, mode, deadline, limit);
    }

    /// As stage, but returns an empty ticket instead of waiting when there is no room now.
    template <class T>
    [[nodiscard]] ticket_type<T> try_stage(const T* source, std::size_t count, stream_type stream) {
        return stage_impl(source, count, stream, wait_mode::never, {}, {});
    }

    /// Copies `destination.size()` elements from `source` on `stream` into `destination`
    /// (pageable or not) through the ring, in chunks, keeping up to three chunks in flight while
    /// the host copies the oldest out. Returns when `destination` holds the data.
    /// Throws std::invalid_argument for an empty destination or a null source.
    template <class T>
    void copy_from_device(const T* source, std::span<T> destination, stream_type stream) {
        static_assert(std::is_trivially_copyable_v<T>, "the ring copies bytes");
        if (destination.empty()) throw std::invalid_argument("custody: staging ring: empty destination");
        if (source == nullptr) throw std::invalid_argument("custody: staging ring: null source");
        detail::copy_from_device_in_chunks(*this, source, destination, stream, elements_per_chunk<T>());
    }

    /// Reclaims every region whose copy has completed, without waiting; returns how many.
    std::size_t poll() { return regions_.poll(); }

    /// Waits for every copy enqueued so far (uploads and downloads) and reclaims what it can.
    void synchronize() { regions_.synchronize(); }

    /// A snapshot of the counters (see staging_statistics).
    [[nodiscard]] staging_statistics statistics() const { return regions_.statistics(); }

private:
    template <class T, class R>
    friend class reservation;
    template <class T, class R>
    friend class ticket;

    using wait_mode = detail::wait_mode;
    using time_point = detail::time_point;

    template <class T>
    [[nodiscard]] std::size_t request_bytes(std::size_t count) const {
        return detail::request_bytes<T, alignment>(count, regions_.capacity());
    }
    template <class T>
    [[nodiscard]] std::size_t elements_per_chunk() const {
        return detail::elements_per_chunk<T>(regions_.capacity(), chunk_bytes_);
    }

    template <class T>
    [[nodiscard]] T* pointer(std::size_t offset) const noexcept {
        return reinterpret_cast<T*>(base_ + offset);
    }

    template <class T>
    void check_reservation(const reservation_type<T>& r) const {
        if (r.ring_ == nullptr) throw std::invalid_argument("custody: staging ring: empty reservation");
        if (r.ring_ != this) throw std::invalid_argument("custody: staging ring: reservation of another ring");
    }

    /// Runs `enqueue` then records `e` on `stream` under `device`. If recording fails after the
    /// copy was enqueued, waits for the stream so the region is not reused under the copy.
    template <class Enqueue>
    void enqueue_then_record(event_type& e, int device, stream_type stream, Enqueue&& enqueue) {
        basic_device_guard<platform_type> guard(device);
        std::forward<Enqueue>(enqueue)();
        try {
            e.record(stream);
        } catch (...) {
            try {
                platform_type::synchronize(stream);
            } catch (...) {
                report_failure("staging ring: a stream failed twice; a region may be reused under its copy");
            }
            throw;
        }
    }

    /// Gives a reserved region back unused (its reservation's destructor).
    void cancel(std::size_t slot) noexcept { regions_.cancel(slot); }

    template <class T>
    ticket_type<T> stage_impl(const T* source, std::size_t count, stream_type stream, wait_mode mode,
                              time_point deadline, std::chrono::nanoseconds limit) {
        const std::size_t bytes = request_bytes<T>(count);
        if (source == nullptr) throw std::invalid_argument("custody: staging ring: null source");
        const int device = platform_type::stream_device(stream);
        regions_.prepare(device); // create the device's events before anything changes
        const auto p = regions_.acquire(bytes, alignof(T), mode, deadline, limit);
        if (!p) return {};
        T* staged = pointer<T>(p->offset);
        try {
            enqueue_then_record(regions_.event(device, p->slot), device, stream,
                                [&] { platform_type::memcpy_async(staged, source, bytes, stream); });
        } catch (...) {
            regions_.cancel(p->slot, false);
            throw;
        }
        regions_.staged(p->slot, device, bytes);
        return ticket_type<T>(this, p->slot, std::span<const T>(staged, count));
    }

    bool ticket_ready(std::size_t slot) { return regions_.held_event(slot).ready(); }
    void ticket_wait(std::size_t slot) { regions_.held_event(slot).synchronize(); }
    void ticket_release(std::size_t slot) noexcept { regions_.release(slot); }

    Upstream upstream_;
    detail::ring_regions<platform_type> regions_;
    std::size_t chunk_bytes_;
    std::byte* base_ = nullptr; ///< the ring's memory: capacity() bytes at `alignment`
};

} // namespace custody::staging
