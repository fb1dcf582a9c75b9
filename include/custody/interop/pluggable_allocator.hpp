/// @file
/// `pluggable_allocator`: the state behind a framework's pluggable-allocator entry points
/// (PyTorch's CUDAPluggableAllocator loads `alloc(size, device, stream)` and
/// `free(ptr, size, device, stream)` from a shared library): one custody resource per device,
/// created on first use, with statistics, trimming and a text report per device.
/// Platform-generic: the shared library in plugins/torch instantiates it over a pool on the cuda
/// platform, and over virtual devices on the host platform for tests.
#pragma once

#include <custody/core/align.hpp>
#include <custody/core/concepts.hpp>
#include <custody/core/detail/mutex.hpp>
#include <custody/core/error.hpp>
#include <custody/core/statistics.hpp>
#include <custody/platform/platform.hpp>
#include <custody/pool/capture_pool_id.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace custody::interop {

/// One `Resource` per device, made by `factory(device)` the first time the device is used, behind
/// the calls a pluggable allocator exports. Every call but allocate() is noexcept: errors become a
/// null pointer (or a zero count, or false) plus a message kept per thread (last_error()), for
/// callers across a C boundary; allocate() throws, for a C++ caller that turns exceptions into its
/// own errors (PyTorch).
///
/// Device binding: each call runs with its `device` current on the calling thread (a device guard),
/// so that a default stream, which belongs to the current device, names that device's default
/// stream; the caller's device is restored.
/// Stream semantics: alloc(size, device, stream) is `Resource::allocate(stream, size, 256)`; free
/// gives the block back on the stream it is told (PyTorch passes the stream the block was
/// allocated on). A block also used on other streams is recorded with record_stream(), which the
/// resource honours when it can (resource/recorded_streams.hpp).
/// Thread safety: thread-safe, as `Resource`. Creating a device's resource takes a mutex once;
/// afterwards a device is found with one atomic load.
/// Ownership: owns the resources; they live until the allocator is destroyed. A shared library
/// should keep its allocator for the life of the process (never destroy it while the framework
/// may still free), which is what plugins/torch does.
/// Complexity: that of `Resource` plus one atomic load.
template <stream_ordered_resource Resource>
class pluggable_allocator {
public:
    using resource_type = Resource;
    using stream_type = typename Resource::stream_type;
    using platform_type = typename stream_type::platform_type;
    using factory_type = std::function<std::unique_ptr<Resource>(int device)>;
    /// Told of every out-of-memory before it is reported to the caller: the device, the bytes asked
    /// for, and custody's diagnostics (the out_of_memory's message). Called on the allocating
    /// thread; must not throw (what it throws is dropped) and must not allocate from this
    /// allocator's device.
    using out_of_memory_callback = std::function<void(int device, std::size_t bytes, const char* diagnostics)>;

    /// The alignment of every block: what cudaMalloc guarantees, and what PyTorch assumes.
    static constexpr std::size_t alignment = default_alignment;

