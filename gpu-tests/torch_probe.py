"""PyTorch scenarios for gpu-tests/scenarios.py. Each prints key=value lines.

    torch_probe.py transparent          deterministic work; prints results
    torch_probe.py fill CHUNK_MIB       fill until OOM, watching NVML; free; again
    torch_probe.py hold GIB SECONDS [quota]
                                        allocate and hold GIB (quota: until the
                                        container's usage is GIB, context included)
    torch_probe.py second GIB           ask for GIB while another process holds memory
    torch_probe.py graph SECONDS        CUDA-graph replays per second
    torch_probe.py startup              time import + first allocation
    torch_probe.py storm SECONDS SEED   random allocate/free until killed
    torch_probe.py calibrate            sizes of memory-bound kernels of 0.05/1/10 ms
    torch_probe.py steps SECONDS        hold 1 GiB, 3 GiB, 1 GiB, nothing (SECONDS each;
                                        frees go back to the driver), printing each phase
    torch_probe.py work KIND SIZE SECONDS GO_FILE [OFFSET]
                                        back-to-back kernels (neighbours scenario)
    torch_probe.py busy GIB SECONDS     hold GIB and run GEMMs back to back (exporter scenario)
    torch_probe.py restart GIB SECONDS  a restarted container's run: its first CUDA call
                                        asks GIB (context created in it); prints
                                        restart_rc, then holds it SECONDS and exits
    torch_probe.py streams SECONDS      two threads, each x.add_(1) on its own 0.5 GB tensor
                                        and stream, ten at a time (compute scenario)
"""
import os
import sys
import time


def nvml_used_by_me():
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    me = os.getpid()
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == me:
            return p.usedGpuMemory or 0
    return 0


def refused(e):
    """Whether a CUDA error is the driver's out-of-memory. The caching
    allocator raises torch.OutOfMemoryError; a context that cannot be
    created (the container has no room for it, as on a full card) surfaces
    from the runtime as an AcceleratorError saying "out of memory"."""
    import torch

    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "out of memory" in str(e))


def transparent():
    import torch

    torch.manual_seed(0)
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    c = (a @ b).relu().sum().item()
    print(f"matmul_sum={c:.3f}")
    free, total = torch.cuda.mem_get_info()
    print(f"total={total} device={torch.cuda.get_device_name(0).replace(' ', '_')}")
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"alloc_ok={x.numel()}")
    del x
    torch.cuda.synchronize()
    print("done=1")


def fill(chunk_mib):
    import torch

    ctx_start = nvml_used_by_me()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    ctx = nvml_used_by_me()
    held, max_phys, err = [], 0, "none"
    try:
        while True:
            held.append(torch.empty(chunk_mib << 20, dtype=torch.uint8, device="cuda"))
            max_phys = max(max_phys, nvml_used_by_me())
            if len(held) > 100000:
                break
    except torch.OutOfMemoryError as e:
        err = "OutOfMemoryError"
        msg = str(e).splitlines()[0][:120].replace(" ", "_")
        print(f"oom_message={msg}")
    except Exception as e:  # any other failure is a bug
        err = type(e).__name__
    max_phys = max(max_phys, nvml_used_by_me())
    filled = sum(t.numel() for t in held)
    print(f"context_bytes={ctx} before_ctx={ctx_start} filled_bytes={filled} error={err} max_nvml_used={max_phys}")
    free, total = torch.cuda.mem_get_info()
    print(f"full_free={free} full_total={total}")
    held.clear()
    torch.cuda.empty_cache()
    again = "ok"
    try:
        y = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        del y
    except Exception as e:
        again = type(e).__name__
    print(f"again={again}")


