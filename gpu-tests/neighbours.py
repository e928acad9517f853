"""Containers that share one GPU, each with its own region and SM limit
(issue 9): run by scenarios.py's `neighbours` and `mechanism` sections.

Each container is one PyTorch process (torch_probe.py work) running
kernels back to back and synchronising every 10. Its figure is its
throughput as a fraction of the same loop running alone and unlimited.
While a case runs, NVML's per-process utilisation and every container's
region (vgpuctl status) are sampled twice a second.

Environment: NEIGHBOURS_SECS (per case, 20), NEIGHBOURS_ONLY (cases as
"30+60/mem-1ms,staggered"), NEIGHBOURS_LOG_LEVEL (the library's, 4),
NEIGHBOURS_PIDNS=1 (each container in its own pid namespace, as pods).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

S = None  # the scenarios module (record, make_env, spawn, ...)

# Kernel kinds: (torch_probe kind, key of the calibrated size).
KINDS = {
    "mem-0.05ms": ("mem", "mem_0.05"),
    "mem-1ms": ("mem", "mem_1"),
    "mem-10ms": ("mem", "mem_10"),
    "gemm": ("gemm", "gemm"),
}


class Sampler:
    """NVML per-process SM utilisation and each region's controller state,
    every 0.5 s, in a thread."""

    def __init__(self, regions, pids):
        self.regions = regions
        self.pids = pids
        self.nvml = []  # (unix s, pid, smUtil)
        self.device = []  # (unix s, gpu util)
        self.clock = []  # (unix s, SM clock MHz, power W)
        self.region = {r: [] for r in regions}  # (unix s, scale, util)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            h = None
        last = int(time.time() * 1e6)
        while not self.stop.wait(0.5):
            now = time.time()
            if h is not None:
                # The samples since the last reading, averaged per process
                # as vgpu's leader does (it kept only the last one before
                # run 20): a process NVML leaves out had no utilisation
                # (counted 0, as vgpu does).
                try:
                    samples = pynvml.nvmlDeviceGetProcessUtilization(h, last)
                except pynvml.NVMLError:
                    samples = []
                if samples:
                    last = max(s.timeStamp for s in samples)
                    per = {}
                    for smp in samples:
                        per.setdefault(smp.pid, []).append(smp.smUtil)
                    for pid in self.pids:
                        self.nvml.append((now, pid, statistics.mean(per[pid]) if pid in per else 0))
                try:
                    self.device.append((now, pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
                except pynvml.NVMLError:
                    pass
                try:
                    self.clock.append((now, pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                                       pynvml.nvmlDeviceGetPowerUsage(h) / 1000))
                except pynvml.NVMLError:
                    pass
            for r in self.regions:
                dev = S.region_json(r)["devices"]
                if dev:
                    self.region[r].append((now, dev[0]["bucket_scale"], dev[0]["utilization_percent"] / 100))

    def finish(self):
        self.stop.set()
        self.thread.join(timeout=10)

    def nvml_mean(self, pid, t0, t1):
        v = [u for (t, p, u) in self.nvml if p == pid and t0 <= t <= t1]
        return statistics.mean(v) / 100 if v else float("nan")

    def device_mean(self, t0, t1):
        v = [u for (t, u) in self.device if t0 <= t <= t1]
        return statistics.mean(v) / 100 if v else float("nan")

    def clock_mean(self, t0, t1):
        """Mean SM clock (MHz) and power (W) over [t0, t1]."""
        v = [(c, w) for (t, c, w) in self.clock if t0 <= t <= t1]
        if not v:
            return float("nan"), float("nan")
        return statistics.mean(c for c, _ in v), statistics.mean(w for _, w in v)

    def region_mean(self, region, t0, t1, field):
        v = [x[field] for x in self.region.get(region, []) if t0 <= x[0] <= t1]
        return statistics.mean(v) if v else float("nan")


def worker_cmd(kind, size, secs, go, offset):
    fake = os.environ.get("NEIGHBOURS_FAKE_WORKER")  # for testing this script without a GPU
    prog = [sys.executable, fake] if fake else [S.PY, S.PROBE]
    # Each container in its own pid namespace, as pods are: NVML then lists
    # it its own processes only (run 18).
    pidns = ["unshare", "-pf", "--mount-proc"] if os.environ.get("NEIGHBOURS_PIDNS") == "1" else []
    return pidns + prog + ["work", kind, str(size), str(secs), go, str(offset)]


def run_case(name, kind_key, members, sizes, preload=True, extra=None):
    """Runs containers side by side. `members`: list of (SM limit or None,
    offset s, seconds). Returns one dict per member."""
    kind, size_key = KINDS[kind_key]
    size = sizes[size_key]
    go = os.path.join(tempfile.mkdtemp(prefix="vgpu-go-"), "go")
    procs, regions = [], []
    for i, (limit, offset, secs) in enumerate(members):
        region = S.new_region()
        env = {"LIBCUDA_LOG_LEVEL": os.environ.get("NEIGHBOURS_LOG_LEVEL", "4")}
        env.update(extra or {})
        if limit is not None:
            env["CUDA_DEVICE_SM_LIMIT"] = str(limit)
        p = S.spawn(worker_cmd(kind, size, secs, go, offset), S.make_env(preload, env, region),
                    f"nb-{name}-{kind_key}-{i}-{limit}")
        procs.append(p)
        regions.append(region)
    for p in procs:
        S.wait_line(p, "ready=", 120)
    t_go = time.time() + 0.5
    sampler = Sampler(regions, [p.pid for p in procs])
    with open(go + ".tmp", "w") as f:
        f.write(repr(t_go))
    os.rename(go + ".tmp", go)
    results = []
    for (limit, offset, secs), p, region in zip(members, procs, regions):
        out, _ = p.communicate(timeout=offset + secs + 180)
        r = S.kv(out)
        per = [int(x) for x in r.get("per_sec", "").split(",") if x]
        results.append({"limit": limit, "offset": offset, "secs": secs, "pid": p.pid, "rc": p.returncode,
                        "rate": float(r.get("rate", "nan")), "per_sec": per,
                        "gap_ms": {k[7:]: float(v) for k, v in r.items() if k.startswith("gap_ms_")},
                        "kernel_ms": float(r.get("kernel_ms", "nan")),
                        "t0": t_go + offset, "region": region, "vgpu": preload})
    sampler.finish()
    for r in results:
        t0, t1 = r["t0"] + 3, r["t0"] + r["secs"]
        r["device_util"] = sampler.device_mean(t0, t1)
        r["clock_mhz"], r["power_w"] = sampler.clock_mean(t0, t1)
        r["nvml"] = sampler.nvml_mean(r["pid"], t0, t1)
        r["scale"] = sampler.region_mean(r["region"], t0, t1, 1)
        r["region_util"] = sampler.region_mean(r["region"], t0, t1, 2)
    return results


def gpu_time(r, ref=None):
    """A container's GPU time as a fraction of the run: its kernels a
    second times what one took in this run, at the clock it ran at
    (`kernel_ms`: the mean gap between consecutive events of a batch,
    less gaps that held another context's slice or kernel; the host
    queues a batch's ten kernels ahead of the GPU, so a gap is one
    kernel's time). Paced beside an unlimited neighbour, every kernel of
    a container is followed by the neighbour's time slice and no gap is
    clean: where the run's kernel took over 1.3x its solo time
    (`ref`), the solo time at the run's clock stands in (a power-bound
    GEMM runs faster on a less busy GPU; a memory-bound kernel, at any
    clock, as fast)."""
    k_ms = r["kernel_ms"]
    if ref and k_ms > 1.3 * ref["k_ms"]:
        k_ms = ref["k_ms"] * min(1.0, ref["clock"] / max(r["clock_mhz"], 1.0))
    return r["rate"] * k_ms / 1000


def judge(sec, case, kind_key, results, ref):
    """Records one row per limited container: fraction of the solo rate
    over its run (beside a container without a limit, against its limit
    over how busy its loop keeps the GPU alone) and the worst 1-s window
    after its first 3 s. Then what
    the regions show against each container's GPU time (`gpu_time`: its
    own kernels, timed in the run). NVML's per-process figures, and the
    device's utilisation split by throughput (the reference before run
    57), are recorded beside it, with the SM clock and the power of the
    run against the solo one's (a power-bound GEMM runs faster the less
    busy the GPU is)."""
    solo = ref["rate"]
    ok_all = True
    parts = []
    for r in results:
        frac = r["rate"] / solo
        windows = [c / solo for c in r["per_sec"][3:]]
        lim = r["limit"]
        parts.append(f"{lim or 'unl'}:{frac:.3f} (nvml {r['nvml']:.3f}, region {r['region_util']:.3f}, "
                     f"scale {r['scale']:.2f}, gpu time {gpu_time(r):.3f}, kernel "
                     f"{r['kernel_ms']:.4f} ms)")
        if lim is None:
            if r.get("vgpu"):
                # With vgpu and no limit: beside limited containers it
                # takes what their limits leave (limiter/rest.rs).
                limits = sum(x["limit"] for x in results if x["limit"] is not None)
                rest = max(90 - limits, 10) / 100
                S.record(sec, f"{case} {kind_key}: the container without a limit (it takes the rest, "
                              f"{rest:.2f}): fraction", f"{frac:.3f}", f"{rest:.2f} (for the record)", r["rc"] == 0)
            continue
        want = lim / 100
        worst = max((abs(w - want) for w in windows), default=1.0)
        beside_unlimited = any(x["limit"] is None for x in results)
        if beside_unlimited:
            # Paced beside a container without a limit, a perfect limit
            # gives the container `want` of the GPU's time, which is
            # want / busy of its solo throughput, where its loop alone
            # keeps the GPU only `busy` of the time (0.05 ms kernels: 0.90,
            # so 0.332 at 30 %; the row failed 14 runs since 118 at 0.330-
            # 0.348 with GPU time 0.300-0.308, while runs 15-18's 0.378-
            # 0.397, before the limit held there, fail still). Both bounds
            # so scaled.
            busy = min(max(ref.get("gpu_time", 1.0), 0.5), 1.0)
            lo, hi = (want - 0.05) / busy, (want + 0.03) / busy
            ok = r["rc"] == 0 and lo <= frac <= hi
            target = f"{lo:.3f}..{hi:.3f} ({want - 0.05:.2f}..{want + 0.03:.2f} / solo busy {busy:.3f})"
        elif case == "50+50":
            ok = r["rc"] == 0 and frac >= 0.47 and worst <= 0.08
            target = ">= 0.47; <= 0.08"
        else:
            ok = r["rc"] == 0 and abs(frac - want) <= 0.03 and worst <= 0.08
            target = f"{want:.2f} +-0.03; <= 0.08"
        ok_all &= ok
        S.record(sec, f"{case} {kind_key}: container at {lim}%: fraction; worst 1-s window",
                 f"{frac:.3f}; {worst:.3f} (NVML {r['nvml']:.3f}, region {r['region_util']:.3f}, "
                 f"GPU time {gpu_time(r, ref):.3f}, scale {r['scale']:.2f})", target, ok)
    clock, power = results[0]["clock_mhz"], results[0]["power_w"]
    print(f"# {case} {kind_key}: " + ", ".join(parts) + f"; SM clock {clock:.0f} MHz ({ref['clock']:.0f} alone), "
          f"power {power:.0f} W ({ref['power']:.0f} alone)", flush=True)
    limited = [r for r in results if r["limit"] is not None]
    truth = [gpu_time(r, ref) for r in limited]
    # (A missing figure reads NaN, which max() would pass over unless first.)
    diffs = [abs(r["region_util"] - t) for r, t in zip(limited, truth)]
    gap = float("nan") if not diffs or any(d != d for d in diffs) else max(diffs)
    shown = ", ".join(f"{r['region_util']:.3f} vs {t:.3f}" for r, t in zip(limited, truth))
    device = results[0]["device_util"]
    rates = sum(r["rate"] for r in results)
    split = ", ".join(f"{device * r['rate'] / rates:.3f}" for r in limited)
    S.record(sec, f"{case} {kind_key}: utilisation in the region (vgpuctl) vs the container's GPU time "
                  f"(its kernels a second times a kernel's time in the run; the device's utilisation "
                  f"{device:.3f} split by throughput: {split}), largest difference of the means",
             f"{gap:.3f} ({shown})", "<= 0.02", gap <= 0.02)
    nv = max((abs(r["region_util"] - r["nvml"]) for r in limited), default=float("nan"))
    S.record(sec, f"{case} {kind_key}: utilisation in the region vs NVML's per-process figure, largest "
                  "difference (for the record: NVML hands each sample period to one process)",
             f"{nv:.3f} (" + ", ".join(f"{r['nvml']:.3f}" for r in limited) + ")", "-", True)
    if kind_key == "gemm":
        S.record(sec, f"{case} {kind_key}: SM clock and power in the run, against the solo run's "
                      "(for the record: a power-bound GEMM runs faster on a less busy GPU)",
                 f"{clock:.0f} MHz, {power:.0f} W ({ref['clock']:.0f} MHz, {ref['power']:.0f} W alone; "
                 f"kernel {statistics.mean(r['kernel_ms'] for r in results):.4f} ms, "
                 f"{ref['k_ms']:.4f} alone)", "-", True)
    return ok_all


def calibrated_sizes():
    rc, out, _ = S.run([S.PY, S.PROBE, "calibrate"], S.make_env(True, None, S.new_region()), 300, "nb-calibrate")
    v = S.kv(out)
    sizes = {k: int(v[k]) for k in ("mem_0.05", "mem_1", "mem_10", "gemm") if k in v}
    print(f"# calibrated: {v}", flush=True)
    return sizes


def solo_rates(sizes, kinds, secs=6):
    """Each kind's run alone and unlimited: its rate, the device
    utilisation, SM clock and power NVML measured meanwhile, and a
    kernel's time."""
    refs = {}
    for k in kinds:
        r = run_case("solo", k, [(None, 0, secs)], sizes)[0]
        refs[k] = {"rate": r["rate"], "util": r["device_util"], "clock": r["clock_mhz"], "power": r["power_w"],
                   "k_ms": r["kernel_ms"], "gpu_time": gpu_time(r)}
        print(f"# solo {k}: {r['rate']:.2f}/s, device utilisation {r['device_util']:.3f}, GPU time "
              f"{gpu_time(r):.3f}, SM clock {r['clock_mhz']:.0f} MHz, power {r['power_w']:.0f} W, "
              f"gaps {r['gap_ms']}", flush=True)
    return refs


