/// @file
/// `buffer`: an owning, move-only container of uninitialized storage for n objects of T, that
/// remembers the device, stream and resource it came from and gives its memory back there.
#pragma once

#include <custody/core/concepts.hpp>
#include <custody/core/owner.hpp>
#include <custody/core/properties.hpp>
#include <custody/core/resource_ref.hpp>
#include <custody/platform/platform.hpp>

#include <gsl/assert>

#include <algorithm>
#include <cstddef>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace custody {

/// Owning storage for `size()` objects of trivially copyable T, on platform `Platform`, from a
/// resource whose memory has property `Access` (device_accessible: for kernels; host_accessible:
/// also indexable on the host).
///
/// Remembers: the device (the resource's, or the current device at construction for a resource
/// bound to none), the stream it is ordered on, the resource (by non-owning reference: the
/// resource must outlive the buffer), and its owner (the one given, else the thread's owner scope
/// at construction, else untagged). Destruction and reset() give the memory back on that stream
/// with that device current, and restore the caller's device.
/// Owner: every allocation the buffer makes (construction, resize) runs with its owner current
/// (an owner_binding), so a tracking resource charges a KV cache made under "kv_cache" to
/// "kv_cache" wherever it grows: inside another owner's scope or outside every scope. A resource
/// that does not track owners never looks; the owner costs one pointer in the buffer and one
/// thread-local read per allocation.
/// Stream semantics: the storage may be used by work enqueued on stream() after construction;
/// set_stream() moves the buffer to another stream, which the caller must have ordered after the
/// old one (for example with an event).
/// Ownership: move-only; a moved-from buffer is empty. There is no release(): nothing can take the
/// memory away from the handle without the handle giving it back.
/// Thread safety: none; a buffer is used by one thread at a time, like any container.
template <class T, class Platform, class Access = device_accessible>
class buffer final {
    static_assert(std::is_trivially_copyable_v<T>, "custody::buffer holds trivially copyable objects");

public:
    using value_type = T;
    using stream_view = typename Platform::stream_view;
    using resource_type = resource_ref<stream_view>;

    /// An empty buffer bound to nothing.
    buffer() noexcept = default;

    /// Storage for `count` objects from `resource`, ordered on `stream`, owned by the thread's
    /// current owner (its owner_scope; untagged outside every scope). Throws std::length_error if
    /// count * sizeof(T) overflows, std::invalid_argument / out_of_memory as the resource does.
    template <stream_ordered_resource R>
        requires std::same_as<typename R::stream_type, stream_view> && has_property<R, Access>
    buffer(std::size_t count, stream_view stream, R& resource)
        : buffer(count, stream, resource_type(resource), current_owner()) {}

    /// As above, owned by `owner` (debug::intern_owner("kv_cache"), an owner_scope's id(), or
    /// nullptr for untagged) whatever scope is open.
    template <stream_ordered_resource R>
        requires std::same_as<typename R::stream_type, stream_view> && has_property<R, Access>
    buffer(std::size_t count, stream_view stream, R& resource, owner_id owner)
        : buffer(count, stream, resource_type(resource), owner) {}

    /// As above, through a type-erased reference, which must be passed as one (no resource
    /// converts to it here, so the access check above cannot be bypassed by accident); the caller
    /// vouches for the access property.
    template <class Ref>
        requires std::same_as<Ref, resource_type>
    buffer(std::size_t count, stream_view stream, Ref resource)
        : buffer(count, stream, resource, current_owner()) {}
    template <class Ref>
        requires std::same_as<Ref, resource_type>
    buffer(std::size_t count, stream_view stream, Ref resource, owner_id owner)
        : resource_(resource), stream_(stream), device_(device_of(resource)), owner_(owner) {
        data_ = allocate(count);
        size_ = count;
    }

