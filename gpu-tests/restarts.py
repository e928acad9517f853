"""A container's restarts (issues 13 and 28): run by scenarios.py's
`restarts` section.

Chains of runs share one region under a 4 GiB limit, as a pod's restarts
do; each run is a fresh PyTorch process whose first CUDA call asks for
the big allocation once (its context is created inside that call), holds
it, then ends: exit, kill -9, or the kernel's OOM killer (a cgroup v2
child group whose memory.max is lowered to 0 once the run holds its
memory; where the machine has no such group, kill -9, and the row says
so). Two runs never fit the limit. Chains: in a pid namespace with its
own /proc (`unshare -pf --mount-proc`, as pods), in one that sees the
host's /proc (`unshare -pf`; skipped where the driver refuses cuInit
there, run 19), and in the host's namespace; each with runs of 2.5 GiB
(the next context fits beside a dead predecessor's 2.5 GiB + context)
and 3 GiB (it does not). Every other restart starts 2 s after its
predecessor's end rather than at once, so its namespace may get the dead
one's inode (the shape issue 28 found). Each restart's first allocation
must succeed within 5 s of its predecessor's end, PyTorch's own start-up
(about 3 s, and the 2 s gap) not counted: the time judged is from the
later of the predecessor's end and the allocation's call to its grant.
NVML's total for the card never passes the limit.

On the simulator (--sim) the runs are cuclient processes (`await BYTES 0
HOLD`, one attempt) under a 2 GiB limit (1.25 and 1.6 GiB runs), and the
peak is not sampled. RESTARTS_N sets the restarts per chain (5).
"""
import os
import signal
import subprocess
import threading
import time

S = None  # the scenarios module (record, make_env, client, ...)

ENDS = ["exit", "kill9", "oom", "exit", "kill9"]
CG_ROOT = "/sys/fs/cgroup"


def cgroup_ok():
    """'' when a cgroup v2 child group with memory.max can be made here,
    else why not."""
    try:
        with open(f"{CG_ROOT}/cgroup.controllers") as f:
            if "memory" not in f.read().split():
                return "no memory controller in cgroup v2"
        with open(f"{CG_ROOT}/cgroup.subtree_control") as f:
            enabled = "memory" in f.read().split()
        if not enabled:
            with open(f"{CG_ROOT}/cgroup.subtree_control", "w") as f:
                f.write("+memory")
        probe = f"{CG_ROOT}/vgpu-restarts-probe-{os.getpid()}"
        os.makedirs(probe, exist_ok=True)
        ok = os.path.exists(f"{probe}/memory.max")
        moved = subprocess.run(["sh", "-c", 'echo $$ > "$0/cgroup.procs"', probe], capture_output=True).returncode
        for _ in range(20):
            try:
                os.rmdir(probe)
                break
            except OSError:
                time.sleep(0.1)
        if not ok:
            return "a child group has no memory.max"
        return "" if moved == 0 else "a process cannot join a child group"
    except OSError as e:
        return f"no cgroup v2 child group ({e.strerror})"


def oom_kills(cg):
    try:
        with open(f"{cg}/memory.events") as f:
            return int(dict(l.split() for l in f if l.strip()).get("oom_kill", "0"))
    except (OSError, ValueError):
        return 0


def ns_inode(pids):
    """The pid namespace inode of the first of `pids` (str), or None."""
    try:
        return str(os.stat(f"/proc/{pids[0]}/ns/pid").st_ino)
    except (OSError, IndexError):
        return None


