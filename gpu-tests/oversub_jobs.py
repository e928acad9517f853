#!/usr/bin/env python3
"""PyTorch jobs for the `oversub` GPU section (scenarios.py).

    oversub_jobs.py hold GIB
        GIB GiB of seeded int32 on the GPU; prints pid= and sum=, waits for a
        line on stdin (meanwhile another process checkpoints and restores
        this one), then checks the data: intact= first_op_ms=.
    oversub_jobs.py turns GIB COMPUTE_S IDLE_S ROUNDS
        GIB GiB of seeded data, then ROUNDS times: a bf16 matmul loop for
        COMPUTE_S seconds (TFLOPS), the cache emptied, IDLE_S seconds idle.
        After every idle spell (when vgpu may have suspended and restored
        it) the first operation is timed and the data checked.
    oversub_jobs.py bursts GIB GEMMS IDLE_S BURSTS
        GIB GiB of seeded data, then BURSTS times: one bf16 8192^3 matmul
        timed (first_op_ms: after an idle spell it includes vgpu's restore
        and any wait for room), GEMMS more (a fixed amount of work:
        burst_s, tflops), the data's digest compared (intact), the cache
        emptied, IDLE_S seconds without a CUDA call. Ends with done=1
        total_s (from the start of the script).
    oversub_jobs.py pinned GIB
        The pinned copy rate: GIB GiB between the GPU and pinned host
        memory, each way, best of 3 (out_gbs= back_gbs=), for the switch
        rates to be judged against (issue 27).
    oversub_jobs.py busy GIB GEMMS
        GIB GiB of seeded data, then GEMMS bf16 8192^3 matmuls without a
        pause, synchronised every 20. A batch that took over a second more
        than the typical one was suspended meanwhile (a turn given): the
        data is checked then (turn= gap_s= intact=), and every 10 s too.
        Ends with done=1 total_s, turns, intact (all checks), and
        tflops_running (the work over the time it was on the card: the
        gaps left out).
"""
import faulthandler
import os
import signal
import statistics
import sys
import time

T0 = time.time()
# Every thread's Python stack on SIGUSR1 (scenarios.finish_job sends it
# to a job still running at its deadline).
faulthandler.register(signal.SIGUSR1, all_threads=True)

import torch  # noqa: E402 (the start time includes PyTorch's import)

CHUNK = 1 << 27


def fill(gib):
    n = int(gib * (1 << 30)) // 4
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.empty(n, dtype=torch.int32, device="cuda")
    for i in range(0, n, CHUNK):
        x[i:i + CHUNK].random_(-(2 ** 31), 2 ** 31 - 1, generator=g)
    return x


def digest(x):
    """Position-weighted sum (wrapping int64): a moved or changed word shows."""
    s = torch.zeros((), dtype=torch.int64, device="cuda")
    for i in range(0, x.numel(), CHUNK):
        c = x[i:i + CHUNK].to(torch.int64)
        w = torch.arange(i + 1, i + 1 + c.numel(), dtype=torch.int64, device="cuda")
        s += (c * w).sum()
    return int(s)


def pinned(gib):
    n = int(gib * (1 << 30))
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    rates = {"out": [], "back": []}
    for _ in range(3):
        for way, (dst, src) in (("out", (host, dev)), ("back", (dev, host))):
            torch.cuda.synchronize()
            t = time.time()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            rates[way].append(n / 1e9 / (time.time() - t))
    print(f"out_gbs={max(rates['out']):.1f} back_gbs={max(rates['back']):.1f}", flush=True)


def hold(gib):
    x = fill(gib)
    d0 = digest(x)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    print(f"pid={os.getpid()} sum={d0}", flush=True)
    sys.stdin.readline()
    t = time.time()
    y = x[:16].clone()
    torch.cuda.synchronize()
    first = (time.time() - t) * 1e3
    d1 = digest(x)
    print(f"intact={int(d0 == d1)} first_op_ms={first:.1f} sum2={d1}", flush=True)
    del y