def save(name, data):
    with open(os.path.join(S.OUT, name), "w") as f:
        json.dump(data, f, indent=1, default=str)


def staggered(sec, sizes, solo, secs=24):
    """A 30 % container runs 0-24 s; a 60 % one joins at 6 s and leaves at
    18 s. The first must hold 0.30 in every phase, and be back at its limit
    within 2 s of the second leaving."""
    k = "mem-1ms"
    res = run_case("staggered", k, [(30, 0, secs), (60, 6, 12)], sizes)
    a, b = res
    rate = solo[k]["rate"]
    wa = [c / rate for c in a["per_sec"]]
    wb = [c / rate for c in b["per_sec"]]
    settle = [i for i in range(3, secs) if not (6 <= i < 8 or 18 <= i < 20)]
    worst_a = max(abs(wa[i] - 0.30) for i in settle if i < len(wa))
    back = max(abs(wa[i] - 0.30) for i in (20, 21, 22, 23) if i < len(wa))
    fb = b["rate"] / rate
    worst_b = max((abs(w - 0.60) for w in wb[3:]), default=1.0)
    ok = a["rc"] == 0 and b["rc"] == 0 and abs(a["rate"] / rate - 0.30) <= 0.03 and worst_a <= 0.08
    S.record(sec, f"staggered {k}: 30% over 24 s with a 60% neighbour from 6 to 18 s: fraction; worst window "
                  "(outside 2 s after each change); worst window 20-24 s",
             f"{a['rate'] / rate:.3f}; {worst_a:.3f}; {back:.3f}", "0.30 +-0.03; <= 0.08; <= 0.08",
             ok and back <= 0.08)
    S.record(sec, f"staggered {k}: the 60% neighbour over its 12 s: fraction; worst window after 3 s",
             f"{fb:.3f}; {worst_b:.3f}", "0.60 +-0.03; <= 0.08",
             b["rc"] == 0 and abs(fb - 0.60) <= 0.03 and worst_b <= 0.08)
    print("# staggered per-second A: " + ",".join(f"{w:.2f}" for w in wa), flush=True)
    print("# staggered per-second B: " + ",".join(f"{w:.2f}" for w in wb), flush=True)
    return res


