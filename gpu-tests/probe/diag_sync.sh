#!/usr/bin/env bash
# Whether a PyTorch loop's synchronisations reach vgpu (docs/benchmarks.md,
# runs 48-49): lists the driver's synchronisation entry points, runs ten
# x.add_(1) then torch.cuda.synchronize() for 3 s at an SM limit of 30 %
# with trace logging, and counts the synchronisations vgpu saw and the
# turns' lines (windows judged). Log: $OUT/diag/loop.log.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIB=$(ldconfig -p | grep 'libcuda.so.1 ' | head -1 | awk '{print $NF}')
nm -D "$LIB" | grep -i "synchron"
mkdir -p "$OUT/diag"
R=$(mktemp -d)
cat > "$R/loop.py" <<'PY'
import time
import torch
x = torch.zeros(26372137, device="cuda")  # a ~0.05 ms add on an H200
for _ in range(20):
    x.add_(1)
torch.cuda.synchronize()
end, n = time.time() + 3, 0
while time.time() < end:
    for _ in range(10):
        x.add_(1)
    torch.cuda.synchronize()
    n += 10
print("kernels", n)
PY
LD_PRELOAD=$ROOT/target/release/libvgpu.so CUDA_DEVICE_MEMORY_SHARED_CACHE=$R/c.cache \
  CUDA_DEVICE_SM_LIMIT=30 LIBCUDA_LOG_LEVEL=5 python3 "$R/loop.py" > "$OUT/diag/loop.log" 2>&1
echo "synchronisations seen: $(grep -c 'synchronisation returned' "$OUT/diag/loop.log")"
echo "turns lines: $(grep 'turns:' "$OUT/diag/loop.log" | grep -vc 'synchronisation returned')"
grep "kernels" "$OUT/diag/loop.log"
