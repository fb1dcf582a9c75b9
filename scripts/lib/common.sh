# Shared by scripts/demo and scripts/test: finds what custody needs, installs only what is really
# missing, and configures a build. Sourced, not run.
#
# A part counts as present however it got there (a distribution package, pip, a container image,
# a hand-built prefix): a tool on PATH (Meson also as an importable Python module), a header where
# the compiler finds it, a library through pkg-config or the compiler. Nothing is installed and no
# package manager is called when nothing is missing. What is missing is installed from the
# distribution with apt-get (Debian, Ubuntu). Python modules are installed for the python3 on PATH,
# the interpreter that runs the tests, whichever it is: with `python3 -m pip` when that interpreter
# takes pip packages (a venv, pyenv, conda, a hand-built Python), with apt-get only when it is the
# distribution's own (externally managed, PEP 668), whose packages it is the one to import.
# CUSTODY_NO_INSTALL=1 never installs: it names what is missing, goes on without the optional parts
# and fails when a required one is missing.
#
# The CUDA Toolkit and NCCL are never installed: when present (CUDA_PATH or /usr/local/cuda), the
# CUDA parts build too.

custody_cxx=${CXX:-c++}

custody_has_tool() { command -v "$1" >/dev/null 2>&1; }

# custody_has_header HEADER: the C++ compiler finds it.
custody_has_header() {
  printf '#include <%s>\n' "$1" | "$custody_cxx" -std=c++20 -x c++ -E -o /dev/null - >/dev/null 2>&1
}

# custody_has_library NAME: the compiler's linker finds libNAME.so or libNAME.a.
custody_has_library() {
  local found
  for found in "$("$custody_cxx" -print-file-name="lib$1.so" 2>/dev/null)" \
               "$("$custody_cxx" -print-file-name="lib$1.a" 2>/dev/null)"; do
    [ "${found#/}" != "$found" ] && [ -f "$found" ] && return 0
  done
  return 1
}

custody_has_pkg() { custody_has_tool pkg-config && pkg-config --exists "$1" 2>/dev/null; }

# Meson 1.0 or newer, on PATH or as a Python module. A module only is made callable as `meson`
# through a wrapper in CUSTODY_SHIM_DIR (default .cache/bin), put first on PATH: the test suites
# run `meson` themselves.
custody_meson_ok() { local v; v=$("$@" --version 2>/dev/null) && [ "${v%%.*}" -ge 1 ] 2>/dev/null; }
custody_has_meson() {
  custody_has_tool meson && custody_meson_ok meson && return 0
  local python
  custody_has_tool python3 && python=$(python3 -c 'import mesonbuild.mesonmain, sys; print(sys.executable)' 2>/dev/null) &&
    custody_meson_ok "$python" -m mesonbuild.mesonmain || return 1
  local shims=${CUSTODY_SHIM_DIR:-$PWD/.cache/bin}
  mkdir -p "$shims" &&
    printf '#!/bin/sh\nexec "%s" -m mesonbuild.mesonmain "$@"\n' "$python" >"$shims/meson" && chmod +x "$shims/meson" || return 1
  PATH="$shims:$PATH"
  export PATH
}

custody_has_compiler() { custody_has_tool "$custody_cxx" && "$custody_cxx" --version >/dev/null 2>&1; }
custody_has_ninja() { custody_has_tool ninja || custody_has_tool samu; }
custody_has_gsl() { custody_has_header gsl/gsl; }
custody_has_catch2() {
  custody_has_pkg catch2 || custody_has_pkg catch2-with-main || custody_has_header catch2/catch.hpp ||
    { custody_has_header catch2/catch_all.hpp && custody_has_library Catch2; }
}
custody_has_benchmark() { custody_has_pkg benchmark; }
# clang++ with libFuzzer and std::source_location (clang 15 or later) builds the report fuzz target.
custody_has_fuzzer() {
  local cxx
  for cxx in clang++-16 clang++; do
    custody_has_tool "$cxx" &&
      printf '#include <source_location>\n#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n' |
        "$cxx" -std=c++20 -fsanitize=fuzzer -x c++ - -o /dev/null >/dev/null 2>&1 && return 0
  done
  return 1
}
# custody_has_python_module MODULE: the python3 on PATH imports it.
custody_has_python_module() { custody_has_tool python3 && python3 -c "import $1" >/dev/null 2>&1; }
# custody_python_is_distributions: the python3 on PATH is the distribution's own interpreter, whose
# modules come from its packages (it is marked externally managed, and is not a venv); a pip
# package installed for it would be refused, and an apt package is what it imports.
custody_python_is_distributions() {
  custody_has_tool python3 && python3 - >/dev/null 2>&1 <<'PY'
import os, sys, sysconfig
marked = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(0 if marked and sys.prefix == sys.base_prefix else 1)
PY
}
# custody_python_package PYPI DEBIAN: where a Python module comes from for the python3 on PATH.
custody_python_package() {
  if custody_python_is_distributions; then echo "$2"; else echo "pip:$1"; fi
}
custody_has_libdw() {
  custody_has_pkg libdw ||
    { custody_has_header elfutils/libdwfl.h && custody_has_library dw && custody_has_library elf; }
}