    /// Serves devices 0..device_count-1, making each device's resource with `factory`.
    pluggable_allocator(int device_count, factory_type factory)
        : device_count_(device_count), factory_(std::move(factory)),
          slots_(std::make_unique<std::atomic<Resource*>[]>(static_cast<std::size_t>(device_count))),
          ooms_(std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(device_count))) {
        if (device_count < 0) throw std::invalid_argument("custody: negative device count");
    }
    pluggable_allocator(const pluggable_allocator&) = delete;
    pluggable_allocator& operator=(const pluggable_allocator&) = delete;
    ~pluggable_allocator() {
        for (int d = 0; d < device_count_; ++d) delete slots_[static_cast<std::size_t>(d)].load();
    }

    [[nodiscard]] int device_count() const noexcept { return device_count_; }

    /// `size` bytes on `device`, ordered on `stream`; nullptr (and last_error()) on failure.
    /// size == 0 returns nullptr without an error, as cudaMalloc of zero bytes may.
    [[nodiscard]] void* alloc(std::ptrdiff_t size, int device, stream_type stream) noexcept {
        return guarded<void*>(nullptr, [&] { return allocate(size, device, stream); });
    }

    /// As alloc, but a failure throws instead of returning nullptr: custody::out_of_memory (with
    /// the resource's diagnostics), std::invalid_argument (a bad device or size), or what the
    /// resource throws (capture_error on a stream under graph capture). For callers that are
    /// C++ and turn exceptions into their own errors, as PyTorch does with what its allocator
    /// throws. Every out_of_memory is counted (out_of_memory_count()).
    [[nodiscard]] void* allocate(std::ptrdiff_t size, int device, stream_type stream) {
        if (size < 0) throw std::invalid_argument("custody: negative allocation size " + std::to_string(size));
        Resource& r = resource(device);
        if (size == 0) return nullptr;
        basic_device_guard<platform_type> guard(device);
        try {
            return r.allocate(stream, static_cast<std::size_t>(size), alignment);
        } catch (const out_of_memory& e) {
            ooms_[static_cast<std::size_t>(device)].fetch_add(1, std::memory_order_relaxed);
            tell_out_of_memory(device, static_cast<std::size_t>(size), e.what());
            throw;
        }
    }

    /// Calls `callback` at every out-of-memory from now on (an empty one: none), before alloc
    /// returns nullptr or allocate throws. Thread-safe.
    void set_out_of_memory_callback(out_of_memory_callback callback) {
        auto made = callback ? std::make_shared<const out_of_memory_callback>(std::move(callback)) : nullptr;
        std::lock_guard lock(callback_mutex_);
        on_out_of_memory_ = std::move(made);
    }

    /// Out-of-memory failures of `device` so far (0 for a device out of range).
    [[nodiscard]] std::uint64_t out_of_memory_count(int device) const noexcept {
        if (device < 0 || device >= device_count_) return 0;
        return ooms_[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
    }

    /// Notes that work enqueued on `stream` uses `ptr`, a live block of the device `stream`
    /// belongs to, when the resource can hold blocks for other streams (a `record(ptr, stream)`
    /// member, see resource/recorded_streams.hpp): the block is then reused only after that work.
    /// Returns false, with last_error(), when it cannot (no such resource on that device, or the
    /// resource cannot record): the caller must then synchronize instead.
    bool record_stream(void* ptr, stream_type stream) noexcept {
        return guarded<bool>(false, [&] {
            const int device = platform_type::stream_device(stream);
            Resource* r = existing(device);
            if (r == nullptr) {
                throw std::invalid_argument("custody: record_stream of a block custody did not allocate (device " +
                                            std::to_string(device) + ")");
            }
            if constexpr (requires { r->record(ptr, stream); }) {
                basic_device_guard<platform_type> guard(device);
                r->record(ptr, stream);
                return true;
            } else {
                throw std::logic_error("custody: this allocator's resource cannot record streams");
            }
        });
    }

    /// Gives back `ptr` (from alloc with the same size and device) on `stream`.
    void free(void* ptr, std::ptrdiff_t size, int device, stream_type stream) noexcept {
        if (ptr == nullptr) return;
        Resource* r = existing(device);
        if (r == nullptr || size < 0) {
            set_last_error("custody: free of a block custody did not allocate (device " + std::to_string(device) +
                           ", size " + std::to_string(size) + ")");
            return;
        }
        basic_device_guard<platform_type> guard(device, std::nothrow);
        r->deallocate(stream, ptr, static_cast<std::size_t>(size), alignment);
    }

    // ---- graph capture: PyTorch's beginAllocateToPool / endAllocateToPool / releasePool (the
    //      pluggable allocator's set_begin_allocate_to_pool, set_end_allocate_to_pool_fn and
    //      set_release_pool), forwarded to `device`'s resource, or to the pool it wraps; see
    //      docs/pool.md. Each returns false (and sets last_error()) on failure, or when the
    //      resource has no capture-private pools.

    /// Allocations on `device` on `capturing` (the stream about to be captured) and on the streams
    /// forked into its capture come from private pool `id` until end_allocate_to_pool (id made if
    /// new, shared and held once more if not). Open it before the capture begins, as PyTorch's
    /// CUDAGraph::capture_begin opens its own allocator's: a free on that stream in between (an
    /// autograd thread's) then counts as the capture's, and records no event the capture would
    /// refuse.
    bool begin_allocate_to_pool(int device, pool::capture_pool_id id, stream_type capturing) noexcept {
        return capture_hook(device, true, [&](auto& r) { r.begin_allocate_to_pool(id, capturing); });
    }
    /// Allocations on `device` on the streams `filter` accepts come from private pool `id` until
    /// end_allocate_to_pool (id made if new, shared and held once more if not).
    bool begin_allocate_to_pool(int device, pool::capture_pool_id id, std::function<bool(stream_type)> filter) noexcept {
        return capture_hook(device, true, [&](auto& r) { r.begin_allocate_to_pool(id, std::move(filter)); });
    }
    /// Ends the routing to `id` on `device` (after the capture has ended).
    bool end_allocate_to_pool(int device, pool::capture_pool_id id) noexcept {
        return capture_hook(device, false, [&](auto& r) { r.end_allocate_to_pool(id); });
    }
    /// Drops one hold on private pool `id` of `device`; its memory goes back once none is left.
    bool release_pool(int device, pool::capture_pool_id id) noexcept {
        return capture_hook(device, false, [&](auto& r) { r.release_pool(id); });
    }

    /// The statistics of `device`'s resource (all zeros before its first allocation).
    [[nodiscard]] resource_statistics statistics(int device) const noexcept {
        const Resource* r = existing(device);
        if (r == nullptr) return {};
        if constexpr (resource_with_statistics<Resource>) {
            return guarded<resource_statistics>({}, [&] { return r->statistics(); });
        } else {
            return {};
        }
    }

    /// Gives back to the upstream what `device`'s resource holds and does not use (all devices
    /// when device == -1), if the resource can (a `trim()` member returning the bytes released).
    /// Returns the bytes released.
    std::size_t trim(int device) noexcept {
        std::size_t released = 0;
        const int first = device == -1 ? 0 : device;
        const int last = device == -1 ? device_count_ : device + 1;
        for (int d = first; d < last; ++d) {
            Resource* r = existing(d);
            if (r == nullptr) continue;
            if constexpr (requires { { r->trim() } -> std::convertible_to<std::size_t>; }) {
                released += guarded<std::size_t>(0, [&] { return static_cast<std::size_t>(r->trim()); });
            }
        }
        return released;
    }

    /// One line per device in use: live, peak, reserved bytes and counts.
    [[nodiscard]] std::string report() const {
        std::string text;
        for (int d = 0; d < device_count_; ++d) {
            if (existing(d) == nullptr) continue;
            const resource_statistics s = statistics(d);
            text += "custody device " + std::to_string(d) + ": live " + std::to_string(s.live_bytes) + " B in " +
                    std::to_string(s.live_allocations) + " blocks, peak live " + std::to_string(s.peak_live_bytes) +
                    " B, reserved " + std::to_string(s.reserved_bytes) + " B (peak " +
                    std::to_string(s.peak_reserved_bytes) + " B), " + std::to_string(s.allocations) +
                    " allocations, " + std::to_string(s.deallocations) + " deallocations";
            if constexpr (requires(const Resource& r) { r.detailed_statistics().largest_free_block; }) {
                // A pool: where the reserve is, and how fragmented.
                const auto p = guarded<decltype(existing(d)->detailed_statistics())>(
                    {}, [&] { return existing(d)->detailed_statistics(); });
                text += "; " + std::to_string(p.chunks) + " chunks, " + std::to_string(p.stream_cached_bytes) +
                        " B cached on streams, " + std::to_string(p.shared_free_bytes) + " B free to all, largest free block " +
                        std::to_string(p.largest_free_block) + " B";
            }
            text += "\n";
        }
        if (text.empty()) text = "custody: no device used yet\n";
        return text;
    }

    /// The message of this thread's last failed call ("" if none). Valid until this thread's next
    /// call.
    [[nodiscard]] static const char* last_error() noexcept { return last_error_slot().c_str(); }
    /// Sets this thread's last error, for entry points that refuse a call themselves.
    static void set_last_error(std::string message) noexcept {
        try {
            last_error_slot() = std::move(message);
        } catch (...) {
            last_error_slot().clear();
        }
    }

    /// `device`'s resource if it was made already, else nullptr (a device out of range too).
    [[nodiscard]] Resource* find(int device) const noexcept { return existing(device); }

    /// The resource of `device`, made on first use. Throws std::invalid_argument for a device out
    /// of range, and what the factory throws.
    Resource& resource(int device) {
        if (device < 0 || device >= device_count_) {
            throw std::invalid_argument("custody: device " + std::to_string(device) + " out of range (" +
                                        std::to_string(device_count_) + " devices)");
        }
        auto& slot = slots_[static_cast<std::size_t>(device)];
        if (Resource* r = slot.load(std::memory_order_acquire)) return *r;
        std::lock_guard lock(create_mutex_);
        if (Resource* r = slot.load(std::memory_order_acquire)) return *r;
        std::unique_ptr<Resource> made = factory_(device);
        if (made == nullptr) throw std::runtime_error("custody: the resource factory returned nothing");
        slot.store(made.get(), std::memory_order_release);
        return *made.release();
    }

private:
    /// The layer of `r` that has capture-private pools: `r` itself, or the first resource under it
    /// (through `upstream()`, as recorded_streams and tracking_resource wrap a pool) that has them;
    /// nullptr when none has. The hooks only route allocations; the layers above still see them.
    template <class R>
    static auto* capture_layer(R& r) noexcept {
        if constexpr (requires(R& x, pool::capture_pool_id id) { x.release_pool(id); }) {
            return &r;
        } else if constexpr (requires(R& x) { x.upstream(); }) {
            return capture_layer(r.upstream());
        } else {
            return static_cast<void*>(nullptr);
        }
    }

    /// Runs `hook` on the capture layer of `device`'s resource (made first when `create`) with the
    /// device current.
    template <class Hook>
    bool capture_hook(int device, bool create, Hook&& hook) noexcept {
        return guarded<bool>(false, [&] {
            using layer_pointer = decltype(capture_layer(std::declval<Resource&>()));
            if constexpr (!std::is_same_v<layer_pointer, void*>) {
                Resource* r = create ? &resource(device) : existing(device);
                if (r == nullptr) {
                    throw std::invalid_argument("custody: device " + std::to_string(device) +
                                                " has no capture pools (nothing was allocated on it)");
                }
                basic_device_guard<platform_type> guard(device);
                hook(*capture_layer(*r));
                return true;
            } else {
                throw std::logic_error("custody: this resource has no capture-private pools");
                return false;
            }
        });
    }

    /// Tells the out-of-memory callback, if any, of a failure; never throws.
    void tell_out_of_memory(int device, std::size_t bytes, const char* diagnostics) const noexcept {
        std::shared_ptr<const out_of_memory_callback> callback;
        {
            std::lock_guard lock(callback_mutex_);
            callback = on_out_of_memory_;
        }
        if (!callback) return;
        try {
            (*callback)(device, bytes, diagnostics);
        } catch (...) {
        }
    }

    [[nodiscard]] Resource* existing(int device) const noexcept {
        if (device < 0 || device >= device_count_) return nullptr;
        return slots_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
    }

    static std::string& last_error_slot() noexcept {
        thread_local std::string message;
        return message;
    }
    /// Runs `f`, clears the last error, and returns its result; on an exception keeps its message
    /// as the last error and returns `fallback`.
    template <class T, class F>
    static T guarded(T fallback, F&& f) noexcept {
        try {
            T result = std::forward<F>(f)();
            last_error_slot().clear();
            return result;
        } catch (const std::exception& e) {
            set_last_error(e.what());
        } catch (...) {
            set_last_error("custody: unknown exception");
        }
        return fallback;
    }

    int device_count_;
    factory_type factory_;
    std::unique_ptr<std::atomic<Resource*>[]> slots_; // slots_[d] == nullptr until device d is used
    std::unique_ptr<std::atomic<std::uint64_t>[]> ooms_; // ooms_[d]: out_of_memory thrown for device d
    custody::detail::mutex create_mutex_;
    mutable custody::detail::mutex callback_mutex_;
    std::shared_ptr<const out_of_memory_callback> on_out_of_memory_; ///< guarded by callback_mutex_
};

} // namespace custody::interop
