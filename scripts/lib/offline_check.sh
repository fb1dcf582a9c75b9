#!/usr/bin/env bash
# offline_check.sh: checks that the scripts install only what is really missing, on a machine that
# has everything (run by scripts/test after its own install step). Package managers are replaced
# by fakes first on PATH that record the call and fail loudly, then:
#   1. CUSTODY_NO_INSTALL=1, everything present: succeeds and calls no package manager;
#   2. without it, everything present: the same;
#   3. Meson only as a Python module (no `meson` on PATH): counts as present, and `meson` works;
#   4. CUSTODY_NO_INSTALL=1 with a part missing (a compiler that does not work): names what is
#      missing with its package, fails, and calls no package manager;
#   5. without it, the same machine: installs through apt-get (the fake, which fails: so does the
#      step).
# Prints one line per case, "offline-check: N passed, N failed" last; exits 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/fake"
for tool in apt-get apt dpkg dpkg-query sudo pip pip3 conda; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/calls"\necho "FAKE %s CALLED: $*" >&2\nexit 97\n' \
    "$tool" "$work" "$tool" >"$work/fake/$tool"
  chmod +x "$work/fake/$tool"
done
passed=0
failed=0
check() { # NAME CONDITION...: one case's verdict
  local name=$1; shift
  if "$@"; then
    echo "offline-check: ok   $name"
    passed=$((passed + 1))
  else
    echo "offline-check: FAIL $name"
    sed 's/^/    /' "$work/out" 2>/dev/null
    failed=$((failed + 1))
  fi
}
no_calls() { [ ! -s "$work/calls" ]; }
# attempt PATH [VAR=VALUE...]: a fresh shell sources common.sh and checks the test script's parts.
attempt() {
  local path=$1; shift
  rm -f "$work/calls"
  env -u CUSTODY_NO_INSTALL PATH="$path" "$@" "$BASH" -c '. scripts/lib/common.sh && custody_install_missing test && meson --version' \
    >"$work/out" 2>&1
}

attempt "$work/fake:$PATH" CUSTODY_NO_INSTALL=1
status=$?
check "CUSTODY_NO_INSTALL=1 with everything present: succeeds, no package manager called" eval '[ $status -eq 0 ] && no_calls'

attempt "$work/fake:$PATH"
status=$?
check "everything present: succeeds, no package manager called" eval '[ $status -eq 0 ] && no_calls'

# A PATH with every tool but meson: links to the ones the checks need, and as python3 an
# interpreter that imports Meson (the one on PATH, or the one that runs the meson command).
mkdir -p "$work/bin"
for tool in ninja samu c++ g++ gcc cc cpp as ld pkg-config cmake id mkdir chmod cat; do
  found=$(command -v "$tool" 2>/dev/null) && ln -sf "$found" "$work/bin/$tool"
done
meson_python=""
for candidate in python3 "$(sed -n '1s/^#! *//p' "$(command -v meson)" 2>/dev/null | cut -d' ' -f1)"; do
  if [ -n "$candidate" ] && "$candidate" -c 'import mesonbuild.mesonmain' 2>/dev/null; then
    meson_python=$("$candidate" -c 'import sys; print(sys.executable)')
    break
  fi
done
if [ -n "$meson_python" ]; then
  ln -sf "$meson_python" "$work/bin/python3"
  attempt "$work/fake:$work/bin" CUSTODY_NO_INSTALL=1 CUSTODY_SHIM_DIR="$work/shims"
  status=$?
  check "Meson importable but not on PATH: counts as present and runs as meson" \
    eval '[ $status -eq 0 ] && no_calls && [ -x "$work/shims/meson" ] && grep -qE "^[0-9]+\.[0-9]+" "$work/out"'
else
  echo "offline-check: skip Meson importable but not on PATH (mesonbuild is not importable here)"
fi

attempt "$work/fake:$PATH" CUSTODY_NO_INSTALL=1 CXX=false
status=$?
check "CUSTODY_NO_INSTALL=1 with a part missing: names it and its package, fails, installs nothing" \
  eval '[ $status -ne 0 ] && no_calls && grep -q "missing: a C++20 compiler (false) \[Debian/Ubuntu package g++\]" "$work/out" && grep -q "CUSTODY_NO_INSTALL=1" "$work/out"'

attempt "$work/fake:$PATH" CXX=false
status=$?
check "a part missing: installed through apt-get (a fake here, which fails, so the step fails)" \
  eval '[ $status -ne 0 ] && grep -qE "^(sudo )?apt-get " "$work/calls"'

echo "offline-check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
