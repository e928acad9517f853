#!/usr/bin/env bash
# One process, two threads, two streams, under a 30 % SM limit: what the
# limiter charges when a process's own kernels overlap. Prints each case's
# kernels a second (both streams) against the same run unlimited; the
# limited runs log at debug level under $OUT/streams/.
#   spin GRID: cuclient's 1 ms spin kernel of GRID blocks of 128 threads
#     (132: one block per SM, so two streams overlap whole; 2112: every
#     SM full, so they hardly overlap)
#   torch: x.add_(1) on two tensors of 0.5 GB, one per stream
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=${OUT:-/tmp}/streams
mkdir -p "$D"
SECS=${SECS:-12}
CL=$D/cuclient
cc -O2 -D VIA_PROCADDR -o "$CL" "$ROOT/tests/programs/cuclient.c" -ldl -lpthread || exit 2
LIB=$ROOT/target/release/libvgpu.so
sum() { grep -o '\b\(side_\)\?rate=[0-9.]*' "$1" | awk -F= '{s += $2} END {printf "%.1f", s}'; }
for grid in 132 2112; do
  for lim in free 30; do
    env=(LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_SHARED_CACHE=$(mktemp -d)/c.cache LIBCUDA_LOG_LEVEL=4)
    [ $lim = 30 ] && env+=(CUDA_DEVICE_SM_LIMIT=30)
    env "${env[@]}" "$CL" spin 1000000 $grid $SECS streams > "$D/spin-$grid-$lim.out" 2> "$D/spin-$grid-$lim.err"
    echo "spin grid $grid $lim: $(sum "$D/spin-$grid-$lim.out")/s ($(tr '\n' ' ' < "$D/spin-$grid-$lim.out"))"
  done
done
for lim in free 30; do
  env=(LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_SHARED_CACHE=$(mktemp -d)/c.cache LIBCUDA_LOG_LEVEL=4)
  [ $lim = 30 ] && env+=(CUDA_DEVICE_SM_LIMIT=30)
  env "${env[@]}" python3 "$ROOT/gpu-tests/torch_probe.py" streams $SECS > "$D/torch-$lim.out" 2> "$D/torch-$lim.err"
  echo "torch $lim: $(sum "$D/torch-$lim.out")/s ($(tr '\n' ' ' < "$D/torch-$lim.out"))"
done
