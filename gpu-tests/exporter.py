"""`vgpuctl serve` on a node of two containers (issue 11): run by
scenarios.py's `exporter` section.

Two containers, each with its own region under a temp
`containers/{podUID}_{name}/` tree as HAMi's device plugin makes it:
`busy` (8 GiB, SM limit 40 %) runs bf16 GEMMs back to back holding 2 GiB;
`idle` (6 GiB) holds 3 GiB, and a second process of it asks 8 GiB (one OOM
denial). `vgpuctl serve --root TREE` is started, scraped with urllib, and
its figures are compared with NVML's, read in a child process at the same
moment: per-container and per-process memory against
nvmlDeviceGetComputeRunningProcesses, the host family against
nvmlDeviceGetMemoryInfo, utilisation against
nvmlDeviceGetProcessUtilization. On the simulator (--sim) the containers
are cuclient processes and NVML is the simulator's.
"""
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request

S = None  # the scenarios module (record, make_env, spawn, ...)

NVML_PROBE = r"""
import json, sys, time
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {"used": pynvml.nvmlDeviceGetMemoryInfo(h).used, "procs": {}, "sm": {}}
try:
    out["gpu_util"] = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
except pynvml.NVMLError:
    out["gpu_util"] = None
for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
    out["procs"][str(p.pid)] = p.usedGpuMemory or 0
# Per-process SM utilisation over the last 2 s, sampled 4 times.
seen = {}
since = int((time.time() - 2) * 1e6)
for _ in range(4):
    try:
        for s in pynvml.nvmlDeviceGetProcessUtilization(h, since):
            seen.setdefault(str(s.pid), []).append(s.smUtil)
    except pynvml.NVMLError:
        pass
    time.sleep(0.5)
out["sm"] = {pid: sum(v) / len(v) for pid, v in seen.items()}
print(json.dumps(out))
"""

