#!/bin/sh
# consumers.sh SOURCE_ROOT MESON [CMAKE]: installs custody into a temporary prefix, then builds the
# two consumer projects in examples/ against the installed tree (pkg-config for Meson,
# find_package for CMake) and runs them. Exits 77 (skip) only when neither consumer can be built.
set -eu
src=$(cd "$1" && pwd); meson=$2; cmake=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

# Headers only: no suites, benchmarks or examples, so the install is quick.
"$meson" setup "$work/build" "$src" --prefix "$prefix" -Dtests=false -Dbenchmarks=disabled \
  -Dexamples=false >"$work/setup.log" 2>&1 || { cat "$work/setup.log"; exit 1; }
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

if [ -n "$cmake" ]; then
  cp -r "$src/examples/consumer-cmake" "$work/consumer-cmake"
  "$cmake" -S "$work/consumer-cmake" -B "$work/consumer-cmake/build" -DCMAKE_PREFIX_PATH="$prefix" \
    >"$work/cc.log" 2>&1 || { cat "$work/cc.log"; exit 1; }
  "$cmake" --build "$work/consumer-cmake/build" >>"$work/cc.log" 2>&1 || { cat "$work/cc.log"; exit 1; }
  "$work/consumer-cmake/build/consumer"
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
