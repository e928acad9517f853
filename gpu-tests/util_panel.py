"""The utilisation panel (issue 28 item 3): run by scenarios.py's
`util_panel` section.

A container keeps the GPU busy with 1 ms spin kernels over 132 blocks
(cuclient spin) under each policy and switch state; every 0.5 s the
container's utilisation is read twice, as HAMi's monitor computes it
(hami_reader's summary: the sum of sm_util over procs[0..proc_num) whose
status is not 0, as HAMi's Go monitor sums them) and as `vgpuctl status
--json` shows it (`utilization_percent`, the source of UTIL and of
hami_container_device_utilization_ratio). Checks: the two agree at every
reading, the figure is what the policy makes it (busy without a limit,
under disable and after the switch under default; about the limit under
force), and it follows busy and idle spells (never frozen).
"""
import json
import statistics
import subprocess
import threading
import time

S = None  # the scenarios module (record, make_env, spawn, ...)


def hami_sum(reader, region):
    out = subprocess.run([reader, region, "watch", "0", "1"], capture_output=True, text=True).stdout
    v = S.kv(out).get("dev0.sm_util")
    return int(v) if v is not None else None


def ctl_util(region):
    p = subprocess.run([S.CTL, "status", "--json", region], env=S.base_env(), capture_output=True, text=True,
                       timeout=10)
    if p.returncode != 0:
        return None
    devs = json.loads(p.stdout)["regions"][0]["devices"]
    return devs[0]["utilization_percent"] if devs else None


def readings(reader, region, secs):
    """(HAMi's sum, vgpuctl's) pairs, each read between two equal HAMi sums."""
    out, end = [], time.time() + secs
    while time.time() < end:
        for _ in range(10):
            a = hami_sum(reader, region)
            c = ctl_util(region)
            b = hami_sum(reader, region)
            if a is not None and a == b and c is not None:
                out.append((a, c))
                break
        time.sleep(0.5)
    return out


def case(reader, name, env, switch_off_at, secs, lo, hi):
    sec = "util_panel"
    region = S.new_region()
    p = S.spawn([S.client("link"), "spin", "1000000", "132", str(secs)], S.make_env(True, env, region),
                f"util-{name}")
    t0 = time.time()
    time.sleep(3)
    if switch_off_at is not None:
        time.sleep(max(0, switch_off_at - (time.time() - t0)))
        S.run([reader, region, "set", "utilization_switch", "0"], S.base_env(), 10, f"util-{name}-switch")
        time.sleep(2)
    got = readings(reader, region, 4)
    p.wait(timeout=secs + 60)
    agree = bool(got) and all(float(h) == c for h, c in got)
    med = statistics.median(c for _, c in got) if got else float("nan")
    S.record(sec, f"{name}: vgpuctl equals HAMi's sum at every reading (pairs)",
             f"{sum(float(h) == c for h, c in got)}/{len(got)}", "all", agree)
    S.record(sec, f"{name}: median utilisation (%)", f"{med:.1f}", f"{lo}-{hi}", lo <= med <= hi)


def spells(reader):
    """Bursts of 2000 1 ms kernels with 4 s idle between, the process alive,
    after the switch turned limiting off under the default policy."""
    sec = "util_panel"
    region = S.new_region()
    p = S.spawn([S.client("link"), "bursts", "1048576", "0", "1", "2000", "4", "4"],
                S.make_env(True, {"CUDA_DEVICE_SM_LIMIT": "20"}, region), "util-spells")
    S.wait_line(p, "started", 60)
    S.run([reader, region, "set", "utilization_switch", "0"], S.base_env(), 10, "util-spells-switch")
    got = readings(reader, region, 14)
    threading.Thread(target=p.wait, daemon=True).start()
    agree = bool(got) and all(float(h) == c for h, c in got)
    first_high = next((i for i, (_, c) in enumerate(got) if c >= 50), None)
    idle_after = first_high is not None and any(c <= 5 for _, c in got[first_high:])
    S.record(sec, "busy/idle spells after the switch: vgpuctl equals HAMi's sum (pairs)",
             f"{sum(float(h) == c for h, c in got)}/{len(got)}", "all", agree)
    S.record(sec, "busy/idle spells: the figure rose to >= 50 and fell to <= 5 after",
             " ".join(f"{c:.0f}" for _, c in got), "high then low", idle_after)
    S.stop(p)


def util_panel(scenarios):
    global S
    S = scenarios
    reader = S.hami_reader()
    case(reader, "no SM limit", {}, None, 10, 80, 100)
    case(reader, "SM limit 20, default, switch=0", {"CUDA_DEVICE_SM_LIMIT": "20"}, 4, 13, 60, 100)
    case(reader, "SM limit 20, force, switch=0", {"CUDA_DEVICE_SM_LIMIT": "20", "GPU_CORE_UTILIZATION_POLICY": "force"},
         4, 13, 10, 35)
    case(reader, "SM limit 20, disable", {"CUDA_DEVICE_SM_LIMIT": "20", "GPU_CORE_UTILIZATION_POLICY": "disable"},
         None, 10, 80, 100)
    spells(reader)
