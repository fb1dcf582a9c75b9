/// @file
/// The host platform's owning handles, named as the CUDA platform's are in the host namespace:
/// `host::device_buffer<T>` (a virtual device's memory), `host::pinned_buffer<T>` (host memory,
/// indexable), `host::device_scalar<T>`. Code written against custody::device_buffer runs without a
/// GPU by naming these instead. No CUDA header.
#pragma once

#include <custody/buffer/buffer.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/host.hpp>

namespace custody::host {

/// Storage for n T in a virtual device's memory (host::simulated_device_memory, or a pool over
/// it), stream-ordered; see custody::buffer.
template <class T>
using device_buffer = custody::buffer<T, host::platform, device_accessible>;

/// Storage for n T in host-accessible memory (resource::host_memory), indexable here; see
/// custody::buffer. The host platform's counterpart of custody::pinned_buffer.
template <class T>
using pinned_buffer = custody::buffer<T, host::platform, host_accessible>;

/// One T in a virtual device's memory with synchronous value access; see custody::scalar.
template <class T>
using device_scalar = custody::scalar<T, host::platform, device_accessible>;

} // namespace custody::host