def hold(gib, secs, quota=False):
    import torch

    size = int(gib * (1 << 30))
    if quota:
        free, total = torch.cuda.mem_get_info()
        size -= total - free  # what the container holds already: this context
    x = torch.empty(size, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print(f"holding={x.numel()}", flush=True)
    time.sleep(secs)


def restart(gib, secs):
    """The restarts scenario's run: the first CUDA call is the big
    allocation (the context is created inside it), one attempt."""
    ino = os.stat("/proc/self/ns/pid").st_ino
    import torch

    t = time.time()
    try:
        x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
    except Exception as e:
        print(f"restart_rc={2 if refused(e) else 1} alloc_s={time.time() - t:.3f} ns_ino={ino} "
              f"error={type(e).__name__}", flush=True)
        sys.exit(1)
    print(f"restart_rc=0 alloc_s={time.time() - t:.3f} ns_ino={ino} held={x.numel()}", flush=True)
    time.sleep(secs)


def busy(gib, secs):
    """Holds GIB, then runs bf16 GEMMs back to back for SECS."""
    import torch

    x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    op = _op("gemm", 4096)
    op()
    torch.cuda.synchronize()
    print(f"holding={x.numel()}", flush=True)
    end, n = time.time() + secs, 0
    while time.time() < end:
        for _ in range(10):
            op()
        torch.cuda.synchronize()
        n += 10
    print(f"kernels={n}")


def second(gib):
    import torch

    try:
        free, total = torch.cuda.mem_get_info()
    except Exception as e:
        if not refused(e):
            raise
        # No room even for this process's CUDA context.
        print(f"before_free=0 before_total=0 result=ContextRefused error={type(e).__name__}", flush=True)
        return
    print(f"before_free={free} before_total={total}", flush=True)
    time.sleep(1.5)  # lets the caller read the region meanwhile
    try:
        x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
        print(f"result=granted size={x.numel()}")
    except torch.OutOfMemoryError:
        print("result=OutOfMemoryError")
    except Exception as e:
        print(f"result={type(e).__name__}")


def sm_clock_mhz():
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_CLOCK_SM)


def graph(secs, kind="mlp"):
    """Replays of a captured model step: `mlp` (a 4-layer bf16 MLP on a
    batch of 2048 tokens) or `gemm` (eight 4096^3 bf16 GEMMs, which run the
    card at its power limit)."""
    import torch

    if kind == "gemm":
        n = 4096
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)

        def step():
            for _ in range(8):
                torch.matmul(a, b, out=out)
    else:
        model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(2048, 2048), torch.nn.GELU())])
        model = model.cuda().to(torch.bfloat16)
        x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)

        def step():
            with torch.no_grad():
                model(x)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    g.replay()
    torch.cuda.synchronize()
    per_sec, clock = [], 0
    t0 = time.perf_counter()
    end = t0 + secs
    count, sec_start = 0, t0
    events = []
    while time.perf_counter() < end:
        g.replay()
        e = torch.cuda.Event()
        e.record()
        events.append(e)
        while len(events) > 4:
            events.pop(0).synchronize()
            count += 1
        now = time.perf_counter()
        if now - sec_start >= 1.0:
            per_sec.append(count)
            count, sec_start = 0, now
        if len(per_sec) == 2 and count == 0:
            clock = sm_clock_mhz()
    torch.cuda.synchronize()
    print("per_sec=" + ",".join(str(c) for c in per_sec))
    print(f"rate={sum(per_sec[1:]) / max(1, len(per_sec) - 1):.3f} sm_clock_mhz={clock}")


def steps(secs):
    """Allocates and frees in steps, each held `secs`: 1 GiB, 3 GiB, 1 GiB,
    nothing (the cache emptied, so the driver gets the memory back).
    Prints phase=NAME start=T end=T nvml=BYTES for each (Unix seconds; NVML's
    used memory of this process at the phase's end)."""
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    print(f"ready=1 pid={os.getpid()}", flush=True)
    time.sleep(secs)
    held = {}

    def phase(name):
        torch.cuda.synchronize()
        start = time.time()
        time.sleep(secs)
        print(f"phase={name} start={start:.3f} end={time.time():.3f} nvml={nvml_used_by_me()}", flush=True)

    held["a"] = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    phase("1g")
    held["b"] = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    phase("3g")
    del held["b"]
    torch.cuda.empty_cache()
    phase("1g_again")
    del held["a"]
    torch.cuda.empty_cache()
    phase("none")


