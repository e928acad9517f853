"""Issue 29: step latency under an SM limit (gpu-tests section `latency`).

An inference-like loop runs one step at a time, synchronised: a spin
kernel of 0.1, 1 or 10 ms of GPU work (`cuclient steps`), and on a GPU
also a small PyTorch model replayed as a CUDA graph, serving fixed-size
requests (`latency_torch.py`). Each case prints p50, p99 and max of the
step latency next to native. The ideal paced step is the native step plus
the wait its share adds (work / share - work); the goal is p99 <= 2x that.

A server runs too, open loop: 1 ms requests arriving at random (`cuclient
serve`), their response times against a GPU serving each in its paced
length on the same arrivals.

Cases: native; SM 30 alone; SM 30 beside a busy 60 % container; 10, 50
and 90 % alone; SM 30 beside an unlimited process (a plain one, without
vgpu: for the record, each step waits out its time slice); SM 10, 50 and
90 beside a busy 60, 40 and 10 % container, and beside an unlimited
process (`LATENCY_MATRIX`); SM 10, 30, 50 and 90 beside a busy container
without a limit, with vgpu (it takes the rest; `LATENCY_REST_ONLY=1`
runs native and these alone, `LATENCY_REST_LIMITS` picks their limits
and `LATENCY_STEPS` (ns, say 100000) the step sizes of every case;
`LATENCY_BESIDE_ONLY=1` runs native and the cases beside a busy limited
container alone, `=30/60,50/40` the pairs named); then
the period's
trade beside a neighbour (`VGPU_SM_PERIOD_MS` 100, 20, 10 on both
containers: p99 of 1 ms steps at 30 % against what the two get together,
and whether two 50 % containers still find their turns). About 8 minutes. `VGPU_SM_PERIOD_MS` in the environment applies to
every case but the trade; `LATENCY_LOG_LEVEL` (say 4) sets the limited
container's log level (and its neighbour's) in every case but the trade
(the PyTorch rows log at 4 where it is not set). `LATENCY_PERIODS` (say `50,100`) picks the
trade's periods; `LATENCY_TRADE_ONLY=1` runs the native 1 ms steps and
the trade alone, `LATENCY_TWO_GPUS_ONLY=1` one container on two GPUs
(where the machine has two; its periods are each GPU's own), `LATENCY_TORCH_ONLY=1` the PyTorch rows
alone, `LATENCY_SERVE_ONLY=1` the server's rows (open loop: requests
arriving at random) alone, `LATENCY_MATRIX=0` leaves out the limits 10, 50 and 90 beside
neighbours (about 2.5 minutes of the 8). `LATENCY_SECS` (4) sets the
seconds each case measures: a container sent to turns 1.3 s after it
starts may spend its first 0.2-0.7 s of them time-slicing while its
window settles (docs/limits.md), which is over 1 % of 4 s of 0.1 ms steps.
"""
import os

# Each case's measured seconds, after a warm-up (the issue's own figures
# were of 10 s runs; 4 keeps the section within one device call).
SECS = float(os.environ.get("LATENCY_SECS", "4"))
WARM = 1.5
# The trade's periods (ms): the default, and the short ones a latency-
# sensitive container might set.
PERIODS = tuple(int(p) for p in os.environ.get("LATENCY_PERIODS", "100,20,10").split(","))
HALVES_SECS = 10
STEPS = [int(x) for x in os.environ.get("LATENCY_STEPS", "100000,1000000,10000000").split(",")]
TORCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "latency_torch.py")


def steps(s, cmd, env, name, keys=("p50_ms", "p99_ms", "max_ms", "steps_per_s", "gpu_ms")):
    rc, out, _ = s.run(cmd, env, SECS + WARM + 120, name)
    r = s.kv(out)
    return rc, {k: float(r.get(k, "nan")) for k in keys}


