#!/usr/bin/env bash
# Builds and runs gpu-tests/vmm_probe.c (issue 27's facts about VMM-backed
# suspension); prints one key=value line per fact. Needs about 24 GiB of
# free host memory and 10 GiB of free device memory.
set -eu
B=${VGPU_BIN:-/tmp/vgpu-bin}; mkdir -p "$B"
CUDA=${CUDA_HOME:-/usr/local/cuda}
gcc -O2 -I"$CUDA/include" -o "$B/vmm_probe" "$(dirname "$0")/vmm_probe.c" -L"$CUDA/lib64/stubs" -lcuda -ldl
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
date -u +date=%FT%TZ
exec "$B/vmm_probe"