def neighbours(scen):
    """Issue 9's table: containers side by side on one GPU, each its own
    region and SM limit, against the limits; then the same beside an
    unlimited neighbour, and containers that come and go."""
    global S
    S = scen
    sec = "neighbours"
    sizes = calibrated_sizes()
    kinds = ["mem-0.05ms", "mem-1ms", "mem-10ms", "gemm"]
    only = os.environ.get("NEIGHBOURS_ONLY")
    if only:  # solo rates of the kinds the chosen cases use only
        wanted = only.split(",")
        kinds = [k for k in kinds if any(w.endswith("/" + k) for w in wanted)
                 or (k == "mem-1ms" and "staggered" in wanted)]
    solo = solo_rates(sizes, kinds)
    secs = int(os.environ.get("NEIGHBOURS_SECS", "20"))
    data = {"sizes": sizes, "solo": solo, "cases": []}
    plan = [("30+60", k, [30, 60]) for k in kinds]
    plan += [("50+50", "mem-1ms", [50, 50]), ("10+20+30+40", "mem-1ms", [10, 20, 30, 40]),
             ("25x4", "mem-1ms", [25, 25, 25, 25]), ("50+50", "gemm", [50, 50])]
    plan += [("30+unlimited", k, [30, None]) for k in ("mem-0.05ms", "mem-1ms", "gemm")]
    # Three in turns, one of them taking the rest (10 %): placed from the
    # board (limiter/tiling.rs) with a rest among them.
    plan += [("30+60+unlimited", "mem-1ms", [30, 60, None])]
    # On request only: one GEMM container alone at 60 %, to compare its
    # clock and throughput with the same limit beside a neighbour.
    plan += [("alone", "gemm", [60])] if only and "alone/gemm" in only.split(",") else []
    for case, k, limits in plan:
        if only and f"{case}/{k}" not in only.split(","):
            continue
        res = run_case(case, k, [(lim, 0, secs) for lim in limits], sizes)
        judge(sec, case, k, res, solo[k])
        data["cases"].append({"case": case, "kind": k, "results": res})
        save("neighbours.json", data)
    if not only or "staggered" in only:
        data["cases"].append({"case": "staggered", "kind": "mem-1ms", "results": staggered(sec, sizes, solo)})
        save("neighbours.json", data)