def neighbour(s, kind, secs, period=None):
    """A busy neighbour in its own container: 1 ms spin kernels back to
    back, at `kind` percent ("60"), or without a limit: "rest", with vgpu
    (it takes what the limits leave, limiter/rest.rs), or "free", a plain
    process without vgpu."""
    limited = kind != "free"
    extra = {"CUDA_DEVICE_SM_LIMIT": kind} if kind not in ("free", "rest") else None
    if period:
        extra = dict(extra or {}, VGPU_SM_PERIOD_MS=str(period))
    if os.environ.get("LATENCY_LOG_LEVEL"):
        extra = dict(extra or {}, LIBCUDA_LOG_LEVEL=os.environ["LATENCY_LOG_LEVEL"])
    p = s.spawn([s.client(), "spin", "1000000", "132", str(secs)], s.make_env(limited, extra, s.new_region()),
                f"latency-neighbour-{kind}")
    return p


def case(s, sec, label, limit, beside, cmd_of, native, unit):
    """One row per step size: p50, p99, max against native and the ideal."""
    for key, cmd in cmd_of:
        n = neighbour(s, beside, SECS + WARM + 4) if beside else None
        if n:
            s.time.sleep(1.0)  # the neighbour is up and busy
        extra = {"CUDA_DEVICE_SM_LIMIT": str(limit)}
        if os.environ.get("LATENCY_LOG_LEVEL"):  # the limiter's decisions, in the case's log
            extra["LIBCUDA_LOG_LEVEL"] = os.environ["LATENCY_LOG_LEVEL"]
        env = s.make_env(True, extra, s.new_region())
        rc, r = steps(s, cmd, env, f"latency-{label}-{key}")
        if n:
            s.stop(n)
        base = native[key]
        # The GPU work of a step: the spin kernel's, or (PyTorch) what
        # its kernels took queued back to back, without the host's gaps
        # (the limit is a share of GPU time, not of steps).
        work_ms = key / 1e6 if isinstance(key, int) else base["gpu_ms"]
        # Ideal: the native step plus the wait its share must add.
        ideal = base["p50_ms"] + work_ms * (100 / limit - 1)
        work = work_ms * r["steps_per_s"] / 1000  # share of the GPU's time the steps held
        # A plain process without vgpu is out of the limits' reach: each
        # step beside it waits out its time slice (2.4-2.5 ms). Its rows
        # are for the record.
        ok = rc == 0 and (r["p99_ms"] <= 2 * ideal or beside == "free")
        # (A loop whose host part is long holds less than the limit even
        # unlimited: 0.1 ms steps of 0.17 ms hold 0.6 of the GPU.)
        want = min(limit / 100, work_ms / base["p50_ms"])
        # Beside a neighbour the share is for the record: steps paced side
        # by side wait for the neighbour's kernels, and a loop short of
        # its share that way asks for turns (limiter/pacing.rs).
        record_share = f"; share {work:.3f}"
        if not beside:
            ok = ok and abs(work - want) <= 0.03 + (0.02 if key == STEPS[-1] else 0)
        s.record(sec, f"{label}, {unit(key)} steps: p50, p99, max ms (native {base['p50_ms']:.3f}, "
                      f"{base['p99_ms']:.3f}, {base['max_ms']:.3f}) ; share",
                 f"{r['p50_ms']:.3f}, {r['p99_ms']:.3f}, {r['max_ms']:.3f}{record_share}",
                 f"p99 <= {2 * ideal:.2f} (2x ideal {ideal:.2f})" + ("" if beside else f"; {want:.2f} +-0.03")
                 + (" (for the record: no vgpu)" if beside == "free" else ""),
                 ok)


# Requests a second: half of what a 30 % share serves, and near all of it.
SERVE_RATES = (150, 250)


