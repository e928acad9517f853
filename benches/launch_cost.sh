#!/usr/bin/env bash
# Empty-kernel launch cost of vgpu's cuLaunchKernel hook with no limit, on
# the simulated GPU: `cuclient launchab` times batches of launches through
# the hooked entry point and the driver's own, alternating in one process;
# the difference is what the hook costs (the simulator's launch, a few
# hundred ns, is the same on both sides). RUNS processes per library, the
# libraries taking turns; prints each run and the medians.
#   benches/launch_cost.sh [RUNS] [LIB...]    (default: the release build)
# Extra environment for the preloaded process: LAUNCH_ENV="K=V ...".
set -eu
cd "$(dirname "$0")/.."
runs=${1:-9}
shift || true
cargo build --release -q -p vgpu -p sim-gpu
[ $# -gt 0 ] || set -- "$PWD/target/release/libvgpu.so"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -Wall -D VIA_DLSYM -o "$out/cuclient" tests/programs/cuclient.c -ldl -lpthread
mkdir "$out/drivers"
for n in libcuda.so.1 libnvidia-ml.so.1; do ln -s "$PWD/target/release/libsim_gpu.so" "$out/drivers/$n"; done
echo "machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$runs"); do
  for lib in "$@"; do
    d=$(mktemp -d "$out/sim.XXXX")
    # shellcheck disable=SC2086
    line=$(env -i PATH="$PATH" LD_LIBRARY_PATH="$out/drivers" SIM_GPU_STATE="$d/sim.state" SIM_GPU_COUNT=1 \
      SIM_GPU_MEMORY=8g CUDA_DEVICE_MEMORY_SHARED_CACHE="$d/region.cache" ${LAUNCH_ENV:-} LD_PRELOAD="$lib" \
      "$out/cuclient" launchab 20000 31 | grep '^native_us=')
    rm -rf "$d"
    echo "$lib $line" | tee -a "$out/all"
  done
done
echo "medians over $runs runs (ns per launch):"
med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for lib in "$@"; do
  grep "^$lib " "$out/all" | sed 's/.*native_us=\([0-9.]*\) hooked_us=\([0-9.]*\).*/\1 \2/' > "$out/one"
  n=$(awk '{ print $1 * 1000 }' "$out/one" | med)
  h=$(awk '{ print $2 * 1000 }' "$out/one" | med)
  d=$(awk '{ print ($2 - $1) * 1000 }' "$out/one" | med)
  awk -v l="$lib" -v n="$n" -v h="$h" -v d="$d" \
    'BEGIN { printf "%s: native %.1f  hooked %.1f  hook %+.1f ns (median of differences; %+.2f %%)\n", l, n, h, d, d / n * 100 }'
done
