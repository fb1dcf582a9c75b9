#!/bin/sh
# consumers.sh SOURCE_ROOT MESON [CMAKE]: installs custody into a temporary prefix with the install
# command docs/getting-started.md gives a new user, checks that it builds the tools alone (nothing
# of tests/, bench/ or examples/), then builds the consumer projects in examples/ against the
# installed tree (pkg-config for Meson, find_package for CMake) and runs them, a C++23 consumer
# too. Exits 77 (skip) only when neither consumer can be built.
set -eu
src=$(cd "$1" && pwd); meson=$2; cmake=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
fail() { echo "FAIL: $*" >&2; exit 1; }

# The first install a new user makes: docs/getting-started.md's line, with its options as written
# (only the prefix is ours).
line=$(grep -m1 '^meson setup build --prefix' "$src/docs/getting-started.md") ||
  fail "docs/getting-started.md has no 'meson setup build --prefix' line"
options=$(printf '%s\n' "$line" | grep -o -- '-D[^ &]*' || true)
echo "docs/getting-started.md installs with: $line"
# shellcheck disable=SC2086 # the options are words
"$meson" setup "$work/build" "$src" --prefix "$prefix" $options >"$work/setup.log" 2>&1 ||
  { cat "$work/setup.log"; exit 1; }
# What that install builds: targets from tests/, bench/ or examples/ make a first install take many
# minutes and need Catch2 and Google Benchmark; it builds the tools and nothing else.
"$meson" introspect --targets "$work/build" | tr '{' '\n' | grep '"build_by_default": true' >"$work/targets.txt" || true
built=$(grep -o '"name": "[^"]*"' "$work/targets.txt" | sed 's/"name": //' | tr '\n' ' ')
echo "the documented install builds $(wc -l <"$work/targets.txt") targets: $built"
if grep -q '"defined_in": "[^"]*/\(tests\|bench\|examples\)/' "$work/targets.txt"; then
  fail "the documented install builds test, benchmark or example targets: $built"
fi
"$meson" install -C "$work/build" --quiet >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }

test -f "$prefix/include/custody/core/concepts.hpp"
test -f "$prefix/include/custody/interop/pmr.hpp"
# The libdir is the platform's default (lib/x86_64-linux-gnu on Debian), as a user's would be.
pc=$(find "$prefix" -name custody.pc)
config=$(find "$prefix" -name custodyConfig.cmake)
test -n "$pc" && test -n "$config"
test -f "$(dirname "$config")/custodyConfigVersion.cmake"
case "$config" in */cmake/custody/custodyConfig.cmake) ;; *) echo "unexpected config path $config"; exit 1 ;; esac
echo "installed into $prefix: $pc, $config"

# Build from copies, so nothing is written into the source tree.
cp -r "$src/examples/consumer-meson" "$work/consumer-meson"
PKG_CONFIG_PATH="$(dirname "$pc")" "$meson" setup "$work/consumer-meson/build" "$work/consumer-meson" \
  >"$work/cm.log" 2>&1 || { cat "$work/cm.log"; exit 1; }
"$meson" compile -C "$work/consumer-meson/build" >>"$work/cm.log" 2>&1 || { cat "$work/cm.log"; exit 1; }
"$work/consumer-meson/build/consumer"
echo "meson consumer: ok"

# A C++23 consumer: custody.pc asks for no -std of its own (the last -std on a command line wins,
# so one there would make this C++20), and custody compiles as C++23.
mkdir -p "$work/cxx23"
cat >"$work/cxx23/meson.build" <<'EOF_MESON'
project('custody-cxx23', 'cpp', default_options: ['cpp_std=c++23', 'warning_level=3', 'werror=true'])
executable('consumer23', 'main.cpp', dependencies: dependency('custody', method: 'pkg-config'))
EOF_MESON
cat >"$work/cxx23/main.cpp" <<'EOF_CPP'
#include <custody/buffer/host_buffer.hpp>
#include <custody/resource/simulated_device_memory.hpp>
static_assert(__cplusplus > 202002L, "the consumer's C++23 was overridden by custody's flags");
int main() {
    custody::host::simulated_device_memory memory(0, 1 << 20);
    custody::host::device_buffer<int> b(16, {}, memory);
    return b.size() == 16 ? 0 : 1;
}
EOF_CPP
PKG_CONFIG_PATH="$(dirname "$pc")" "$meson" setup "$work/cxx23/build" "$work/cxx23" >"$work/c23.log" 2>&1 &&
  "$meson" compile -C "$work/cxx23/build" >>"$work/c23.log" 2>&1 || { cat "$work/c23.log"; fail "a C++23 consumer does not build"; }