# The parts: name, check, Debian package, what it is for. `required` parts stop the scripts when
# missing; `wanted` ones are installed when missing but are not needed to go on.
custody_parts_demo_required=(compiler meson ninja gsl)
custody_parts_demo_wanted=(libdw)
custody_parts_test_required=(compiler meson ninja gsl catch2 python3 pkg-config)
custody_parts_test_wanted=(libdw benchmark cmake fuzzer matplotlib pytest meson-python atheris)

custody_part_check() { # PART: 0 when present
  case $1 in
    compiler) custody_has_compiler ;;
    meson) custody_has_meson ;;
    ninja) custody_has_ninja ;;
    gsl) custody_has_gsl ;;
    catch2) custody_has_catch2 ;;
    benchmark) custody_has_benchmark ;;
    libdw) custody_has_libdw ;;
    fuzzer) custody_has_fuzzer ;;
    python3 | pkg-config | cmake) custody_has_tool "$1" ;;
    pytest) custody_has_python_module pytest ;;
    meson-python) custody_has_python_module mesonpy ;;
    matplotlib) custody_has_python_module matplotlib ;;
    atheris) custody_has_python_module atheris ;;
    *) return 1 ;;
  esac
}

custody_part_package() {
  case $1 in
    compiler) echo g++ ;;
    meson) echo meson ;;
    ninja) echo ninja-build ;;
    gsl) echo libmsgsl-dev ;;
    catch2) echo catch2 ;;
    benchmark) echo libbenchmark-dev ;;
    libdw) echo libdw-dev ;;
    fuzzer) echo clang-16 libclang-rt-16-dev ;;
    # For the python3 that runs the tests, whichever it is (see the top of this file).
    pytest) custody_python_package pytest python3-pytest ;;
    meson-python) custody_python_package meson-python python3-mesonpy ;;
    matplotlib) custody_python_package matplotlib python3-matplotlib ;;
    # PyPI only: the distribution's own python3 has no package of it (nothing to install then).
    atheris) custody_python_is_distributions || echo pip:atheris ;;
    *) echo "$1" ;;
  esac
}

custody_part_purpose() {
  case $1 in
    compiler) echo "a C++20 compiler ($custody_cxx)" ;;
    meson) echo "Meson >= 1.0" ;;
    ninja) echo "Ninja" ;;
    gsl) echo "Microsoft GSL headers (gsl/gsl)" ;;
    catch2) echo "Catch2 v2 or v3 (the test suites)" ;;
    benchmark) echo "Google Benchmark (the benchmarks; skipped without it)" ;;
    libdw) echo "elfutils libdw (call stacks with function, file and line; without it frames are unsymbolized)" ;;
    python3) echo "Python 3 (the test summary)" ;;
    pkg-config) echo "pkg-config (the packaging test)" ;;
    cmake) echo "CMake (the CMake consumer of the packaging test; skipped without it)" ;;
    fuzzer) echo "clang++ 15+ with libFuzzer (the report and trace readers' fuzz targets; skipped without it)" ;;
    matplotlib) echo "Python's matplotlib (custody-plot's drawing test; skipped without it)" ;;
    pytest) echo "pytest (the Python package's suite; skipped without it)" ;;
    meson-python) echo "meson-python (pip install . of the Python package)" ;;
    atheris) echo "atheris (coverage-guided fuzzing of custody-import and the Python package's parsing; without it their fuzz runs use their own mutator)" ;;
  esac
}

