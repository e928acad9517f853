#!/usr/bin/env bash
# The quotas in action: a workload under a memory limit and an SM limit,
# on the real GPU when there is one, on the simulated GPU otherwise.
# Prints what happened as a table. Needs cargo, cc and python3.
set -eu
cd "$(dirname "$0")"
cargo build --release --quiet
export OUT=${OUT:-$(mktemp -d /tmp/vgpu-demo-XXXX)}
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ -d /usr/local/cuda/include ]; then
  echo "== real GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  exec gpu-tests/run.sh demo transparency
fi
echo "== no GPU here: the simulated GPU (tests/sim-gpu) stands in"
SIM=$(mktemp -d /tmp/vgpu-sim-XXXX)
ln -s "$PWD/target/release/libsim_gpu.so" "$SIM/libcuda.so.1"
ln -s "$PWD/target/release/libsim_gpu.so" "$SIM/libnvidia-ml.so.1"
exec gpu-tests/run.sh --sim "$SIM" demo transparency
