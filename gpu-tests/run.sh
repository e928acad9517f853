#!/usr/bin/env bash
# Builds the GPU test programs and runs every GPU scenario of vgpu; prints a
# table of checks last. Needs target/release/libvgpu.so, libvgpu_core.so
# (the stub loads it from beside itself), vgpu-bundle and vgpuctl (build
# them with `cargo build --release` and carry them to the GPU machine);
# the dist section also needs target/dist/libvgpu.so (deploy/build.sh).
#
#   gpu-tests/run.sh [SECTION...]           on the real GPU
#   gpu-tests/run.sh --sim DIR [SECTION...] driver-API sections on the simulator
#
# Full logs go to $OUT/logs, packed into $OUT/logs.tgz at the end (default
# /tmp/vgpu-gpu-out); the table also goes to $OUT/results.tsv. A second
# call into the same $OUT first moves the last call's logs.tgz and
# results.tsv aside (logs.1.tgz, results.1.tsv, ...): two sections run
# one after the other keep both their logs.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export OUT=${OUT:-/tmp/vgpu-gpu-out}
export VGPU_BIN=${VGPU_BIN:-/tmp/vgpu-bin}
mkdir -p "$OUT/logs" "$VGPU_BIN"
if [ -e "$OUT/logs.tgz" ] || [ -s "$OUT/results.tsv" ]; then
  n=1
  while [ -e "$OUT/logs.$n.tgz" ] || [ -e "$OUT/results.$n.tsv" ]; do n=$((n + 1)); done
  [ -e "$OUT/logs.tgz" ] && mv "$OUT/logs.tgz" "$OUT/logs.$n.tgz"
  [ -s "$OUT/results.tsv" ] && mv "$OUT/results.tsv" "$OUT/results.$n.tsv"
fi
: > "$OUT/results.tsv"
P=$ROOT/tests/programs
SIM_DIR=""
[ "${1:-}" = "--sim" ] && SIM_DIR=$2

for lib in "$ROOT/target/release/libvgpu.so" "$ROOT/target/release/libvgpu_core.so" "$ROOT/target/release/vgpuctl" \
  "$ROOT/target/release/vgpu-bundle"; do
  [ -e "$lib" ] || { echo "missing $lib: run cargo build --release first" >&2; exit 2; }
done

build() { "$@" 2>>"$OUT/logs/build.log" || { echo "build failed: $*" >&2; cat "$OUT/logs/build.log" >&2; exit 2; }; }
if [ -n "$SIM_DIR" ]; then
  LINK=(-L "$SIM_DIR" -l:libcuda.so.1)
else
  LINK=(-L /usr/local/cuda/lib64/stubs -lcuda)
  build gcc -O2 -I/usr/local/cuda/include -o "$VGPU_BIN/malloc_bench" "$ROOT/gpu-tests/malloc_bench.c" \
    -L/usr/local/cuda/lib64 -lcudart
fi
build cc -O2 -D VIA_LINK -o "$VGPU_BIN/cuclient-link" "$P/cuclient.c" -ldl -lpthread "${LINK[@]}"
build cc -O2 -D VIA_DLSYM -o "$VGPU_BIN/cuclient-dlsym" "$P/cuclient.c" -ldl -lpthread
build cc -O2 -D VIA_PROCADDR -o "$VGPU_BIN/cuclient-procaddr" "$P/cuclient.c" -ldl -lpthread
build cc -O2 -o "$VGPU_BIN/smi" "$P/smi.c" -ldl
build cc -O2 -o "$VGPU_BIN/hami_reader" "$P/hami_reader.c"
build cc -O2 -o "$VGPU_BIN/hostile_board" "$P/hostile_board.c"
if [ -z "$SIM_DIR" ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/logs/gpu.txt"
fi
python3 "$ROOT/gpu-tests/scenarios.py" "$@"
rc=$?
tar -C "$OUT" -czf "$OUT/logs.tgz" logs 2>/dev/null && rm -rf "$OUT/logs"
exit $rc
