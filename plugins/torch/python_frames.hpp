// The library's stack extension in a Python process (python_frames.cpp): Python frames in the
// stacks the tracker captures, in place of the interpreter's.
#pragma once

namespace custody_plugin {

/// Installs the extension when the process runs Python (the interpreter's C API is found); false
/// otherwise, and nothing changes. Idempotent.
bool install_python_frames() noexcept;

} // namespace custody_plugin
