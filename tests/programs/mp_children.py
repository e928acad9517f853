"""Children of a Python multiprocessing pool use the (simulated) driver
through ctypes: each takes HOLD bytes, waits until every sibling holds,
asks for HOLD more, reports, and frees when the parent says so.

    mp_children.py METHOD WORKERS HOLD_BYTES REGION VGPUCTL

Prints granted_first=, granted_second=, region_used_while_held=.
"""
import ctypes
import multiprocessing as mp
import subprocess
import sys


def cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    assert lib.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert lib.cuCtxSetCurrent(ctx) == 0
    return lib


def alloc(lib, n):
    p = ctypes.c_uint64()
    rc = lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n))
    return rc, p


def worker(args):
    hold, barrier, release = args
    lib = cuda()
    rc1, p1 = alloc(lib, hold)
    barrier.wait()
    rc2, p2 = alloc(lib, hold)
    barrier.wait()
    release.wait()
    for rc, p in ((rc1, p1), (rc2, p2)):
        if rc == 0:
            lib.cuMemFree_v2(p)
    return rc1, rc2


def main():
    method, workers, hold, region, ctl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    ctx = mp.get_context(method)
    with ctx.Manager() as m:
        barrier, release = m.Barrier(workers + 1), m.Event()
        with ctx.Pool(workers) as pool:
            pending = pool.map_async(worker, [(hold, barrier, release)] * workers)
            barrier.wait()  # every child holds its first allocation
            barrier.wait()  # every child asked for a second one
            out = subprocess.run([ctl, "usage", region, "0"], capture_output=True, text=True).stdout
            used = int(out)
            release.set()
            results = pending.get(timeout=60)
    print(f"granted_first={sum(r[0] == 0 for r in results)} granted_second={sum(r[1] == 0 for r in results)} "
          f"refused_second_oom={sum(r[1] == 2 for r in results)} region_used_while_held={used} "
          f"rcs={','.join(f'{a}/{b}' for a, b in results)}")


if __name__ == "__main__":
    main()
