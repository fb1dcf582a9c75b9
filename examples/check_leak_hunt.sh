#!/bin/sh
# check_leak_hunt.sh LEAK_HUNT MERGE MODE [LEAK_HUNT_UNSYMBOLIZED]: runs the leak hunt as the demo
# does and checks what a person reads there:
#   - each ALARM line stands under the heading of the rank it names, one trend alarm among them;
#   - the forecast names the owner, the rank, the rate and the time left, in the program's last
#     lines and in custody-merge's merged view;
#   - MODE symbolized: the leak's first frame is the leaking call with its file and line
#     ("leak_hunt.cpp:LINE in inference::remember_kv_page"); MODE unsymbolized: it says so;
#   - custody-merge's merged view of the reports shows the same frame;
#   - with LEAK_HUNT_UNSYMBOLIZED (built without libdw) and MODE symbolized: its frames read
#     "unsymbolized", and custody-merge symbolizes its reports offline to the same frame.
set -eu
hunt=$1; merge=$2; mode=$3; plain=${4:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
leak_frame='at .*leak_hunt\.cpp:[0-9][0-9]* in inference::remember_kv_page \['

mkdir "$dir/run"
"$hunt" "$dir/run" > "$dir/out.txt" || { cat "$dir/out.txt"; fail "leak_hunt failed"; }
cat "$dir/out.txt"

# Alarms under their own rank's heading ("rank N:" lines open a rank's section).
awk '
  /^rank [0-9]+:$/ { heading = $2; sub(":", "", heading) }
  /ALARM rank [0-9]+:/ {
    alarms++
    named = $0; sub(/.*ALARM rank /, "", named); sub(/:.*/, "", named)
    if (named != heading) { print "ALARM of rank " named " printed under rank " heading; bad = 1 }
  }
  END { if (alarms == 0) { print "no ALARM line"; bad = 1 } exit bad }
' "$dir/out.txt" || fail "an alarm is not under its rank"

# The first frame after the leak's group line.
first_frame() { grep -A1 "from 'decode/kv_cache'" "$1" | sed -n 2p; }
frame=$(first_frame "$dir/out.txt")
echo "leak frame: $frame"
if [ "$mode" = symbolized ]; then
  echo "$frame" | grep -q "$leak_frame" || fail "the leak's first frame is not leak_hunt.cpp:LINE in remember_kv_page"
else
  echo "$frame" | grep -q 'at unsymbolized ' || fail "an unsymbolized frame does not say so"
fi
grep -q '^leak_hunt proved: ' "$dir/out.txt" || fail "no 'proved' line"
[ "$(grep -c "ALARM rank 1: device 1's floor rises by 256 B a step" "$dir/out.txt")" -eq 1 ] ||
  fail "not one trend alarm for rank 1's leak"
grep -q "^forecast: 'decode/kv_cache' grows on rank 1 only; rank 1 runs out first: its floor rises by 256 B a step .* left before the device's budget$" "$dir/out.txt" ||
  fail "no forecast line with the owner, the rank, the rate and the time left"

# The merged view of the same reports.
"$merge" "$dir/run"/rank-*.json > "$dir/merged.txt" 2> "$dir/merged.err" || { cat "$dir/merged.err"; fail "custody-merge failed"; }
cat "$dir/merged.txt"
if [ "$mode" = symbolized ]; then
  grep -q "$leak_frame" "$dir/merged.txt" || fail "the merged view lacks the leak's frame"
fi
grep -q '^decode/kv_cache  << grows on rank 1 only$' "$dir/merged.txt" || fail "the merged view lacks the forecast"
grep -q 'time left .*days .*<< rank 1 runs out first$' "$dir/merged.txt" || fail "the merged view lacks the time left"
# What custody-merge says about frames it could not name is a note, not an error.
cat "$dir/merged.err"
if grep -i 'frame' "$dir/merged.err" | grep -qv '^custody-merge: note: '; then
  fail "custody-merge's word on unnamed frames does not read as a note"
fi

# Offline: reports written without libdw, symbolized by custody-merge.
if [ -n "$plain" ] && [ "$mode" = symbolized ]; then
  mkdir "$dir/plain"
  "$plain" "$dir/plain" > "$dir/plain.txt" || { cat "$dir/plain.txt"; fail "leak_hunt without libdw failed"; }
  first_frame "$dir/plain.txt" | grep -q 'at unsymbolized ' || fail "frames without libdw do not say they are unsymbolized"
  "$merge" "$dir/plain"/rank-*.json > "$dir/plain-merged.txt" 2> "$dir/plain-merged.err" ||
    { cat "$dir/plain-merged.err"; fail "custody-merge failed on unsymbolized reports"; }
  grep -A1 "from 'decode/kv_cache'" "$dir/plain-merged.txt" | sed -n 2p | grep -q "$leak_frame" ||
    { cat "$dir/plain-merged.txt"; fail "custody-merge did not symbolize the unsymbolized reports"; }
  echo "offline: custody-merge symbolized the reports of a build without libdw"
fi
echo "leak_hunt stacks: ok ($mode)"
