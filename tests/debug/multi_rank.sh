#!/bin/sh
# multi_rank.sh WORKER MERGE N: runs N rank_worker processes at once (RANK, LOCAL_RANK, WORLD_SIZE
# set as torchrun does), merges their reports with custody-merge, and checks that the merge finds
# the imbalance planted on rank 2 and forecasts the slow leak planted on rank 1 (growing there
# only, running out first), that the trace has every rank's tracks, and that missing, truncated
# and mismatched reports are refused with clear errors.
set -eu
worker=$1; merge=$2; n=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

pids=""
r=0
while [ "$r" -lt "$n" ]; do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n "$worker" "$dir" & pids="$pids $!"
  r=$((r + 1))
done
for p in $pids; do wait "$p" || fail "a rank failed"; done

reports=$(ls "$dir"/rank-*.json)
"$merge" --table "$dir/table.txt" --trace "$dir/trace.json" $reports 2> "$dir/merge.err" || fail "merge failed"
cat "$dir/table.txt"
grep -q 'decode/kv_cache.*<< imbalanced' "$dir/table.txt" || fail "the planted imbalance was not marked"
grep -q "owner 'decode/kv_cache' is imbalanced" "$dir/merge.err" || fail "no imbalance message"
if grep -q 'prefill.*<< imbalanced' "$dir/table.txt"; then fail "a balanced owner was marked"; fi
grep -q '^output  << grows on rank 1 only$' "$dir/table.txt" || fail "the slow leak on rank 1 was not forecast"
grep -q 'time left .*<< rank 1 runs out first$' "$dir/table.txt" || fail "the rank that runs out first was not marked"
[ "$(grep -c 'grows on rank' "$dir/table.txt")" -eq 1 ] || fail "an owner without a leak was forecast to grow"
grep -q "owner 'output' leaks slowly on rank 1 only; rank 1 runs out first, in " "$dir/merge.err" ||
  fail "no forecast message: $(cat "$dir/merge.err")"
"$worker" --check-trace "$dir/trace.json" "$n" || fail "the trace lacks tracks"
set +e
"$merge" --fail-on-imbalance $reports > /dev/null 2>&1
[ $? -eq 3 ] || fail "--fail-on-imbalance did not exit 3"

# Bad inputs: each exits 2 with a message that names the reason.
expect_error() { # expect_error WORD ARGS...
  word=$1; shift
  "$merge" "$@" > /dev/null 2> "$dir/err"
  status=$?
  [ "$status" -eq 2 ] || fail "exit $status instead of 2 for a $word report"
  grep -q "$word" "$dir/err" || fail "no '$word' in: $(cat "$dir/err")"
  echo "refused as expected: $(cat "$dir/err")"
}
expect_error missing "$dir/rank-0.json" "$dir/nonexistent.json"
expect_error missing "$dir/rank-0.json"                      # the other ranks have no report
expect_error "Is a directory" "$dir/rank-0.json" "$dir"      # a directory is not a report
head -c 300 "$dir/rank-1.json" > "$dir/cut.json"
expect_error truncated "$dir/rank-0.json" "$dir/cut.json"
expect_error mismatched $reports "$dir/rank-1.json"           # rank 1 twice
echo '{"schema": "something.else", "version": 1}' > "$dir/other.json"
expect_error malformed "$dir/other.json"
echo "multi-rank: $n ranks merged, imbalance found, slow leak forecast, bad inputs refused"
