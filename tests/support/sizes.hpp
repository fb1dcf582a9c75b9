// KiB and MiB, for tests: one definition, so that the files of one program (compiled as one
// translation unit in a unity build) may all use them.
#pragma once

#include <cstddef>

namespace custody::test {
inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * KiB;
} // namespace custody::test
