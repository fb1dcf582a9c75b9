#!/bin/sh
# run_fuzz.sh FUZZER CORPUS DICT RUNS ARTIFACTS [SECONDS]: runs the fuzzer from seed 1 over the
# seed corpus CORPUS (left as it is: what the run adds goes to a scratch folder) with the
# dictionary DICT, for RUNS inputs or SECONDS seconds, whichever ends first, and fails on a crash,
# undefined behaviour, a leak or an input slower than 30 s. A failing input is kept in ARTIFACTS.
set -eu
fuzzer=$1; corpus=$2; dict=$3; runs=$4; artifacts=$5; seconds=${6:-0}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$artifacts"
exec_status=0
# -error_exitcode and -timeout_exitcode: libFuzzer's own are 77 and 70, and 77 is "skipped" to meson.
"$fuzzer" -runs="$runs" -max_total_time="$seconds" -seed=1 -error_exitcode=1 -timeout_exitcode=1 -dict="$dict" -timeout=30 -max_len=16384 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$scratch" "$corpus" || exec_status=$?
[ "$exec_status" -eq 0 ] || echo "run_fuzz: the fuzzer failed (exit $exec_status); the input is in $artifacts/" >&2
exit "$exec_status"
