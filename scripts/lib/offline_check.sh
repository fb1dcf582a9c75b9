#!/usr/bin/env bash
# offline_check.sh: checks that the scripts install only what is really missing, on a machine that
# has everything (run by scripts/test after its own install step). Package managers are replaced
# by fakes first on PATH (and `python3 -m pip` by a fake module) that record the call and fail
# loudly, then:
#   1. CUSTODY_NO_INSTALL=1, everything present: succeeds and calls no package manager;
#   2. without it, everything present: the same;
#   3. Meson only as a Python module (no `meson` on PATH): counts as present, and `meson` works;
#   4. CUSTODY_NO_INSTALL=1 with a part missing (a compiler that does not work): names what is
#      missing with its package, fails, and calls no package manager;
#   5. without it, the same machine: installs through apt-get (the fake, which fails: so does the
#      step);
#   6. a python3 that is not the distribution's (a venv first on PATH, without matplotlib or pytest):
#      its Python modules are installed with that interpreter's pip, never with apt-get (whose
#      packages it cannot import);
#   7. the distribution's own python3 (externally managed): its modules come from apt-get, and
#      atheris, which it has no package of, from nowhere.
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
# `python3 -m pip` runs a fake module too (first on PYTHONPATH), recording which interpreter called.
mkdir -p "$work/fakepip/pip"
printf 'import sys\nopen(%s, "a").write("python-pip " + sys.executable + " " + " ".join(sys.argv[1:]) + "\\n")\nsys.exit(97)\n' \
  "'$work/calls'" >"$work/fakepip/pip/__main__.py"
: >"$work/fakepip/pip/__init__.py"
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
  env -u CUSTODY_NO_INSTALL PATH="$path" PYTHONPATH="$work/fakepip" "$@" "$BASH" -c '. scripts/lib/common.sh && custody_install_missing test && meson --version' \
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

# A venv stands in for any interpreter that is not the distribution's (pyenv, conda, a hand-built
# one).
if python3 -m venv --without-pip "$work/venv" >/dev/null 2>&1; then
  attempt "$work/fake:$work/venv/bin:$PATH"
  check "a python3 that is not the distribution's: its modules installed with its own pip, not apt-get" \
    eval 'grep -q "^python-pip $work/venv/bin/python3\{0,1\} install .*matplotlib" "$work/calls" && ! grep -qE "^(sudo )?apt-get " "$work/calls"'
else
  echo "offline-check: skip a python3 that is not the distribution's (python3 -m venv is not available here)"
fi
distributions=""
for candidate in /usr/bin/python3 /usr/local/bin/python3; do
  if [ -x "$candidate" ] && PATH="$(dirname "$candidate"):$PATH" "$BASH" -c '. scripts/lib/common.sh && custody_python_is_distributions'; then
    distributions=$candidate
    break
  fi
done
if [ -n "$distributions" ]; then
  got=$(PATH="$(dirname "$distributions"):$PATH" "$BASH" -c '. scripts/lib/common.sh && custody_part_package matplotlib && custody_part_package pytest && custody_part_package atheris')
  check "the distribution's python3 ($distributions): its modules come from apt-get (atheris, not packaged, from nowhere)" eval '[ "$got" = "python3-matplotlib
python3-pytest" ]'
else
  echo "offline-check: skip the distribution's python3 (no externally managed interpreter here)"
fi

echo "offline-check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
