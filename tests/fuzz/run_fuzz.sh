#!/bin/sh
# run_fuzz.sh FUZZER CORPUS DICT RUNS ARTIFACTS: runs the fuzzer RUNS times from seed 1 over the
# seed corpus CORPUS (left as it is: what the run adds goes to a scratch folder) with the
# dictionary DICT, and fails on a crash, undefined behaviour, a leak or an input slower than 30 s.
# A failing input is kept in ARTIFACTS.
set -eu
fuzzer=$1; corpus=$2; dict=$3; runs=$4; artifacts=$5
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$artifacts"
exec_status=0
"$fuzzer" -runs="$runs" -seed=1 -dict="$dict" -timeout=30 -max_len=16384 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$scratch" "$corpus" || exec_status=$?
[ "$exec_status" -eq 0 ] || echo "run_fuzz: the fuzzer failed (exit $exec_status); the input is in $artifacts/" >&2
exit "$exec_status"