def startup():
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"import_s={t1 - t0:.6f} first_alloc_s={t2 - t1:.6f} total_s={t2 - t0:.6f}")


def storm(secs, seed):
    import random

    import torch

    rng = random.Random(seed)
    held = []
    end = time.time() + secs
    while time.time() < end:
        if held and rng.random() < 0.5:
            held.pop(rng.randrange(len(held)))
        else:
            try:
                held.append(torch.empty(rng.randint(64, 768) << 20, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
            except RuntimeError as e:
                if not refused(e):
                    raise
                # No room for this worker's context: it ends, as a job would.
                print("holding=0 context=refused", flush=True)
                return
        if rng.random() < 0.1:
            torch.cuda.empty_cache()
    print(f"holding={sum(t.numel() for t in held)}", flush=True)


def _op(kind, size):
    """One kernel: `mem` adds 1 to a float32 tensor of SIZE elements (memory
    bound), `gemm` multiplies two bf16 SIZE x SIZE matrices (compute bound)."""
    import torch

    if kind == "mem":
        x = torch.zeros(int(size), dtype=torch.float32, device="cuda")
        return lambda: x.add_(1)
    n = int(size)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    return lambda: torch.matmul(a, b, out=c)


def _kernel_ms(op, n=50):
    import torch

    for _ in range(5):
        op()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        op()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / n


def calibrate():
    """Tensor sizes whose `add_` takes 0.05, 1 and 10 ms on this card."""
    import torch

    probe = 1 << 28
    ms = _kernel_ms(_op("mem", probe))
    torch.cuda.empty_cache()
    per_elem = ms / probe
    for target in (0.05, 1, 10):
        size = int(target / per_elem)
        got = _kernel_ms(_op("mem", size), 20 if target < 10 else 5)
        torch.cuda.empty_cache()
        print(f"mem_{target:g}={size} mem_{target:g}_ms={got:.4f}")
    print(f"gemm=8192 gemm_ms={_kernel_ms(_op('gemm', 8192), 20):.4f}")


def work(kind, size, secs, go_file, offset=0.0, sync_every=10):
    """Kernels back to back, synchronising every `sync_every`, for `secs`
    from `offset` seconds after the go time (read from GO_FILE once it
    exists). Every kernel is followed by an event, so completions are
    counted per second of GPU time and the gap between consecutive events
    (a kernel's time plus any other context's time slice in between) is
    reported too."""
    import torch

    op = _op(kind, size)
    pace = float(os.environ.get("WORK_PACE_MS", "0")) / 1000  # host sleep after each batch
    sync_every = int(os.environ.get("WORK_SYNC_EVERY", sync_every))
    for _ in range(20):
        op()
    torch.cuda.synchronize()
    print("ready=1", flush=True)
    while not os.path.exists(go_file):
        time.sleep(0.005)
    go = float(open(go_file).read())
    start = go + offset
    while time.time() < start:
        time.sleep(min(0.005, max(0.0, start - time.time())))
    ref = torch.cuda.Event(enable_timing=True)
    ref.record()
    done, gaps = [], []
    # WORK_TIMELINE=PREFIX: each batch's host times (before its first
    # launch, after it, after the last, after the synchronisation, after
    # reading its events' times) and
    # its kernels' ends on the GPU clock go to PREFIX.PID.json, to tell
    # where a batch's time goes (the host, the GPU, another context).
    timeline = os.environ.get("WORK_TIMELINE")
    batches = []
    duty = [float(x) / 1000 for x in os.environ.get("WORK_DUTY_MS", "").split(",") if x]
    cycle = time.time()
    end = start + secs
    while time.time() < end:
        events = []
        h0 = time.perf_counter()
        h1 = None
        for _ in range(sync_every):
            op()
            if h1 is None:
                h1 = time.perf_counter()
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            events.append(e)
        h2 = time.perf_counter()
        torch.cuda.synchronize()
        h3 = time.perf_counter()
        if pace:
            time.sleep(pace)
        if duty:
            # WORK_DUTY_MS=ON,OFF: the host runs ON ms, then sleeps OFF,
            # as a container in turns does, with no limit to do it.
            now = time.time()
            if now - cycle >= duty[0]:
                cycle += duty[0] + duty[1]
                time.sleep(max(0.0, cycle - now))
        t = [ref.elapsed_time(e) / 1000 for e in events]
        h4 = time.perf_counter()
        done.extend(t)
        gaps.extend((b - a) * 1000 for a, b in zip(t, t[1:]))
        if timeline:
            batches.append((h0, h1, h2, h3, h4, t))
    if timeline:
        import json
        with open(f"{timeline}.{os.getpid()}.json", "w") as f:
            json.dump(batches, f)
    whole = int(secs)
    per_sec = [0] * whole
    for t in done:
        if 0 <= t < whole:
            per_sec[int(t)] += 1
    gaps.sort()
    q = lambda f: gaps[min(len(gaps) - 1, int(f * len(gaps)))] if gaps else 0
    # A kernel's own time: the mean gap, less those that held another
    # context's time slice (2.5 ms on an H200, so more than half again
    # a kernel shorter than 5 ms), or another context's kernel: paced
    # side by side (not in turns), most gaps hold one, so the clean ones
    # are the lowest few per cent.
    own = [g for g in gaps if g <= 1.5 * q(0.02)]
    print("per_sec=" + ",".join(str(c) for c in per_sec))
    print(f"rate={sum(per_sec) / whole:.3f} kernels={len(done)} offset={offset} "
          f"kernel_ms={sum(own) / len(own) if own else 0:.4f}")
    print(f"gap_ms_min={q(0):.4f} gap_ms_p10={q(0.1):.4f} gap_ms_p50={q(0.5):.4f} gap_ms_p90={q(0.9):.4f} "
          f"gap_ms_max={q(1.0) if gaps else 0:.4f}")


def streams(secs):
    """Two threads of one process, each on its own stream: memory-bound
    kernels that fill the GPU, so the streams hardly overlap."""
    import threading
    import torch
    n = 128 << 20
    count = [0, 0]

    def loop(i, stream):
        x = torch.zeros(n, device="cuda")
        end = time.time() + secs
        with torch.cuda.stream(stream):
            while time.time() < end:
                for _ in range(10):
                    x.add_(1)
                stream.synchronize()
                count[i] += 10

    torch.zeros(1, device="cuda")
    threads = [threading.Thread(target=loop, args=(i, torch.cuda.Stream())) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"rate={count[0] / secs:.1f}\nside_rate={count[1] / secs:.1f}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {
        "transparent": lambda: transparent(),
        "fill": lambda: fill(int(args[0])),
        "hold": lambda: hold(float(args[0]), float(args[1]), args[2:] == ["quota"]),
        "second": lambda: second(float(args[0])),
        "graph": lambda: graph(float(args[0]), args[1] if len(args) > 1 else "mlp"),
        "startup": lambda: startup(),
        "steps": lambda: steps(float(args[0])),
        "storm": lambda: storm(float(args[0]), int(args[1])),
        "calibrate": lambda: calibrate(),
        "busy": lambda: busy(float(args[0]), float(args[1])),
        "restart": lambda: restart(float(args[0]), float(args[1])),
        "streams": lambda: streams(float(args[0])),
        "work": lambda: work(args[0], float(args[1]), float(args[2]), args[3], float(args[4]) if len(args) > 4 else 0.0),
    }[cmd]()
