set -x
nm -D $(ldconfig -p | grep 'libcuda.so.1 ' | head -1 | awk '{print $NF}') | grep -i "synchron" 
export OUT=$OUT/diag; mkdir -p $OUT
R=$(mktemp -d)
cat > /tmp/loop.py <<'PY'
import torch, time
x = torch.zeros(26372137, device="cuda")
for _ in range(20): x.add_(1)
torch.cuda.synchronize()
end = time.time() + 3
n = 0
while time.time() < end:
    for _ in range(10):
        x.add_(1)
        e = torch.cuda.Event(enable_timing=True); e.record()
    torch.cuda.synchronize()
    n += 10
print("kernels", n)
PY
LD_PRELOAD=$PWD/target/release/libvgpu.so CUDA_DEVICE_MEMORY_SHARED_CACHE=$R/c.cache CUDA_DEVICE_SM_LIMIT=30 LIBCUDA_LOG_LEVEL=5 python3 /tmp/loop.py > $OUT/loop.log 2>&1
grep -c "synchronisation returned" $OUT/loop.log
grep -c "turns:" $OUT/loop.log
grep "turns:" $OUT/loop.log | grep -v "synchronisation returned" | head -20
grep -i "kernels\|error\|warn" $OUT/loop.log | head
