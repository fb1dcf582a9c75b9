#!/bin/sh
# nvcc_run.sh NVCC SOURCE INCLUDE_DIR [ARGS...]: compiles SOURCE with nvcc into a temporary
# executable and runs it (the program exits 77 itself when there is no device).
set -eu
nvcc=$1; src=$2; inc=$3; shift 3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$nvcc" -std=c++20 -I"$inc" -I"$(dirname "$src")" "$@" -o "$out/prog" "$src"
"$out/prog"
