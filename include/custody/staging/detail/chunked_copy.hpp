/// @file
/// The chunked copies of a staging ring: a transfer of any size streamed through the ring's public
/// reserve/commit and stage/try_stage, one chunk at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <span>
#include <utility>

namespace custody::staging::detail {

/// Copies `source` to `destination` on `stream` through `ring`, `per_chunk` elements at a time:
/// the host copy of each chunk into the ring overlaps the transfer of the previous ones. Returns
/// once the whole source is in the ring. Preconditions: `source` is not empty, `destination` not
/// null, per_chunk >= 1 and no larger than the ring holds.
template <class T, class Ring>
void copy_to_device_in_chunks(Ring& ring, std::span<const T> source, T* destination,
                              typename Ring::stream_type stream, std::size_t per_chunk) {
    for (std::size_t done = 0; done < source.size();) {
        const std::size_t n = std::min(per_chunk, source.size() - done);
        auto r = ring.template reserve<T>(n);
        std::memcpy(r.data(), source.data() + done, n * sizeof(T));
        ring.commit(std::move(r), destination + done, stream);
        done += n;
    }
}

/// Copies `destination.size()` elements from `source` on `stream` into `destination` through
/// `ring`, `per_chunk` elements at a time, keeping up to three chunks in flight while the host
/// copies the oldest out. Returns when `destination` holds the data. Preconditions: `destination`
/// is not empty, `source` not null, per_chunk >= 1 and no larger than the ring holds.
template <class T, class Ring>
void copy_from_device_in_chunks(Ring& ring, const T* source, std::span<T> destination,
                                typename Ring::stream_type stream, std::size_t per_chunk) {
    using ticket_type = typename Ring::template ticket_type<T>;
    struct pending {
        ticket_type t;
        std::size_t at;
    };
    std::deque<pending> in_flight;
    const auto drain_one = [&] {
        const std::span<const T> s = in_flight.front().t.wait();
        std::memcpy(destination.data() + in_flight.front().at, s.data(), s.size_bytes());
        in_flight.pop_front(); // releases the ticket
    };
    for (std::size_t done = 0; done < destination.size();) {
        const std::size_t n = std::min(per_chunk, destination.size() - done);
        ticket_type t;
        // Tickets held here keep their regions; drain them before waiting for room.
        while (!(t = ring.try_stage(source + done, n, stream)) && !in_flight.empty()) drain_one();
        if (!t) t = ring.stage(source + done, n, stream);
        in_flight.push_back({std::move(t), done});
        if (in_flight.size() >= 3) drain_one();
        done += n;
    }
    while (!in_flight.empty()) drain_one();
}

} // namespace custody::staging::detail
