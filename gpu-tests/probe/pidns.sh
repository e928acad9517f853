#!/usr/bin/env bash
# What NVML and vgpu see of a CUDA process in a new pid namespace, with and
# without its own /proc (issue 13's restarts on the real driver). Needs
# gpu-tests/run.sh to have built $VGPU_BIN/cuclient-link.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${VGPU_BIN:-/tmp/vgpu-bin}
LIB=$ROOT/target/release/libvgpu.so
CTL=$ROOT/target/release/vgpuctl
LIST='import pynvml,os;pynvml.nvmlInit();h=pynvml.nvmlDeviceGetHandleByIndex(0);print("getpid",os.getpid(),"nvml",[(p.pid,p.usedGpuMemory>>20) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)])'
for mp in --mount-proc ""; do
  R=$(mktemp -d)/c.cache
  echo "=== unshare -pf $mp"
  LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_SHARED_CACHE=$R CUDA_DEVICE_MEMORY_LIMIT=4g LIBCUDA_LOG_LEVEL=4 \
    unshare -pf $mp "$BIN/cuclient-link" await $((1<<30)) 5 6 &
  sleep 3
  echo "-- host:"; python3 -c "$LIST"
  echo "-- new ns, own /proc:"; unshare -pf --mount-proc python3 -c "$LIST"
  echo "-- new ns, host /proc:"; unshare -pf python3 -c "$LIST"
  echo "-- vgpuctl while it runs:"; "$CTL" status "$R" 2>&1 | head -20
  wait
  echo "-- vgpuctl after exit:"; "$CTL" status "$R" 2>&1 | head -20
  echo "-- a second run in a new namespace:"
  LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_SHARED_CACHE=$R CUDA_DEVICE_MEMORY_LIMIT=4g LIBCUDA_LOG_LEVEL=4 \
    unshare -pf $mp "$BIN/cuclient-link" await $((3<<30)) 8 0 2>&1 | tail -25
done
echo "=== without the library: does the driver itself work in a pid namespace?"
for mp in --mount-proc ""; do
  echo "-- unshare -pf $mp cuclient info:"
  unshare -pf $mp "$BIN/cuclient-link" info 2>&1 | tail -3
done