    buffer(buffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
          resource_(other.resource_), stream_(other.stream_), device_(other.device_), owner_(other.owner_) {}
    buffer& operator=(buffer&& other) noexcept {
        if (this != &other) {
            reset();
            data_ = std::exchange(other.data_, nullptr);
            size_ = std::exchange(other.size_, 0);
            resource_ = other.resource_;
            stream_ = other.stream_;
            device_ = other.device_;
            owner_ = other.owner_;
        }
        return *this;
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    ~buffer() { reset(); }

    [[nodiscard]] T* data() noexcept { return data_; }
    [[nodiscard]] const T* data() const noexcept { return data_; }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
    [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
    /// The storage as a span, to pass to kernels (or, for host-accessible memory, to use here).
    [[nodiscard]] std::span<T> span() noexcept { return {data_, size_}; }
    [[nodiscard]] std::span<const T> span() const noexcept { return {data_, size_}; }
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] stream_view stream() const noexcept { return stream_; }
    [[nodiscard]] std::optional<resource_type> resource() const noexcept { return resource_; }
    /// The owner every allocation of this buffer is made for (nullptr: untagged).
    [[nodiscard]] owner_id owner() const noexcept { return owner_; }

    /// Host indexing, only for host-accessible memory. Precondition: i < size().
    [[nodiscard]] T& operator[](std::size_t i) noexcept
        requires std::same_as<Access, host_accessible>
    {
        Expects(i < size_);
        return data_[i];
    }
    [[nodiscard]] const T& operator[](std::size_t i) const noexcept
        requires std::same_as<Access, host_accessible>
    {
        Expects(i < size_);
        return data_[i];
    }

    /// Orders the buffer on `stream` from now on; its memory will be given back there.
    void set_stream(stream_view stream) noexcept { stream_ = stream; }

    /// Changes the size to `count`, keeping the first min(size(), count) objects (copied on
    /// stream()). The new storage is allocated for owner(), whatever owner scope is open.
    /// Strong guarantee: if the new storage cannot be had, the buffer is unchanged.
    void resize(std::size_t count) {
        if (count == size_) return;
        Expects(resource_.has_value());
        T* fresh = allocate(count);
        if (data_ != nullptr && fresh != nullptr) {
            basic_device_guard<Platform> guard(device_);
            Platform::memcpy_async(fresh, data_, std::min(count, size_) * sizeof(T), stream_);
        }
        reset();
        data_ = fresh;
        size_ = count;
    }

    /// Gives the memory back now (on stream(), on device()) and leaves the buffer empty but bound
    /// to the same resource and stream.
    void reset() noexcept {
        if (data_ == nullptr) return;
        basic_device_guard<Platform> guard(device_, std::nothrow);
        const owner_binding as_owner(owner_);
        resource_->deallocate(stream_, data_, size_ * sizeof(T), alignof_storage);
        data_ = nullptr;
        size_ = 0;
    }

private:
    static constexpr std::size_t alignof_storage = std::max<std::size_t>(alignof(T), 256);

    static int device_of(resource_type& resource) {
        const int bound = resource.device();
        return bound >= 0 ? bound : Platform::current_device();
    }

    T* allocate(std::size_t count) {
        if (count > SIZE_MAX / sizeof(T)) {
            throw std::length_error("custody: a buffer of " + std::to_string(count) + " objects of " +
                                    std::to_string(sizeof(T)) + " bytes overflows the address space");
        }
        basic_device_guard<Platform> guard(device_);
        const owner_binding as_owner(owner_);
        return static_cast<T*>(resource_->allocate(stream_, count * sizeof(T), alignof_storage));
    }

    // Invariant: data_ == nullptr iff size_ == 0 (a zero-size allocation is a null pointer).
    T* data_ = nullptr;
    std::size_t size_ = 0;
    std::optional<resource_type> resource_; // empty only for a default-constructed buffer
    stream_view stream_{};
    int device_ = -1;
    owner_id owner_ = nullptr; // fixed at construction; moves carry it
};

/// A single object of T in memory of `Access`, with synchronous value access.
template <class T, class Platform, class Access = device_accessible>
class scalar final {
public:
    using stream_view = typename Platform::stream_view;

    template <class R>
    scalar(stream_view stream, R& resource) : storage_(1, stream, resource) {}
    /// As above, owned by `owner` (see buffer).
    template <class R>
    scalar(stream_view stream, R& resource, owner_id owner) : storage_(1, stream, resource, owner) {}

    /// Copies `value` in on stream() and waits for the copy, so `value` may go away at once.
    void set_value(const T& value) {
        basic_device_guard<Platform> guard(storage_.device());
        Platform::memcpy_async(storage_.data(), &value, sizeof(T), storage_.stream());
        Platform::synchronize(storage_.stream());
    }
    /// Copies the value out on stream() and waits for it.
    [[nodiscard]] T value() const {
        T out;
        basic_device_guard<Platform> guard(storage_.device());
        Platform::memcpy_async(&out, storage_.data(), sizeof(T), storage_.stream());
        Platform::synchronize(storage_.stream());
        return out;
    }
    [[nodiscard]] T* data() noexcept { return storage_.data(); }
    [[nodiscard]] const T* data() const noexcept { return storage_.data(); }
    [[nodiscard]] int device() const noexcept { return storage_.device(); }
    [[nodiscard]] stream_view stream() const noexcept { return storage_.stream(); }

private:
    buffer<T, Platform, Access> storage_;
};

} // namespace custody
