/// @file
/// The CUDA platform's owning handles: `device_buffer<T>`, `pinned_buffer<T>`, `device_scalar<T>`.
#pragma once

#include <custody/buffer/buffer.hpp>
#include <custody/core/properties.hpp>
#include <custody/platform/cuda.hpp>

namespace custody {

/// Uninitialized device storage for n T, stream-ordered; see custody::buffer.
template <class T>
using device_buffer = buffer<T, cuda::platform, device_accessible>;

/// Uninitialized pinned host storage for n T, indexable on the host; see custody::buffer.
template <class T>
using pinned_buffer = buffer<T, cuda::platform, host_accessible>;

/// One T in device memory with synchronous value access; see custody::scalar.
template <class T>
using device_scalar = scalar<T, cuda::platform, device_accessible>;

} // namespace custody
