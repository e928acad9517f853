#!/usr/bin/env python3
"""Runs every test of `cargo test --workspace` (CI's last step), in two phases.

`cargo test --workspace` runs its test binaries one after another, and most
of their time is spent waiting on the simulated GPU's clock, not on the
CPU: on the 2-core CI machine that order left it mostly idle (850 s of
tests, neighbours alone 176 s), and CI took 18 min.

1. Every binary but the timing group, LANES at a time (5 unless
   VGPU_CI_LANES says otherwise), the heaviest first (WEIGHT: seconds in
   a loaded run; an unknown one counts 5 s), each in its package's
   directory as cargo would run it, the doctests among them. (Four lanes
   took 345 s for 1374 s of binaries, mostly waiting on the simulated
   clock, and the whole run 908 s under two busy loops.) The failed
   tests of a lane's binary run once more, alone, once the lanes are
   done (as below): the oversubscription tests' idle spells and waits are
   wall-clock seconds, and a loaded host broke them now and then (the
   project's CI found no suspension where one was due, on d49f47e; the
   dev VM, its checkpoint race, on ccad1d1).
2. The timing group (TIMING), alone and one after another: their tests
   judge shares of the simulated GPU against the host's scheduling, and
   beside a second lane and two busy loops a 40 % container got 0.367
   (an earlier try with two lanes for every binary). A test of the group
   that fails runs once more, alone: a virtual machine that wakes
   sleepers milliseconds late now and then (the dev VM of 2026-11-28)
   failed one or two of neighbours' twenty in most runs, a different one
   each time, on old code and new alike.

A retry (RETRIES) is for a test binary whose run ended with libtest's
exit status for failed tests (101) and at most MOST_RETRIED failed tests,
all named: a crash, the doctests, or a regression that fails many tests
fail CI at once. A test that fails twice fails CI; the head of each first
failure is printed, and the retries' output goes to the binary's log.

`cargo test --workspace --no-run --message-format=json` names the
binaries. Prints one line per binary with its time and test counts, the
whole output of any that failed, and exits non-zero if any failed.
"""

import fcntl
import json
import os
import re
import subprocess
import sys
import threading
import time

# Seconds per test binary, roughly (a loaded fresh-clone run, 009e7ab): the
# order the lanes take them in, longest first.
WEIGHT = {
    "neighbours": 220, "oversub_turns_vmm": 175, "oversub_vmm": 119, "hami": 118,
    "memory_quota": 95, "oversub_turns": 80, "exporter": 93, "reliability": 92, "oversub_hostile": 89,
    "oversub": 86, "restarts": 81, "launch_limit": 68, "region_survival": 62,
    "utilization": 61, "fork": 50, "serve_attacks": 44, "podwatch": 41,
    "shm_layout": 32, "entry_paths": 31, "dist": 31, "bundle": 31,
    "region_upgrade": 27, "doctests": 22,
}
# Binaries whose tests judge shares and rates of the simulated GPU: run
# alone.
TIMING = {"neighbours", "launch_limit", "utilization"}
# How often a failed test runs again, alone.
RETRIES = 1
# A binary with more failed tests than this is not retried: that is a
# regression, not the host (each oversubscription test's retry can take
# 30 s or more).
MOST_RETRIED = 3