def serve_cases(s, sec):
    """A server, open loop: 1 ms requests arriving at random (Poisson, 150
    and 250 a second, the same arrivals in every case of a rate), served one at a time, at
    SM 30 alone and beside a busy 60 % container, next to native. A
    request's response time runs from its arrival to its completion. The
    ideal is a GPU that serves each request in its paced length (native
    plus 1 ms x (100 / 30 - 1)), on the same arrivals, first come first
    served; p99 <= 2x that ideal's p99. This is where the wait at the
    synchronisation (limiter/settle.rs) must not hold a response for a
    request that has not come."""
    def serve(env, name, rate, service_us):
        cmd = [s.client(), "serve", "1000000", "132", f"{SECS:g}", str(WARM), str(rate), f"{service_us:.0f}"]
        return steps(s, cmd, env, name, ("p50_ms", "p99_ms", "max_ms", "requests_per_s", "ideal_p50_ms",
                                          "ideal_p99_ms"))

    for rate in SERVE_RATES:
        what = f"a server of 1 ms requests at {rate}/s"
        rc, native = serve(s.make_env(False), f"latency-serve-native-{rate}", rate, 1000)
        s.record(sec, f"native, {what}: p50, p99, max ms",
                 f"{native['p50_ms']:.3f}, {native['p99_ms']:.3f}, {native['max_ms']:.3f}", "-", rc == 0)
        service_ms = native["p50_ms"] + 1.0 * (100 / 30 - 1)
        for label, beside in (("SM 30 alone", None), ("SM 30 beside a busy 60% container", "60")):
            n = neighbour(s, beside, SECS + WARM + 4) if beside else None
            if n:
                s.time.sleep(1.0)
            extra = {"CUDA_DEVICE_SM_LIMIT": "30"}
            if os.environ.get("LATENCY_LOG_LEVEL"):  # the limiter's decisions, in the case's log
                extra["LIBCUDA_LOG_LEVEL"] = os.environ["LATENCY_LOG_LEVEL"]
            rc, r = serve(s.make_env(True, extra, s.new_region()),
                          f"latency-serve-{label}-{rate}", rate, service_ms * 1000)
            if n:
                s.stop(n)
            ok = rc == 0 and r["p99_ms"] <= 2 * r["ideal_p99_ms"]
            # Alone, the bucket's burst serves a request that finds it
            # idle at the GPU's speed: a response held for the next
            # request's pace (settle waiting at a server's synchronisation)
            # would show here, not against the ideal's p99.
            fast = f"; alone p50 <= {1.5 * native['p50_ms']:.2f}" if not beside else ""
            if not beside:
                ok = ok and r["p50_ms"] <= 1.5 * native["p50_ms"]
            s.record(sec, f"{label}, {what}: p50, p99, max ms (native {native['p50_ms']:.3f}, "
                          f"{native['p99_ms']:.3f}); arrived a second, each served",
                     f"{r['p50_ms']:.3f}, {r['p99_ms']:.3f}, {r['max_ms']:.3f}; {r['requests_per_s']:.1f}",
                     f"p99 <= {2 * r['ideal_p99_ms']:.2f} (2x a GPU serving each in {service_ms:.2f} ms: p50 "
                     f"{r['ideal_p50_ms']:.2f}, p99 {r['ideal_p99_ms']:.2f}){fast}", ok)