"$work/cxx23/build/consumer23" || fail "the C++23 consumer failed"
echo "C++23 consumer: ok"

if [ -n "$cmake" ]; then
  cp -r "$src/examples/consumer-cmake" "$work/consumer-cmake"
  "$cmake" -S "$work/consumer-cmake" -B "$work/consumer-cmake/build" -DCMAKE_PREFIX_PATH="$prefix" \
    >"$work/cc.log" 2>&1 || { cat "$work/cc.log"; exit 1; }
  "$cmake" --build "$work/consumer-cmake/build" >>"$work/cc.log" 2>&1 || { cat "$work/cc.log"; exit 1; }
  "$work/consumer-cmake/build/consumer"
  # custody::symbolize, the counterpart of pkg-config's custody-symbolize: FILE:LINE in call stacks.
  mkdir -p "$work/symbolize"
  cat >"$work/symbolize/CMakeLists.txt" <<'EOF_CMAKE'
cmake_minimum_required(VERSION 3.16)
project(custody_symbolize LANGUAGES CXX)
find_package(custody 0.1 REQUIRED)
if(NOT custody_SYMBOLIZE_FOUND)
  message(FATAL_ERROR "custody::symbolize is not defined")
endif()
add_executable(symbolize main.cpp)
target_link_libraries(symbolize PRIVATE custody::symbolize)
EOF_CMAKE
  cat >"$work/symbolize/main.cpp" <<'EOF_CPP'
#include <custody/debug/detail/call_stack.hpp>
#include <cstdio>
#ifndef CUSTODY_WITH_LIBDW
#error "custody::symbolize does not define CUSTODY_WITH_LIBDW"
#endif
int main() {
    const auto lines = custody::debug::detail::call_stack::capture(0).symbolize();
    std::puts(lines.empty() ? "" : lines.front().c_str());
    return 0;
}
EOF_CPP
  if [ -n "$(find /usr/include /usr/local/include -name libdwfl.h -path '*elfutils*' 2>/dev/null | head -n 1)" ]; then
    "$cmake" -S "$work/symbolize" -B "$work/symbolize/build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$work/sym.log" 2>&1 &&
      "$cmake" --build "$work/symbolize/build" >>"$work/sym.log" 2>&1 || { cat "$work/sym.log"; fail "custody::symbolize consumer"; }
    first=$("$work/symbolize/build/symbolize")
    echo "custody::symbolize consumer, first frame: $first"
    case "$first" in *main.cpp:*" in main "*) ;; *) fail "custody::symbolize gives no FILE:LINE frame" ;; esac
  else
    echo "libdw not found: custody::symbolize consumer not built"
  fi

  # The version file refuses an incompatible request.
  mkdir -p "$work/too-new"
  printf 'cmake_minimum_required(VERSION 3.16)\nproject(p LANGUAGES CXX)\nfind_package(custody 9.0 REQUIRED)\n' \
    >"$work/too-new/CMakeLists.txt"
  if "$cmake" -S "$work/too-new" -B "$work/too-new/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null 2>&1; then
    echo "find_package(custody 9.0) should have failed"; exit 1
  fi
  # The CMake package is relocatable: a moved tree (as with DESTDIR packaging) still works.
  mv "$prefix" "$work/moved"
  rm -rf "$work/consumer-cmake/build"
  "$cmake" -S "$work/consumer-cmake" -B "$work/consumer-cmake/build" -DCMAKE_PREFIX_PATH="$work/moved" \
    >"$work/cc2.log" 2>&1 || { cat "$work/cc2.log"; exit 1; }
  grep -q "$work/moved/include" "$work/consumer-cmake/build/CMakeFiles/consumer.dir/flags.make" ||
    { echo "the moved tree's include directory is not used"; exit 1; }
  echo "cmake consumer: ok (also from a moved tree)"
else
  echo "cmake not found: CMake consumer not built"
fi