def mechanism(scen):
    """What happens to throughput, event timings and NVML when contexts
    time-slice (issue 9's point 5): unlimited pairs without vgpu, then
    limited containers with the controller's steps in the debug log."""
    global S
    S = scen
    sec = "mechanism"
    sizes = calibrated_sizes()
    solo = solo_rates(sizes, ["mem-0.05ms", "mem-1ms", "mem-10ms", "gemm"])
    data = {"sizes": sizes, "solo": solo, "cases": []}
    secs = 12
    experiments = [
        ("unlimited pair, no vgpu", k, [(None, 0, secs), (None, 0, secs)], False, None)
        for k in ("mem-1ms", "mem-10ms", "mem-0.05ms")
    ]
    experiments += [
        ("30+60", "mem-1ms", [(30, 0, secs), (60, 0, secs)], True, None),
        ("30+unl", "mem-1ms", [(30, 0, secs), (None, 0, secs)], True, None),
    ]
    for case, k, members, preload, extra in experiments:
        res = run_case(case.replace(" ", "_"), k, members, sizes, preload, extra)
        line = []
        for r in res:
            frac = r["rate"] / solo[k]["rate"]
            line.append(f"{r['limit'] or 'unl'}: frac {frac:.3f} nvml {r['nvml']:.3f} region_util "
                        f"{r['region_util']:.3f} scale {r['scale']:.2f} gaps p10/p50/p90 "
                        f"{r['gap_ms'].get('p10', 0):.3f}/{r['gap_ms'].get('p50', 0):.3f}/"
                        f"{r['gap_ms'].get('p90', 0):.3f} max {r['gap_ms'].get('max', 0):.3f}")
        S.record(sec, f"{case} {k}", " | ".join(line), "(measurement)", all(r["rc"] == 0 for r in res))
        data["cases"].append({"case": case, "kind": k, "results": res})
        save("mechanism.json", data)


