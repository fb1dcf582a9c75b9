#!/bin/sh
# old_driver.sh LIBDIR EXE...: runs each cuda test executable with LIBDIR's libcuda.so.1 (a driver
# too old for the runtime) first on the library path. Each must fail (exit status neither 0 nor 77)
# and name cudaErrorInsufficientDriver: a machine with a broken CUDA stack never reports its cuda
# suites as skipped or passed.
set -u
libdir=$1; shift
status=0
for exe in "$@"; do
  out=$(LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$exe" 2>&1)
  rc=$?
  name=$(basename "$exe")
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; then
    echo "FAIL $name: exit status $rc under a driver too old for the runtime"; status=1
  elif ! printf '%s' "$out" | grep -q cudaErrorInsufficientDriver; then
    echo "FAIL $name: exit status $rc, but cudaErrorInsufficientDriver is not named:"; printf '%s\n' "$out" | tail -5; status=1
  else
    echo "ok   $name: exit status $rc, names cudaErrorInsufficientDriver"
  fi
done
exit $status
