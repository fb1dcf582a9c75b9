#!/usr/bin/env bash
# sanitizer_check.sh NVCC SOURCE INCLUDE_DIR: compute-sanitizer over sanitizer_cases.cu, asking it
# what custody's NVTX annotations make it see in a pool (docs/debug.md, "debugging a pool with
# CUDA's tools"):
#   1. a kernel that writes one byte past a pool block, into memory of the pool that belongs to no
#      live block (its neighbour, given back), is reported by memcheck with --nvtx yes;
#   2. ... and is not reported with the pool's annotations off, nor with --nvtx no (what a pool
#      hides without them);
#   3. in-bounds kernels with the stream-ordered reuse a pool lives on, a captured graph's replays
#      and the staging ring's copies are reported clean (no false positive);
#   4. a tracked block never given back is reported by --leak-check full with its owner's name.
# The program is compiled with nvcc when the test runs. Exits 77 without a device or without
# compute-sanitizer; prints each run's output, and "PASS:"/"FAIL:" per check.
set -u
nvcc=$1; src=$2; inc=$3
cuda=${CUDA_PATH:-/usr/local/cuda}
sanitizer=$(command -v compute-sanitizer || true)
[ -n "$sanitizer" ] || sanitizer=$cuda/bin/compute-sanitizer
[ -x "$sanitizer" ] || { echo "sanitizer_check: no compute-sanitizer; skipped"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$nvcc" -std=c++20 -lineinfo -I"$inc" -I"$(dirname "$src")" -o "$out/cases" "$src" || { echo "FAIL: nvcc"; exit 1; }
"$out/cases" probe >/dev/null 2>&1
[ $? -eq 77 ] && { echo "sanitizer_check: no CUDA device; skipped"; exit 77; }

failures=0
run() { # NAME -- SANITIZER_ARGS -- CASE_ARGS: runs the case under compute-sanitizer into $out/NAME.log
  local name=$1; shift; shift
  local args=()
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  "$sanitizer" "${args[@]}" --error-exitcode 97 "$out/cases" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "=== $name: compute-sanitizer ${args[*]} cases $* -> exit $rc"
  cat "$out/$name.log"
  return $rc
}
check() { # CONDITION-TEXT, then the command that must succeed
  local what=$1; shift
  if "$@"; then echo "PASS: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
reported_write() { grep -q "Invalid __global__ write of size 1 bytes" "$out/$1.log"; }
clean_run() { grep -q "ERROR SUMMARY: 0 errors" "$out/$1.log"; }

run overflow_annotated -- --tool memcheck --nvtx yes -- overflow annotated
rc=$?
check "the case's blocks are adjacent, so the byte past the first is its freed neighbour's" \
  grep -q "(adjacent)" "$out/overflow_annotated.log"
check "one byte past a pool block, into no live block, is reported with annotations (exit 97)" test "$rc" -eq 97
check "... as an invalid 1-byte global write" reported_write overflow_annotated

run overflow_plain -- --tool memcheck --nvtx yes -- overflow plain
rc=$?
check "the same write is not reported with pool_options::annotate = false" test "$rc" -eq 0
check "... no invalid write in the report" eval '! reported_write overflow_plain'

run overflow_no_nvtx -- --tool memcheck --nvtx no -- overflow annotated
rc=$?
check "the same write is not reported with --nvtx no" test "$rc" -eq 0

run clean -- --tool memcheck --nvtx yes --leak-check full -- clean
rc=$?
check "in-bounds work, stream-ordered reuse, graph replays and the ring: clean" test "$rc" -eq 0
check "... ERROR SUMMARY: 0 errors" clean_run clean

run leak -- --tool memcheck --nvtx yes --leak-check full -- leak
check "a leaked block is reported with its owner's name" grep -q "decode/kv_cache" "$out/leak.log"

# Informational: the same leak when the pool ends with the block still out (its heap withdrawn).
run leak_at_end -- --tool memcheck --nvtx yes --leak-check full -- leak_at_end
echo "(leak_at_end: $(grep -c 'decode/kv_cache' "$out/leak_at_end.log") report line(s) naming decode/kv_cache)"

echo "sanitizer_check: $failures check(s) failed"
[ "$failures" -eq 0 ]