def nvml_raw(scen):
    """Raw NVML per-process samples (every 20 ms, lastSeen 0) while one
    unlimited process runs 0-16 s and a host-paced one 4-12 s; then vgpu's
    own timing samples beside an unlimited neighbour (trace log)."""
    global S
    S = scen
    import pynvml

    sizes = calibrated_sizes()
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    go = os.path.join(tempfile.mkdtemp(prefix="vgpu-go-"), "go")
    members = [("unl", 0, 16, {}), ("paced", 4, 8, {"WORK_PACE_MS": "7", "WORK_SYNC_EVERY": "3"})]
    procs = []
    for name, off, secs, env in members:
        procs.append(S.spawn(worker_cmd("mem", sizes["mem_1"], secs, go, off), S.make_env(False, env),
                             f"raw-{name}"))
    for p in procs:
        S.wait_line(p, "ready=", 120)
    t_go = time.time() + 0.5
    with open(go, "w") as f:
        f.write(repr(t_go))
    raw, dev = [], []
    while time.time() < t_go + 17:
        t = time.time()
        try:
            for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0):
                raw.append((t - t_go, s.pid, s.timeStamp / 1e6 - t_go, s.smUtil))
        except pynvml.NVMLError as e:
            raw.append((t - t_go, -1, 0, str(e)))
        try:
            kind, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
            for s in samples:
                dev.append((s.timeStamp / 1e6 - t_go, s.sampleValue.uiVal))
        except pynvml.NVMLError:
            pass
        time.sleep(0.02)
    out = {"pids": [p.pid for p in procs], "workers": []}
    for p in procs:
        o, _ = p.communicate(timeout=60)
        out["workers"].append(S.kv(o))
    out["raw"] = sorted(set(raw))
    out["device"] = sorted(set(dev))
    save("nvml_raw.json", out)
    print(f"# raw samples {len(out['raw'])}, device samples {len(out['device'])}", flush=True)
    trace = {"LIBCUDA_LOG_LEVEL": "5"}
    for k in ("mem-10ms", "mem-1ms"):
        res = run_case("trace30unl", k, [(30, 0, 10), (None, 0, 10)], sizes, True, trace)
        print(f"# trace {k}: " + ", ".join(f"{r['limit']}: {r['rate']:.2f}" for r in res), flush=True)