# custody_install_missing demo|test: checks the parts that script needs and installs the missing
# ones (see above). Returns non-zero when a required part is still missing.
custody_install_missing() {
  local what=${1:-test} part part_packages
  local -n required="custody_parts_${what}_required" wanted="custody_parts_${what}_wanted"
  local missing_required=() missing_wanted=()
  for part in "${required[@]}"; do custody_part_check "$part" || missing_required+=("$part"); done
  for part in "${wanted[@]}"; do custody_part_check "$part" || missing_wanted+=("$part"); done
  local missing=("${missing_required[@]}" "${missing_wanted[@]}")
  [ ${#missing[@]} -eq 0 ] && return 0

  local packages=()
  for part in "${missing[@]}"; do
    read -ra part_packages <<<"$(custody_part_package "$part")"
    if [ ${#part_packages[@]} -eq 0 ]; then
      echo "custody: missing: $(custody_part_purpose "$part") [no package for this python3: going on without it]"
      continue
    fi
    packages+=("${part_packages[@]}")
    local source="Debian/Ubuntu package $(custody_part_package "$part")"
    [ "${source#*pip:}" != "$source" ] && source="PyPI package ${source#*pip:}"
    echo "custody: missing: $(custody_part_purpose "$part") [$source]"
  done
  # Python modules come from PyPI through pip, the rest from the distribution.
  local apt_packages=() pip_packages=() package
  for package in "${packages[@]}"; do
    if [ "${package#pip:}" != "$package" ]; then pip_packages+=("${package#pip:}"); else apt_packages+=("$package"); fi
  done
  local why=""
  if [ "${CUSTODY_NO_INSTALL:-0}" = 1 ]; then
    why="CUSTODY_NO_INSTALL=1"
  elif [ ${#apt_packages[@]} -gt 0 ] && ! custody_has_tool apt-get; then
    why="no apt-get on this machine"
  elif [ ${#apt_packages[@]} -gt 0 ] && [ "$(id -u)" -ne 0 ] && ! custody_has_tool sudo; then
    why="not root and no sudo"
  fi
  if [ -z "$why" ] && [ ${#apt_packages[@]} -gt 0 ]; then
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "custody: installing ${apt_packages[*]} (apt-get; the first run only)"
    $sudo apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null ||
      why="apt-get failed"
  fi
  if [ -z "$why" ] && [ ${#pip_packages[@]} -gt 0 ]; then
    echo "custody: installing ${pip_packages[*]} (pip, for $(python3 -c 'import sys; print(sys.executable)' 2>/dev/null); the first run only)"
    # One at a time: a package pip cannot install here (atheris has no wheel for every Python)
    # leaves the others installed, and its part is gone on without.
    local pip_failed=()
    for package in "${pip_packages[@]}"; do
      python3 -m pip install -q "$package" >/dev/null 2>&1 || pip_failed+=("$package")
    done
    [ ${#pip_failed[@]} -eq 0 ] || why="pip could not install ${pip_failed[*]}"
  fi
  if [ -z "$why" ]; then
    missing_required=()
    for part in "${required[@]}"; do custody_part_check "$part" || missing_required+=("$part"); done
  fi
  if [ -n "$why" ]; then
    echo "custody: not installing (${why}): install the packages above, or the same parts another way"
  fi
  if [ ${#missing_required[@]} -gt 0 ]; then
    echo "custody: cannot go on without: ${missing_required[*]}"
    return 1
  fi
  return 0
}

# custody_setup DIR [meson options...]: configures DIR (again, if it exists) with the options.
custody_setup() {
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    # `meson configure` applies changed options (setup --reconfigure ignores some, like cpp_args),
    # but knows only the options the directory was set up with: after a pull that adds one, the
    # directory is set up again first.
    meson configure "$dir" "$@" >"$dir.setup.log" 2>&1 ||
      { meson setup --reconfigure "$dir" >>"$dir.setup.log" 2>&1 && meson configure "$dir" "$@" >>"$dir.setup.log" 2>&1; } ||
      { cat "$dir.setup.log"; return 1; }
  else
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
  fi
}

# custody_fetch_cccl DIR: the headers of the CCCL releases interop/cccl.hpp is checked against
# besides the toolkit's own (3.1: the renamed cuda::mr API; 3.2: the basic_any references), from
# NVIDIA's nvidia-cuda-cccl wheels on PyPI, unpacked into DIR/cccl-<version>. Prints the include
# directories it has, as a meson array; prints [] when pip cannot fetch them. Fetches nothing with
# CUSTODY_NO_INSTALL=1 (the trees already in DIR are used).
custody_cccl_wheels=(13.1.115:3.1 13.2.86:3.2)
custody_fetch_cccl() {
  local dir=$1 trees=()
  mkdir -p "$dir"
  for entry in "${custody_cccl_wheels[@]}"; do
    local wheel=${entry%%:*} cccl=${entry##*:} tree="$dir/cccl-${entry##*:}"
    if [ ! -f "$tree/include/cccl/cuda/std/__cccl/version.h" ] && [ "${CUSTODY_NO_INSTALL:-0}" = 1 ]; then
      echo "custody: CCCL $cccl headers not in $dir and CUSTODY_NO_INSTALL=1: not fetched, not checked against" >&2
    elif [ ! -f "$tree/include/cccl/cuda/std/__cccl/version.h" ]; then
      local tmp
      tmp=$(mktemp -d)
      if python3 -m pip download -q --no-deps -d "$tmp" "nvidia-cuda-cccl==$wheel" >/dev/null 2>&1; then
        rm -rf "$tree" && mkdir -p "$tree" &&
          python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$tmp"/*.whl "$tmp/x" &&
          mv "$tmp/x/nvidia/cu13/include" "$tree/include"
      else
        echo "custody: could not fetch CCCL $cccl headers (nvidia-cuda-cccl==$wheel); not checked against it" >&2
      fi
      rm -rf "$tmp"
    fi
    [ -f "$tree/include/cccl/cuda/std/__cccl/version.h" ] && trees+=("'$tree/include/cccl'")
  done
  local IFS=,
  echo "[${trees[*]}]"
}
