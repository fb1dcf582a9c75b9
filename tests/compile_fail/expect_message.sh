#!/bin/sh
# expect_message.sh MESSAGE COMPILER ARGS...: the compiler must fail, and say MESSAGE (a
# fixed string) in what it prints: a composition that cannot work is refused with its reason.
message=$1
shift
out=$("$@" 2>&1) && { echo "FAIL: it compiled" >&2; exit 1; }
printf '%s\n' "$out" | grep -F -q -- "$message" || { printf '%s\n' "$out" | head -40; echo "FAIL: no '$message'" >&2; exit 1; }
echo "refused, saying: $message"
