#!/usr/bin/env bash
# Per-exec cost of preloading libvgpu.so: builds the release library (the
# stub, bundled with its core as deploy/build.sh does) and
# benches/exec_cost.c, then times ROUNDS interleaved spawns of /bin/true
# bare and preloaded, and of a shell running /bin/true ten times.
#   benches/exec_cost.sh [ROUNDS] [EXTRA_LIB...]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-2000}
shift || true
cargo build --release -q -p vgpu -p vgpu-preload
out=$(mktemp -d)
cc -O2 -Wall -o "$out/exec_cost" benches/exec_cost.c
# What deploy/ installs: the stub with the core appended (the core itself
# is never loaded by /bin/true).
lib=$out/libvgpu.so
target/release/vgpu-bundle target/release/libvgpu.so target/release/libvgpu_core.so "$lib"
echo "machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "DT_NEEDED: $(readelf -d "$lib" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | xargs)"
"$out/exec_cost" -n "$rounds" "$lib" "$@"
"$out/exec_cost" -n $((rounds / 10)) "$lib" "$@" -- /bin/sh -c \
  '/bin/true; /bin/true; /bin/true; /bin/true; /bin/true; /bin/true; /bin/true; /bin/true; /bin/true; /bin/true'
rm -rf "$out"