def trade(s, sec, native):
    """The period beside a neighbour: shorter windows wait less, and
    switch contexts more often (each turn costs one switch, about 0.15 ms
    on an H100). At each period: 1 ms steps at 30 % beside a busy 60 %
    container (p99 and both shares), then two busy 50 % containers (what
    they get together: limits that fill the GPU must still find their
    turns, >= 0.95 with the period the default)."""
    _, free, _ = s.spin(1_000_000, 5, None, s.new_region(), name="latency-spin-free")
    for period in PERIODS:
        n = neighbour(s, "60", SECS + WARM + 4, period)
        s.time.sleep(1.0)
        env = s.make_env(True, {"CUDA_DEVICE_SM_LIMIT": "30", "VGPU_SM_PERIOD_MS": str(period)}, s.new_region())
        rc, r = steps(s, [s.client(), "steps", "1000000", "132", f"{SECS:g}", str(WARM)], env,
                      f"latency-period-{period}")
        out, _ = n.communicate(timeout=120)
        rate = float(s.kv(out).get("rate", "nan"))
        mine = r["steps_per_s"] / 1000  # 1 ms of GPU work a step
        theirs = rate / free
        ideal = native["p50_ms"] + 1.0 * (1 / 0.3 - 1)
        ok = rc == 0 and abs(mine - 0.30) <= 0.03 and abs(theirs - 0.60) <= 0.03
        s.record(sec, f"period {period} ms, 1 ms steps at 30% beside a busy 60% container: p50, p99 ms; "
                      f"shares 30 + 60",
                 f"{r['p50_ms']:.2f}, {r['p99_ms']:.2f}; {mine:.3f} + {theirs:.3f} = {mine + theirs:.3f}",
                 f"p99 <= {2 * ideal:.2f} (for the record); shares +-0.03", ok)
        halves = [s.spawn([s.client(), "spin", "1000000", "132", str(HALVES_SECS)],
                          s.make_env(True, {"CUDA_DEVICE_SM_LIMIT": "50", "VGPU_SM_PERIOD_MS": str(period)},
                                     s.new_region()), f"latency-period-{period}-half-{i}") for i in range(2)]
        got = []
        for p in halves:
            out, _ = p.communicate(timeout=HALVES_SECS + 120)
            per_sec = [float(x) for x in s.kv(out).get("per_sec", "").split(",") if x]
            # (From the fourth second: the turns settle first.)
            got.append(sum(per_sec[3:]) / max(len(per_sec[3:]), 1) / free)
        s.record(sec, f"period {period} ms, two busy 50% containers: shares, together",
                 f"{got[0]:.3f} + {got[1]:.3f} = {got[0] + got[1]:.3f}", ">= 0.95 together; each 0.50 +-0.03",
                 got[0] + got[1] >= 0.95 and all(abs(g - 0.5) <= 0.03 for g in got))


def latency(s):
    sec = "latency"
    spin = [(ns, [s.client(), "steps", str(ns), "132", f"{SECS:g}", str(WARM)]) for ns in STEPS]
    if os.environ.get("LATENCY_TRADE_ONLY") == "1":
        spin = [(ns, cmd) for ns, cmd in spin if ns == 1_000_000]
    two_gpus_only = os.environ.get("LATENCY_TWO_GPUS_ONLY") == "1"
    if two_gpus_only:
        spin = [(ns, cmd) for ns, cmd in spin if ns in (1_000_000, 10_000_000)]
    if os.environ.get("LATENCY_SERVE_ONLY") == "1":
        serve_cases(s, sec)
        return
    torch_only = os.environ.get("LATENCY_TORCH_ONLY") == "1"
    if torch_only:
        spin = []
    ms = lambda ns: f"{ns / 1e6:g} ms"  # noqa: E731
    native = {}
    for ns, cmd in spin:
        rc, r = steps(s, cmd, s.make_env(False), f"latency-native-{ns}")
        native[ns] = r
        s.record(sec, f"native, {ms(ns)} steps: p50, p99, max ms", f"{r['p50_ms']:.3f}, {r['p99_ms']:.3f}, "
                 f"{r['max_ms']:.3f}", "-", rc == 0)
    if os.environ.get("LATENCY_TRADE_ONLY") == "1":
        trade(s, sec, native[1_000_000])
        return
    if two_gpus_only:
        if all(ns in native for ns in (1_000_000, 10_000_000)):
            two_gpus_case(s, sec, native)
        else:
            s.record(sec, "one container on two GPUs: native 1 and 10 ms steps measured", "no", "LATENCY_STEPS "
                     "holding 1000000 and 10000000", False)
        return
    if not torch_only:
        spin_cases(s, sec, spin, native, ms)
    if s.SIM or os.environ.get("LATENCY_REST_ONLY") == "1" or os.environ.get("LATENCY_BESIDE_ONLY"):
        return
    if not torch_only:
        serve_cases(s, sec)
    torch_case(s, sec)