LINE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """The samples of an exposition: [(name, {label: value}, float)]."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if m:
            out.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def value(samples, name, **labels):
    """The value of the one series `name` whose labels include `labels`, or None."""
    got = [v for n, l, v in samples if n == name and all(l.get(k) == w for k, w in labels.items())]
    return got[0] if len(got) == 1 else None


def nvml_now():
    rc, out, err = S.run([S.PY, "-c", NVML_PROBE], S.base_env(), 60, "exporter-nvml")
    return json.loads(out) if rc == 0 and out.strip() else None


def near(a, b, abs_tol, rel_tol=0.03):
    return a is not None and b is not None and abs(a - b) <= max(abs_tol, rel_tol * max(abs(a), abs(b)))


def exporter(scen):
    global S
    S = scen
    sec = "exporter"
    MIB, GIB = S.MIB, S.GIB
    root = tempfile.mkdtemp(prefix="vgpu-node-")
    regions = {}
    for uid, name in (("pod-a-uid", "busy"), ("pod-b-uid", "idle")):
        d = os.path.join(root, "containers", f"{uid}_{name}")
        os.makedirs(d)
        regions[name] = os.path.join(d, "usage.cache")
    limits = {"busy": {"CUDA_DEVICE_MEMORY_LIMIT": "8g", "CUDA_DEVICE_SM_LIMIT": "40"},
              "idle": {"CUDA_DEVICE_MEMORY_LIMIT": "6g"}}
    secs = 40
    if S.SIM:
        cmds = {"busy": [S.client(), "spin", "1000000", "132", str(secs), "kernel"],
                "idle": [S.client(), "hold", str(3 * GIB), str(secs)]}
        ready = {"busy": None, "idle": "hold_rc=0"}
        oom = [S.client(), "alloc", "buffer", str(8 * GIB)]
    else:
        cmds = {"busy": [S.PY, S.PROBE, "busy", "2", str(secs)],
                "idle": [S.PY, S.PROBE, "hold", "3", str(secs)]}
        ready = {"busy": "holding", "idle": "holding"}
        oom = [S.PY, S.PROBE, "second", "8"]
    procs = {n: S.spawn(cmds[n], S.make_env(True, limits[n], regions[n]), f"exporter-{n}") for n in cmds}
    serve = None
    try:
        for n, prefix in ready.items():
            if prefix and S.wait_line(procs[n], prefix, 120) is None:
                S.record(sec, f"{n} container started", "no", "yes", False)
                return
        # One denial in the idle container: a process asking more than is left.
        rc, out, err = S.run(oom, S.make_env(True, limits["idle"], regions["idle"]), 120, "exporter-oom")
        denied = "alloc_rc=2" in out if S.SIM else "result=OutOfMemoryError" in out
        S.record(sec, "a process of the idle container asks 8 GiB", "refused" if denied else out.strip()[-60:],
                 "refused (OOM)", denied)
        serve = subprocess.Popen([S.CTL, "serve", "--root", root, "--listen", "127.0.0.1:0", "--rescan", "1"],
                                 env=S.base_env(), stdout=subprocess.PIPE, stderr=open(S.log_path("serve"), "w"),
                                 text=True)
        line = serve.stdout.readline()
        m = re.search(r"http://\S+/metrics", line)
        if not m:
            S.record(sec, "vgpuctl serve starts and names its address", line.strip()[:60], "http://.../metrics", False)
            return
        url = m.group(0)
        time.sleep(8)  # utilisation settles (the leader's 2 s average, NVML's samples)
        t = time.time()
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        scrape_ms = (time.time() - t) * 1e3
        nv = nvml_now()
        with open(os.path.join(S.OUT, "exporter-scrape.txt"), "w") as f:
            f.write(text)
        S.run([S.CTL, "status", "--root", root], S.base_env(), 10, "exporter-status-table")
        samples = parse(text)
        judge(sec, samples, nv, procs, scrape_ms)
    finally:
        if serve:
            serve.kill()
            serve.wait()
        for p in procs.values():
            S.stop(p)


def judge(sec, samples, nv, procs, scrape_ms):
    MIB, GIB = S.MIB, S.GIB
    rec = S.record
    regions = value(samples, "vgpu_exporter_regions")
    rec(sec, "regions read / unreadable in one scrape (ms)",
        f"{regions} / {value(samples, 'vgpu_exporter_unreadable_regions')} ({scrape_ms:.1f} ms)", "2 / 0 (< 50 ms)",
        regions == 2 and value(samples, "vgpu_exporter_unreadable_regions") == 0 and scrape_ms < 50)
    if nv is None:
        rec(sec, "NVML read in a child process", "failed", "read", False)
        return
    c = {"busy": dict(pod="pod-a-uid", container="busy", zone="vGPU"),
         "idle": dict(pod="pod-b-uid", container="idle", zone="vGPU")}
    lim = {n: value(samples, "hami_vgpu_memory_limit_bytes", **c[n]) for n in c}
    rec(sec, "hami_vgpu_memory_limit_bytes busy / idle (GiB)",
        f"{(lim['busy'] or 0) / GIB:.2f} / {(lim['idle'] or 0) / GIB:.2f}", "8.00 / 6.00",
        lim["busy"] == 8 * GIB and lim["idle"] == 6 * GIB)
    for n in c:
        pid = str(procs[n].pid)
        used = value(samples, "hami_vgpu_memory_used_bytes", **c[n])
        same = value(samples, "hami_container_device_memory_bytes", **c[n])
        nvml = nv["procs"].get(pid)
        rec(sec, f"{n}: hami_vgpu_memory_used_bytes vs NVML's usedGpuMemory of its process (MiB)",
            f"{(used or 0) / MIB:.0f} vs {(nvml or 0) / MIB:.0f}", "within 64 MiB or 3 %",
            near(used, nvml, 64 * MIB) and used == same)
        proc = value(samples, "vgpu_process_memory_used_bytes", pid=pid, **c[n])
        ctx = value(samples, "vgpu_process_context_bytes", pid=pid, **c[n])
        parts = [value(samples, f"hami_vgpu_memory_{k}_bytes", **c[n]) for k in ("context", "module", "buffer")]
        # A PyTorch context is about 0.5 GiB (GPU-MACHINE.md); the simulator's is what it is set to.
        ctx_ok = ctx is not None and (S.SIM or 300 * MIB <= ctx <= 800 * MIB)
        rec(sec, f"{n}: its process's memory (NVML's) and context estimate; context + module + buffer = used (MiB)",
            f"{(proc or 0) / MIB:.0f} ({(nvml or 0) / MIB:.0f}), {(ctx or 0) / MIB:.0f}; "
            f"{sum(p or 0 for p in parts) / MIB:.0f}",
            "within 64 MiB or 3 %, 300-800; = used",
            near(proc, nvml, 64 * MIB) and ctx_ok and None not in parts and sum(parts) == used)
    host = [v for name, l, v in samples if name == "hami_host_gpu_memory_used_bytes" and l.get("device_index") == "0"]
    rec(sec, "hami_host_gpu_memory_used_bytes vs nvmlDeviceGetMemoryInfo.used (MiB)",
        f"{host[0] / MIB:.0f} vs {nv['used'] / MIB:.0f}" if host else "absent", "within 64 MiB or 3 %",
        bool(host) and near(host[0], nv["used"], 64 * MIB))
    ub = value(samples, "hami_container_device_utilization_ratio", **c["busy"])
    ui = value(samples, "hami_container_device_utilization_ratio", **c["idle"])
    sm = nv["sm"].get(str(procs["busy"].pid))
    rec(sec, "busy (SM limit 40): hami_container_device_utilization_ratio vs NVML's per-process SM util; idle's",
        f"{ub} vs {sm if sm is None else round(sm, 1)}; {ui}", "within 15 points, 20-60; idle <= 5",
        ub is not None and sm is not None and abs(ub - sm) <= 15 and 20 <= ub <= 60 and ui is not None and ui <= 5)
    hu = [v for name, l, v in samples if name == "hami_host_gpu_utilization_ratio" and l.get("device_index") == "0"]
    rec(sec, "hami_host_gpu_utilization_ratio vs NVML's utilization.gpu", f"{hu[0] if hu else None} vs {nv['gpu_util']}",
        "present, > 0 while busy runs", bool(hu) and hu[0] > 0)
    oom = (value(samples, "vgpu_container_oom_denials_total", **c["busy"]),
           value(samples, "vgpu_container_oom_denials_total", **c["idle"]))
    rec(sec, "vgpu_container_oom_denials_total busy / idle", f"{oom[0]} / {oom[1]}", "0 / >= 1",
        oom[0] == 0 and oom[1] is not None and oom[1] >= 1)
    thr = value(samples, "vgpu_container_launches_throttled_total", **c["busy"])
    waited = value(samples, "vgpu_container_throttled_seconds_total", **c["busy"])
    scale = value(samples, "vgpu_container_bucket_scale", **c["busy"])
    rec(sec, "busy: launches throttled, seconds waited, bucket scale", f"{thr}, {waited}, {scale}",
        "> 0, > 0, present", bool(thr) and bool(waited) and scale is not None)