class RigLock:
    """The lock each test binary's rig holds while it builds and copies what
    it runs out of target/debug (tests/common: RIG_LOCK, in the directory
    above the test executables' deps/, as the rig finds it)."""

    def __init__(self, profile_dir):
        d = os.path.join(profile_dir, "vgpu-test-programs")
        os.makedirs(d, exist_ok=True)
        self.f = open(os.path.join(d, ".rig.lock"), "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def release(self):
        if not self.f.closed:
            self.f.close()


# target/debug as the test executables say (CARGO_TARGET_DIR, a cargo
# config or --target may move it), set by binaries().
PROFILE_DIR = [os.path.join("target", "debug")]


def binaries():
    out = subprocess.run(
        ["cargo", "test", "--workspace", "--no-run", "--message-format=json"],
        check=True, stdout=subprocess.PIPE, text=True).stdout
    found = []
    for line in out.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if (m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test")
                and m.get("executable")):
            pkg = os.path.dirname(m["manifest_path"])
            name = m["target"]["name"]
            kind = m["target"]["kind"][0]
            label = f"{os.path.basename(pkg)}/{kind}/{name}"
            found.append((WEIGHT.get(name, 5), label, m["executable"], pkg, name))
            PROFILE_DIR[0] = os.path.dirname(os.path.dirname(m["executable"]))
    found.sort(key=lambda f: -f[0])
    return found


def failed_tests(text):
    """The names a libtest run lists as failed."""
    return re.findall(r"^test (\S+) \.\.\. FAILED$", text, re.M)


def retry(entry, logs, names):
    """Runs each of `names` of a test binary once more, alone. Returns
    (names that failed again, the retries' log)."""
    _, label, exe, pkg, _ = entry
    log = os.path.join(logs, label.replace("/", "-") + ".retry.log")
    env = dict(os.environ, CARGO_MANIFEST_DIR=pkg)
    still = []
    with open(log, "wb") as f:
        for name in names:
            f.write(f"===== {name}, again =====\n".encode())
            f.flush()
            start = f.tell()
            # Into the file, not a pipe: a process the test left behind
            # holding its output would keep a pipe open, and CI waiting.
            rc = subprocess.run([exe, "--exact", name], cwd=pkg, env=env, stdout=f,
                                stderr=subprocess.STDOUT).returncode
            f.seek(0, os.SEEK_END)
            with open(log, "rb") as r:
                r.seek(start)
                out = r.read().decode(errors="replace")
            # It passes only by running that one test, and passing it.
            if rc != 0 or not re.search(r"test result: ok\. 1 passed; 0 failed", out):
                still.append(name)
    return still, log


def run_binary(entry, logs):
    """Runs one test binary (or the doctests) into its log. Returns
    (exit status, seconds, the log's path)."""
    _, label, exe, pkg, _ = entry
    log = os.path.join(logs, label.replace("/", "-") + ".log")
    cmd = [exe] if exe else ["cargo", "test", "--workspace", "--doc"]
    # A test binary gets the directory cargo would give it; cargo itself
    # (the doctests) none: ring's build script reruns when it changes, and
    # ring, rustls, ureq and vgpuctl would build again, here and at the
    # next rig's `cargo build`.
    env = dict(os.environ, CARGO_MANIFEST_DIR=pkg) if exe else dict(os.environ)
    start = time.monotonic()
    with open(log, "w") as f:
        if exe:
            rc = subprocess.run(cmd, cwd=pkg, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
        else:
            # Cargo replaces target/debug/libvgpu_core.so (remove, link)
            # even when it is fresh: no rig may copy it meanwhile. Its
            # builds end before the first "Doc-tests" line (rustdoc then
            # compiles and runs the examples): the lock ends there.
            rig = RigLock(PROFILE_DIR[0])
            p = subprocess.Popen(cmd, cwd=pkg, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, errors="replace")
            for line in p.stdout:
                f.write(line)
                if line.lstrip().startswith("Doc-tests"):
                    rig.release()
            rc = p.wait()
            rig.release()
    return rc, time.monotonic() - start, log


def counts_of(text):
    """(passed, failed, ignored) summed over a log's libtest results."""
    counts = [tuple(map(int, c)) for c in re.findall(
        r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", text)]
    return tuple(sum(c[i] for c in counts) for i in range(3))


def retryable(entry, rc, text):
    """Whether a failed run may be retried: a test binary (not the
    doctests) whose every failure is a named test's (101: libtest's own
    exit status for failed tests; any other is a crash, no timing), and
    at most MOST_RETRIED of them."""
    names = failed_tests(text)
    return bool(rc == 101 and entry[2] and 0 < len(names) <= MOST_RETRIED
                and len(names) == counts_of(text)[1])


def report(entry, ran, lock, results, retries=0):
    """Records a binary's run `ran` (run_binary's answer), after retrying
    its failed tests alone up to `retries` times where that may be done."""
    label = entry[1]
    rc, secs, log = ran
    text = open(log, errors="replace").read()
    passed, failed, ignored = counts_of(text)
    note = ""
    if retries > 0 and retryable(entry, rc, text):
        names = failed_tests(text)
        with lock:
            # (The head of each failure, enough for the waiting process's
            # output a crowding test prints first: the whole is in the log.)
            print(f"\n===== {label}: first run's failures =====", flush=True)
            for part in text[text.find("failures:"):].split("\n---- ")[1:]:
                sys.stdout.write("---- " + "\n".join(part.splitlines()[:40]) + "\n")
        start = time.monotonic()
        still = names
        for _ in range(retries):
            still, retry_log = retry(entry, os.path.dirname(log), still)
            with open(retry_log, errors="replace") as f:
                retried = f.read()
            with open(log, "a") as f:
                f.write(retried)
            if not still:
                break
        secs += time.monotonic() - start
        passed += len(names) - len(still)
        failed = len(still)
        rc = 1 if still else 0
        note = (f"  (retried alone: {', '.join(names)}; "
                f"failed again: {', '.join(still) or 'none'})")

    with lock:
        ok = rc == 0
        results.append((label, ok, secs, passed, failed, ignored, log))
        print(f"{'ok  ' if ok else 'FAIL'} {label:32} {secs:7.1f} s  "
              f"{passed} passed, {failed} failed, {ignored} ignored{note}", flush=True)


def main():
    lanes = int(os.environ.get("VGPU_CI_LANES", "5"))
    logs = os.path.join("target", "ci-logs")
    os.makedirs(logs, exist_ok=True)
    built = time.monotonic()
    found = binaries()
    print(f"test binaries built in {time.monotonic() - built:.0f} s", flush=True)
    timing = [f for f in found if f[4] in TIMING]
    queue = [f for f in found if f[4] not in TIMING]
    lock = threading.Lock()
    results = []
    # What every test binary's rig builds (tests/common: `cargo build -p
    # ...`), first, so that no rig compiles in the lanes. Each rig runs
    # its own copies of what it built, and the doctests go in the lanes
    # too, under the rig's lock (they ran alone before the lanes: 25 s of
    # a run that came to 919 s under load).
    subprocess.run(["cargo", "build", "--quiet", "-p", "vgpu", "-p", "vgpu-preload", "-p", "sim-gpu",
                    "-p", "vgpuctl"], check=True)
    queue.append((WEIGHT["doctests"], "doctests", None, os.getcwd(), "doctests"))
    queue.sort(key=lambda f: -f[0])
    print(f"{len(queue)} test binaries in {lanes} lanes, then {len(timing)} alone", flush=True)

    # Failures in the lanes, retried once the lanes are done (alone).
    deferred = []

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                entry = queue.pop(0)
            try:
                ran = run_binary(entry, logs)
                if ran[0] != 0 and retryable(entry, ran[0], open(ran[2], errors="replace").read()):
                    with lock:
                        deferred.append((entry, ran))
                else:
                    report(entry, ran, lock, results)
            except Exception as e:  # noqa: BLE001 (a lane must not drop a binary)
                with lock:
                    results.append((entry[1], False, 0.0, 0, 0, 0, os.devnull))
                    print(f"FAIL {entry[1]:32} not run to its end: {e!r}", flush=True)

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t1 = time.monotonic()
    for entry, ran in deferred:
        report(entry, ran, lock, results, retries=RETRIES)
    t2 = time.monotonic()
    for entry in timing:
        report(entry, run_binary(entry, logs), lock, results, retries=RETRIES)
    print(f"lanes {t1 - t0:.0f} s, their retries {t2 - t1:.0f} s, "
          f"timing group alone {time.monotonic() - t2:.0f} s", flush=True)
    bad = [r for r in results if not r[1]]
    for label, _, _, _, _, _, log in bad:
        print(f"\n===== {label} failed: {log} =====", flush=True)
        sys.stdout.write(open(log, errors="replace").read())
    total = sum(r[3] for r in results)
    print(f"\n{total} tests passed in {len(results)} binaries; "
          f"{len(bad)} binaries failed: {', '.join(r[0] for r in bad) or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
