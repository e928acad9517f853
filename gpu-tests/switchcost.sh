#!/usr/bin/env bash
# Measures what a turn between two contexts costs (gpu-tests/switchcost.cu):
# one process alone, two time-slicing freely, two taking cooperative turns of
# several lengths. Prints one line per process; no vgpu involved.
#   gpu-tests/switchcost.sh [SECONDS]
set -eu
D=${1:-3}
B=${VGPU_BIN:-/tmp/vgpu-bin}; mkdir -p "$B"
nvcc -O2 -o "$B/switchcost" "$(dirname "$0")/switchcost.cu"
K=50
"$B/switchcost" solo "$D" $K
pair() { rm -f /dev/shm/vgpu-switch; "$B/switchcost" "$1" "$D" $K 0 /dev/shm/vgpu-switch "${2:-0}" & "$B/switchcost" "$1" "$D" $K 1 /dev/shm/vgpu-switch "${2:-0}"; wait; }
pair free
"$B/switchcost" solo "$D" 1000
for t in 500 2000 10000; do pair turns $t; "$B/switchcost" threads "$D" $K 0 - $t; done
