#!/usr/bin/env bash
# One-off probe of the GPU machine: driver exports, the cuGetProcAddress
# table, NVML behaviour and costs.  Output under $OUT.
set -u
OUT=${OUT:-/tmp/probe-out}; mkdir -p "$OUT"
cd "$(dirname "$0")"
exec > >(tee "$OUT/probe.log") 2>&1
nvidia-smi
nvidia-smi -q -d MEMORY | head -30
for f in /usr/local/nvidia/lib64/libcuda.so.1 /usr/local/nvidia/lib64/libnvidia-ml.so.1 \
         /lib/x86_64-linux-gnu/libcuda.so.1 /lib/x86_64-linux-gnu/libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1; do
  [ -e "$f" ] && echo "lib $f -> $(readlink -f $f) $(md5sum < $(readlink -f $f) | cut -c1-12)"
done
ldconfig -p | grep -E 'libcuda|nvidia-ml'
echo "pidns $(readlink /proc/self/ns/pid)"
CUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
NVML=$(ldconfig -p | awk '/libnvidia-ml.so.1 /{print $NF; exit}')
nm -D --defined-only "$CUDA" | awk '{print $3}' | grep -E '^cu' | sort > "$OUT/libcuda_exports.txt"
nm -D --defined-only "$NVML" | awk '{print $3}' | grep -E '^nvml' | sort > "$OUT/libnvml_exports.txt"
wc -l "$OUT"/lib*_exports.txt
ldd $(which nvidia-smi)
cc -O1 -o /tmp/proc_address proc_address.c -ldl && /tmp/proc_address > "$OUT/proc_address_table.csv"; echo "table rc=$? rows=$(wc -l < $OUT/proc_address_table.csv)"
cc -O2 -I/usr/local/cuda/include -o /tmp/calibrate calibrate.c -ldl -lpthread -L/usr/local/cuda/lib64/stubs -lcuda -L/usr/local/cuda/lib64/stubs -lnvidia-ml && /tmp/calibrate
python3 - <<'PY'
import time, os
t0=time.perf_counter()
import torch
t1=time.perf_counter()
x=torch.zeros(1,device='cuda')
torch.cuda.synchronize()
t2=time.perf_counter()
import pynvml
pynvml.nvmlInit()
h=pynvml.nvmlDeviceGetHandleByIndex(0)
for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
    if p.pid==os.getpid(): print("torch ctx used MiB", p.usedGpuMemory/2**20)
print("torch import s %.3f first alloc s %.3f"%(t1-t0,t2-t1))
print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))
print("mem_get_info", torch.cuda.mem_get_info())
PY