def rest_cases(s, sec, spin, native, ms):
    """Beside a busy container without an SM limit, with vgpu: it takes
    what the limits leave (60 % beside 30 %), so the limited steps are
    paced or take turns as beside a limited one."""
    limits = [int(x) for x in os.environ.get("LATENCY_REST_LIMITS", "10,30,50,90").split(",")]
    for lim in limits:
        case(s, sec, f"SM {lim} beside a busy container without a limit", lim, "rest", spin, native, ms)


def beside_limited_cases(s, sec, spin, native, ms):
    """Beside a busy limited container: 30 % beside 60, and the matrix's
    10 / 60, 50 / 40, 90 / 10 (`LATENCY_BESIDE_ONLY=30/60,50/40` picks)."""
    pick = os.environ.get("LATENCY_BESIDE_ONLY", "1")
    pairs = ((30, 60), (10, 60), (50, 40), (90, 10)) if pick == "1" else \
        tuple(tuple(int(x) for x in pair.split("/")) for pair in pick.split(","))
    for lim, other in pairs:
        case(s, sec, f"SM {lim} beside a busy {other}% container", lim, str(other), spin, native, ms)


def spin_cases(s, sec, spin, native, ms):
    if os.environ.get("LATENCY_REST_ONLY") == "1":
        rest_cases(s, sec, spin, native, ms)
        return
    if os.environ.get("LATENCY_BESIDE_ONLY"):
        beside_limited_cases(s, sec, spin, native, ms)
        return
    case(s, sec, "SM 30 alone", 30, None, spin, native, ms)
    case(s, sec, "SM 30 beside a busy 60% container", 30, "60", spin, native, ms)
    for lim in (10, 50, 90):
        case(s, sec, f"SM {lim} alone", lim, None, spin, native, ms)
    case(s, sec, "SM 30 beside an unlimited process", 30, "free", spin, native, ms)
    if os.environ.get("LATENCY_MATRIX", "1") == "1":
        # The rest of the matrix: other limits beside a busy
        # limited container (the two summing to 70-100 %) and beside an
        # unlimited process.
        for lim, other in ((10, 60), (50, 40), (90, 10)):
            case(s, sec, f"SM {lim} beside a busy {other}% container", lim, str(other), spin, native, ms)
        for lim in (10, 50, 90):
            case(s, sec, f"SM {lim} beside an unlimited process", lim, "free", spin, native, ms)
    rest_cases(s, sec, spin, native, ms)
    if all(ns in native for ns in (1_000_000, 10_000_000)):
        two_gpus_case(s, sec, native)
    trade(s, sec, native[1_000_000])