class Run:
    """One run of the container, in `ns` (a command prefix), in its own
    cgroup when `cg` is a path."""

    def __init__(self, ns, cmd, env, name, cg, pass_fds):
        self.cg = cg
        if cg:
            os.makedirs(cg, exist_ok=True)
            cmd = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cg] + ns + cmd
        else:
            cmd = ns + cmd
        self.log = open(S.log_path(name), "w")
        self.log.write(f"$ {' '.join(cmd)}\n")
        self.log.flush()
        self.p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                  pass_fds=pass_fds)
        self.ns = ns

    def line(self, prefix, timeout):
        got = S.wait_line(self.p, prefix, timeout) or ""
        self.log.write(f"# {time.time():.3f} {got}")
        self.log.flush()
        return got

    def victims(self):
        """The client: the process itself, or unshare's child."""
        return S.children(self.p.pid) if self.ns else [self.p.pid]

    def end(self, how):
        """Ends the run as `how` says; returns (when it ended, how it
        really ended)."""
        if how == "oom" and self.cg:
            try:
                with open(f"{self.cg}/memory.swap.max", "w") as f:
                    f.write("0")
            except OSError:
                pass
            try:
                with open(f"{self.cg}/memory.max", "w") as f:
                    f.write("0")
                self.p.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            if self.p.poll() is not None and oom_kills(self.cg) > 0:
                return time.time(), "oom"
            how = "oom-as-kill9"  # the OOM killer did not act: said in the row
        elif how == "oom":
            how = "oom-as-kill9"  # no memory cgroup here: said in the row
        if how in ("kill9", "oom-as-kill9"):
            for pid in self.victims() or [self.p.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            t = time.time()
            self.p.wait(timeout=30)
            return t, how
        self.p.wait(timeout=60)
        return time.time(), how

    def close(self):
        if self.p.poll() is None:
            for pid in self.victims():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.p.kill()
            self.p.wait()
        self.log.close()
        if self.cg:
            for _ in range(50):
                try:
                    os.rmdir(self.cg)
                    break
                except OSError:
                    time.sleep(0.1)


def chain(label, ns, size, limit, use_cg, runs, pass_fds, env):
    """One chain of restarts; returns (rows of waits, peak bytes or None,
    ends that were meant as OOM but were kill -9)."""
    region = S.new_region()
    env = dict(env, CUDA_DEVICE_MEMORY_SHARED_CACHE=region, CUDA_DEVICE_MEMORY_LIMIT=limit)
    peak, done = [0], [False]

    def sample():
        while not done[0]:
            try:
                peak[0] = max(peak[0], S.nvml_used())
            except Exception:
                pass
            time.sleep(0.05)

    sampler = None
    if not S.SIM:
        sampler = threading.Thread(target=sample)
        sampler.start()
    ends = (ENDS * 2)[:runs]
    waits, fallbacks, prev = [], 0, None
    try:
        for i in range(runs + 1):
            how = ends[i] if i < runs else "kill9"
            hold = "1" if how == "exit" else "120"
            if S.SIM:
                cmd, prefix = [S.client(), "await", str(int(size * S.GIB)), "0", hold], "await_rc"
            else:
                cmd, prefix = [S.PY, S.PROBE, "restart", str(size), hold], "restart_rc"
            gap = 2.0 if i % 2 == 0 and i > 0 else 0.0
            time.sleep(gap)
            cg = f"{CG_ROOT}/vgpu-restart-{os.getpid()}-{label}-{i}" if use_cg and how == "oom" else None
            run = Run(ns, cmd, env, f"restart-{label}-{i}", cg, pass_fds)
            try:
                line = run.line(prefix, 90)
                got = time.time()
                r = S.kv(line)
                ok = r.get(prefix) == "0"
                ino = r.get("ns_ino") or ns_inode(run.victims())
                print(f"# restart {label} run {i}: {line.strip()}", flush=True)
                if prev:
                    ended, ended_how, prev_ino = prev
                    reused = " same-ns-inode" if ns and ino and ino == prev_ino else ""
                    wait = got - ended if ok else float("inf")
                    inner = float(r.get("alloc_s") or float(r.get("await_ms", "nan")) / 1000)
                    # What vgpu can hold up: from the later of the end and
                    # the call to the grant (start-up is the program's).
                    held = min(wait, inner)
                    waits.append((f"{ended_how}{'+2s' if gap else ''}->{wait:.2f}s(alloc {inner:.2f}s){reused}",
                                  ok and held <= 5.0))
                if not ok:
                    break
                if i == runs:
                    break
                time.sleep(0.3)
                ended, really = run.end(how)
                fallbacks += how == "oom" and really != "oom"
                prev = (ended, really, ino)
            finally:
                run.close()
    finally:
        done[0] = True
        if sampler:
            sampler.join()
    return waits, (peak[0] if sampler else None), fallbacks


def restarts(scenarios):
    global S
    S = scenarios
    sec = "restarts"
    if subprocess.run(["unshare", "-pf", "--mount-proc", "true"], capture_output=True).returncode != 0:
        S.record(sec, "unshare --pid permitted", "no", "(skipped)", True)
        return
    runs = int(os.environ.get("RESTARTS_N", "5"))
    why_no_cg = cgroup_ok()
    use_cg = not why_no_cg
    S.record(sec, "how the OOM killer's end is made",
             "cgroup v2 memory.max lowered to 0 (the kernel's OOM killer)" if use_cg
             else f"kill -9 from outside the namespace ({why_no_cg})", "(information)", True)
    env = S.make_env(True)
    pass_fds = ()
    if S.SIM:
        # The simulated driver learns host pids through the host's /proc,
        # whatever /proc a run mounts.
        fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
        os.set_inheritable(fd, True)
        env["SIM_GPU_HOST_PROC_FD"] = str(fd)
        pass_fds = (fd,)
        limit, sizes, limit_b = "2g", [("fits", 1.25), ("does not fit", 1.6)], 2 * S.GIB
    else:
        limit, sizes, limit_b = "4g", [("fits", 2.5), ("does not fit", 3.0)], 4 * S.GIB
    shapes = [("own /proc", ["unshare", "-pf", "--mount-proc"]), ("the host's /proc", ["unshare", "-pf"]),
              ("the host's namespace", [])]
    for where, ns in shapes:
        if ns:
            rc, out, err = S.run(ns + [S.client(), "info"], dict(S.base_env(), **{k: v for k, v in env.items()
                                                                                   if k.startswith("SIM_GPU")}),
                                 60, f"restart-bare-{len(ns)}")
            if rc != 0:
                # Driver 580 refuses cuInit (304) in a pid namespace that
                # sees the host's /proc, without vgpu too (run 19).
                S.record(sec, f"restarts in {where}: CUDA without the library",
                         f"refused by the driver ({((err + out).strip().splitlines() or ['?'])[-1]})", "(skipped)",
                         True)
                continue
        for fit, size in sizes:
            label = f"{len(ns)}-{size}"
            waits, peak, fallbacks = chain(label, ns, size, limit, use_cg, runs, pass_fds, env)
            note = f" ({fallbacks} OOM ends made by kill -9 from outside)" if fallbacks else ""
            S.record(sec, f"restarts in {where}, next context {fit} ({size} GiB runs, limit {limit}): "
                          f"predecessor's end -> first allocation granted{note}",
                     ", ".join(w for w, _ in waits) or "no run", f"{runs} restarts, each granted <= 5 s after the end or its call",
                     len(waits) == runs and all(ok for _, ok in waits))
            if peak is not None:
                S.record(sec, f"restarts in {where}, next context {fit}: NVML peak of the card's processes",
                         f"{peak / S.GIB:.2f} GiB", f"<= {limit_b / S.GIB:.2f} GiB", peak <= limit_b)
