#!/usr/bin/env python3
"""Runs the workspace's test binaries in concurrent lanes (CI's last step).

`cargo test --workspace` runs its test binaries one after another, and most
of their time is spent waiting on the simulated GPU's clock, not on the
CPU, so on the 2-core CI machine that serial order left it mostly idle
(788 s of tests, neighbours alone 175 s). Here `cargo test --workspace
--no-run --message-format=json` names the binaries, and LANES workers
(2 unless VGPU_CI_LANES says otherwise) each take the heaviest binary left
(WEIGHT: seconds measured on an idle machine; an unknown one counts 5 s),
run it in its package's directory as cargo would, and keep its output.
Then the doctests (`cargo test --workspace --doc`). Prints one line per
binary with its time and test counts, the whole output of any that failed,
and exits non-zero if any failed.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time

# Seconds per test binary, idle 2-core machine (cargo test --workspace).
WEIGHT = {
    "neighbours": 175, "oversub_hostile": 68, "launch_limit": 67,
    "oversub": 62, "utilization": 61, "reliability": 59, "restarts": 57,
    "hami": 52, "region_survival": 52, "oversub_turns": 35, "exporter": 33,
    "bundle": 16, "memory_quota": 11, "entry_paths": 10,
}


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
            found.append((WEIGHT.get(name, 5), label, m["executable"], pkg))
    found.sort(key=lambda f: -f[0])
    return found


def main():
    lanes = int(os.environ.get("VGPU_CI_LANES", "2"))
    logs = os.path.join("target", "ci-logs")
    os.makedirs(logs, exist_ok=True)
    queue = binaries()
    queue.append((0, "doctests", None, os.getcwd()))
    print(f"{len(queue) - 1} test binaries and the doctests, {lanes} lanes", flush=True)
    lock = threading.Lock()
    results = []

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                _, label, exe, pkg = queue.pop(0)
            log = os.path.join(logs, label.replace("/", "-") + ".log")
            cmd = [exe] if exe else ["cargo", "test", "--workspace", "--doc"]
            env = dict(os.environ, CARGO_MANIFEST_DIR=pkg)
            start = time.monotonic()
            with open(log, "w") as f:
                rc = subprocess.run(cmd, cwd=pkg, env=env, stdout=f,
                                    stderr=subprocess.STDOUT).returncode
            secs = time.monotonic() - start
            text = open(log, errors="replace").read()
            counts = [tuple(map(int, c)) for c in re.findall(
                r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", text)]
            passed = sum(c[0] for c in counts)
            failed = sum(c[1] for c in counts)
            ignored = sum(c[2] for c in counts)
            with lock:
                ok = rc == 0
                results.append((label, ok, secs, passed, failed, ignored, log))
                print(f"{'ok  ' if ok else 'FAIL'} {label:32} {secs:7.1f} s  "
                      f"{passed} passed, {failed} failed, {ignored} ignored", flush=True)

    threads = [threading.Thread(target=worker) for _ in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
