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
