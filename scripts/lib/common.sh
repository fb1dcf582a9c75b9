# Shared by scripts/demo and scripts/test: installs what is missing and configures a build.
# Sourced, not run.

# Debian packages custody needs to build and test. The CUDA Toolkit and NCCL are optional: when
# they are present (CUDA_PATH or /usr/local/cuda), the CUDA parts build too. clang-16 and its
# libFuzzer runtime build the fuzz target of the report reader (clang 14 lacks std::source_location).
custody_packages=(meson ninja-build g++ pkg-config python3 catch2 libmsgsl-dev libbenchmark-dev cmake
                  clang-16 libclang-rt-16-dev)

custody_install_missing() {
  local missing=()
  for p in "${custody_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "custody: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# custody_setup DIR [meson options...]: configures DIR (again, if it exists) with the options.
custody_setup() {
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    # Reconfigure first, so that options added since DIR was set up are known; then `meson
    # configure` applies changed options (setup --reconfigure ignores some, like cpp_args).
    { meson setup --reconfigure "$dir" && meson configure "$dir" "$@"; } >"$dir.setup.log" 2>&1 ||
      { cat "$dir.setup.log"; return 1; }
  else
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
  fi
}

# custody_fetch_cccl DIR: the headers of the CCCL releases interop/cccl.hpp is checked against
# besides the toolkit's own (3.1: the renamed cuda::mr API; 3.2: the basic_any references), from
# NVIDIA's nvidia-cuda-cccl wheels on PyPI, unpacked into DIR/cccl-<version>. Prints the include
# directories it has, as a meson array; prints [] when pip cannot fetch them.
custody_cccl_wheels=(13.1.115:3.1 13.2.86:3.2)
custody_fetch_cccl() {
  local dir=$1 trees=()
  mkdir -p "$dir"
  for entry in "${custody_cccl_wheels[@]}"; do
    local wheel=${entry%%:*} cccl=${entry##*:} tree="$dir/cccl-${entry##*:}"
    if [ ! -f "$tree/include/cccl/cuda/std/__cccl/version.h" ]; then
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
