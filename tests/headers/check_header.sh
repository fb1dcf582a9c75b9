#!/bin/sh
# check_header.sh KIND HEADER COMPILER... : compiles a translation unit that includes only HEADER.
# KIND is c++ (the host compiler, all warnings as errors) or nvcc.
set -eu
kind=$1; header=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
inc="$here/../../include"
cuda=${CUDA_PATH:-/usr/local/cuda}
tu=$(mktemp --suffix=.cpp)
trap 'rm -f "$tu"' EXIT
printf '#include <%s>\n#include <%s>\nint main() { return 0; }\n' "$header" "$header" > "$tu"
if [ "$kind" = nvcc ]; then
  exec "$@" -std=c++20 -x cu -I"$inc" -I"$cuda/include/cccl" -c -o /dev/null "$tu"
else
  exec "$@" -std=c++20 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$inc" -isystem "$cuda/include" -isystem "$cuda/include/cccl" "$tu"
fi