def turns(gib, compute_s, idle_s, rounds):
    t = time.time()
    x = fill(gib)
    d0 = digest(x)
    torch.cuda.synchronize()
    print(f"started=1 alloc_s={time.time() - t:.1f}", flush=True)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for r in range(rounds):
        t = time.time()
        y = a @ b
        torch.cuda.synchronize()
        first = (time.time() - t) * 1e3
        intact = digest(x) == d0
        n, t = 0, time.time()
        while time.time() - t < compute_s:
            for _ in range(20):
                y = a @ b
            torch.cuda.synchronize()
            n += 20
        tflops = n * 2 * 8192 ** 3 / (time.time() - t) / 1e12
        print(f"round={r} first_op_ms={first:.0f} intact={int(intact)} tflops={tflops:.1f}", flush=True)
        del y
        torch.cuda.empty_cache()
        if r + 1 < rounds:
            time.sleep(idle_s)
    print("done=1", flush=True)


def setup(gib):
    """`gib` of checked data and its digest, and two 8192^3 bf16 operands;
    says it started."""
    x = fill(gib)
    d0 = digest(x)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    print(f"started=1 setup_s={time.time() - T0:.1f}", flush=True)
    return x, d0, a, b


def bursts(gib, gemms, idle_s, count):
    x, d0, a, b = setup(gib)
    for r in range(count):
        t = time.time()
        y = a @ b
        torch.cuda.synchronize()
        first = (time.time() - t) * 1e3
        t = time.time()
        for i in range(gemms):
            y = a @ b
            if i % 50 == 49:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        burst = time.time() - t
        intact = digest(x) == d0
        tflops = gemms * 2 * 8192 ** 3 / burst / 1e12
        print(f"burst={r} first_op_ms={first:.0f} burst_s={burst:.2f} tflops={tflops:.1f} intact={int(intact)}",
              flush=True)
        del y
        torch.cuda.empty_cache()
        if r + 1 < count:
            time.sleep(idle_s)
    print(f"done=1 total_s={time.time() - T0:.1f}", flush=True)


def check(x, d0):
    """The digest, its 2 GiB of temporaries given back to the card: what a
    turn moves (and a restore needs room for) stays the data and little
    more."""
    ok = digest(x) == d0
    torch.cuda.empty_cache()
    return ok


def busy(gib, gemms):
    x, d0, a, b = setup(gib)
    batches, gaps, checks, all_ok = [], 0.0, 0, True
    t_start = last_check = time.time()
    done = 0
    while done < gemms:
        t = time.time()
        n = min(20, gemms - done)
        for _ in range(n):
            y = a @ b
        torch.cuda.synchronize()
        dt = time.time() - t
        done += n
        typical = statistics.median(batches[-50:]) if batches else dt
        if batches and dt > typical + 1.0:
            gaps += dt - typical
            ok = check(x, d0)
            all_ok &= ok
            checks += 1
            print(f"turn={checks} at_s={time.time() - t_start:.1f} gap_s={dt - typical:.1f} intact={int(ok)}",
                  flush=True)
            last_check = time.time()
        else:
            batches.append(dt)
        if time.time() - last_check > 10:
            ok = check(x, d0)
            all_ok &= ok
            last_check = time.time()
        del y
    torch.cuda.synchronize()
    ok = check(x, d0)
    all_ok &= ok
    wall = time.time() - t_start
    tflops = gemms * 2 * 8192 ** 3 / max(wall - gaps, 1e-9) / 1e12
    print(f"done=1 total_s={time.time() - T0:.1f} work_s={wall:.1f} turns={checks} intact={int(all_ok)} "
          f"tflops_running={tflops:.1f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "pinned":
        pinned(float(sys.argv[2]))
    elif sys.argv[1] == "hold":
        hold(float(sys.argv[2]))
    elif sys.argv[1] == "busy":
        busy(float(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "bursts":
        bursts(float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
    else:
        turns(float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