def two_gpus_case(s, sec, native):
    """One container on two GPUs, SM 90 on each, beside one busy 10 %
    container on both: 1 ms steps on GPU 0, whose turns lengthen for them
    (limiter/period.rs), and 10 ms steps on GPU 1, which ask for nothing
    and must stay at the configured period (placed at 130-150 ms they
    waited 27-29 ms, run 195). Each device's period is its own: each
    GPU's p99 against twice its ideal, and its period as the region shows
    it while the steps run (`LATENCY_TWO_GPUS_ONLY=1` runs this alone)."""
    what = "one container on two GPUs at 90 % beside a busy 10 % container on both"
    gpus = 0 if s.SIM or not s.shutil.which("nvidia-smi") else \
        s.subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU ")
    if gpus < 2 or os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").count(",") < 1:
        s.record(sec, f"{what}: two GPUs", f"{gpus}", "(skipped)", True)
        return
    log = {"LIBCUDA_LOG_LEVEL": os.environ["LATENCY_LOG_LEVEL"]} if os.environ.get("LATENCY_LOG_LEVEL") else {}
    theirs = s.new_region()
    others = [s.spawn([s.client(), "spin", "1000000", "132", f"{SECS + WARM + 6:g}"],
                      s.make_env(True, dict(log, CUDA_DEVICE_SM_LIMIT="10", CUCLIENT_DEVICE=str(d)), theirs),
                      f"latency-two-gpus-neighbour-{d}") for d in (0, 1)]
    s.time.sleep(1.0)
    mine = s.new_region()
    step_of = {0: 1_000_000, 1: 10_000_000}
    procs = {d: s.spawn([s.client(), "steps", str(ns), "132", f"{SECS:g}", str(WARM)],
                        s.make_env(True, dict(log, CUDA_DEVICE_SM_LIMIT="90", CUCLIENT_DEVICE=str(d)), mine),
                        f"latency-two-gpus-{d}") for d, ns in step_of.items()}
    periods = {0: [], 1: []}
    t0 = s.time.time()
    while any(p.poll() is None for p in procs.values()) and s.time.time() - t0 < SECS + WARM + 60:
        if s.time.time() - t0 >= WARM + 1:
            for dev in s.region_json(mine).get("devices", []):
                turns = dev.get("turns") or {}
                for d, p in procs.items():
                    if dev.get("leader_pid") == p.pid and turns.get("period_ms") is not None:
                        periods[d].append(turns["period_ms"])
        s.time.sleep(0.25)
    outs = {d: p.communicate(timeout=120)[0] for d, p in procs.items()}
    for p in others:
        s.stop(p)
    for d, ns in step_of.items():
        r = s.kv(outs[d])
        p99 = float(r.get("p99_ms", "nan"))
        base = native[ns]
        ideal = base["p50_ms"] + ns / 1e6 * (100 / 90 - 1)
        seen = periods[d]
        # GPU 0 lengthened once its steps asked (the later half of what
        # was seen), GPU 1 never.
        late = seen[len(seen) // 2:]
        period_ok = bool(late) and (all(x > 100 for x in late) if d == 0 else all(x == 100 for x in seen))
        want = "> 100 ms" if d == 0 else "100 ms throughout"
        s.record(sec, f"{what}: GPU {d}, {ns / 1e6:g} ms steps: p50, p99, max ms; the GPU's period (ms) as seen",
                 f"{float(r.get('p50_ms', 'nan')):.3f}, {p99:.3f}, {float(r.get('max_ms', 'nan')):.3f}; "
                 f"{sorted(set(seen))}",
                 f"p99 <= {2 * ideal:.2f} (2x ideal {ideal:.2f}); period {want}",
                 procs[d].returncode == 0 and p99 <= 2 * ideal and period_ok)


def torch_case(s, sec):
    # A real inference loop: a small model replayed as a CUDA graph,
    # fixed-size requests served one at a time.
    torch = [("torch", [s.PY, TORCH, f"{SECS:g}", str(WARM)])]
    rc, r = steps(s, torch[0][1], s.make_env(False), "latency-native-torch")
    native = {"torch": r}
    s.record(sec, "native, PyTorch CUDA-graph inference step: p50, p99, max ms",
             f"{r['p50_ms']:.3f}, {r['p99_ms']:.3f}, {r['max_ms']:.3f}", "-", rc == 0)
    name = lambda _: "PyTorch CUDA-graph inference"  # noqa: E731
    # Both containers keep their debug logs here (each case's log under
    # $OUT) unless LATENCY_LOG_LEVEL says otherwise: beside 60 % these
    # steps failed in some runs only (149, 159: p99 2.47 ms; 150: 0.116),
    # and those runs kept no log of why.
    unset = "LATENCY_LOG_LEVEL" not in os.environ
    if unset:
        os.environ["LATENCY_LOG_LEVEL"] = "4"
    try:
        case(s, sec, "SM 30 alone", 30, None, torch, native, name)
        case(s, sec, "SM 30 beside a busy 60% container", 30, "60", torch, native, name)
    finally:
        if unset:
            del os.environ["LATENCY_LOG_LEVEL"]
