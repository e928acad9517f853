#!/usr/bin/env bash
# Launch cost at an SM limit of 90 %, two builds of libvgpu alternately
# (DIR_A, DIR_B: folders holding libvgpu.so and libvgpu_core.so), three
# times each: cuclient launchab's overhead against the driver's entry
# point, to tell a change in the hook from a change in the machine.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
A=${1:?DIR_A} B=${2:?DIR_B}
BIN=$(mktemp -d)
cc -O2 -D VIA_DLSYM -o "$BIN/cuclient" "$ROOT/tests/programs/cuclient.c" -ldl -lpthread
for round in 1 2 3; do
  for dir in "$A" "$B"; do
    R=$(mktemp -d)
    out=$(LD_PRELOAD=$dir/libvgpu.so CUDA_DEVICE_MEMORY_SHARED_CACHE=$R/c.cache CUDA_DEVICE_SM_LIMIT=${LIMIT:-90} \
      taskset -c 2,3 "$BIN/cuclient" launchab 20000 31 2>/dev/null | grep overhead_pct)
    echo "round $round $(basename "$dir"): $out"
  done
done
