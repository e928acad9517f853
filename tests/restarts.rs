//! Restarts across pid namespaces (docs/reliability.md, "Identity across
//! pid namespaces"): a container restarted runs in a fresh pid namespace,
//! with or without its own /proc, and must get its quota back from the
//! previous run, whether that exited or was killed, without ever letting
//! two live runs past the limit.
//!
//! Needs `unshare --pid` (CAP_SYS_ADMIN; CI runs as root): without it each
//! test says SKIPPED.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn machine() -> Sim {
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .set("SIM_GPU_CTX_OVERHEAD", "256m")
        .set("SIM_GPU_HOST_PROC_FD", &host_proc_fd().to_string());
    sim
}

/// Whether this machine lets us make pid namespaces.
fn can_unshare() -> bool {
    let ok = Command::new("unshare")
        .args(["-pf", "--mount-proc", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIPPED: unshare --pid is not permitted here");
    }
    ok
}

/// `unshare -pf [--mount-proc] cuclient ARGS`, piped.
fn in_new_ns(sim: &Sim, mount_proc: bool, args: &[&str]) -> Child {
    let client = artifacts().bin.join("cuclient-via_link");
    let mut c = sim.cmd("/usr/bin/env", true);
    c.args(["unshare", "-pf"]);
    if mount_proc {
        c.arg("--mount-proc");
    }
    c.arg(client)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Host pids of `parent`'s children.
fn children(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = &s[s.rfind(')')? + 2..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

fn kill9(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

#[derive(Clone, Copy, Debug)]
enum End {
    Exit,
    Kill9,
}

/// Runs after run in fresh namespaces, each waiting for 1.6 GiB of the
/// 2 GiB limit (two never fit), holding it, then ending as `ends` says.
/// With its 256 MiB context a run leaves too little for the next one's
/// context, as on the H200 (3 GiB + 518 MiB of 4 GiB): the next run's
/// first context must wait for its predecessor to be judged, not fail.
fn restart_cycles(mount_proc: bool, ends: &[End]) {
    let sim = machine();
    let watch = sim
        .cmd("smi", false)
        .args(["watch", "0", "20", "60"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let bytes = (1640 * MIB).to_string();
    let mut waits = Vec::new();
    for (i, end) in ends.iter().enumerate() {
        let hold = match end {
            End::Exit => "1",
            End::Kill9 => "60",
        };
        let mut run = in_new_ns(&sim, mount_proc, &["await", &bytes, "8", hold]);
        let mut out = BufReader::new(run.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let got = Run::from(std::process::Output {
            status: std::process::ExitStatus::default(),
            stdout: line.clone().into_bytes(),
            stderr: Vec::new(),
        });
        if got.kv.get("await_rc").map(String::as_str) != Some("0") {
            kill9(run.id());
            let r = finish(run);
            let before = i.checked_sub(1).map(|j| ends[j]);
            panic!(
                "run {i} (after {before:?}, mount_proc={mount_proc}): quota never came back: {line}{}\n{}",
                r.stderr,
                sim.ctl(&["status", sim.region().to_str().unwrap()]).stdout
            );
        }
        waits.push(got.f64("await_ms"));
        if let End::Kill9 = end {
            std::thread::sleep(Duration::from_millis(300));
            for pid in children(run.id()) {
                kill9(pid);
            }
        }
        let status = run.wait().unwrap();
        assert!(matches!(end, End::Kill9) || status.success(), "{status:?}");
    }
    let _ = Command::new("kill")
        .args(["-TERM", &watch.id().to_string()])
        .status();
    let w = finish(watch);
    eprintln!("mount_proc={mount_proc} ends={ends:?} waits_ms={waits:?}");
    for (i, ms) in waits.iter().enumerate().skip(1) {
        assert!(
            *ms <= 5000.0,
            "run {i}: quota came back after {ms} ms ({:?} before it)",
            ends[i - 1]
        );
    }
    assert!(w.u64("samples") > 100, "{}", w.stdout);
    assert!(
        w.u64("max_used") <= 2 * GIB,
        "overcommit: {} bytes on the card",
        w.u64("max_used")
    );
}

const ENDS: [End; 5] = [End::Exit, End::Kill9, End::Exit, End::Kill9, End::Exit];

#[test]
fn restarts_in_pid_namespaces_with_their_own_proc_get_the_quota_back() {
    let _serial = serial();
    if can_unshare() {
        restart_cycles(true, &ENDS);
    }
}

#[test]
fn restarts_in_pid_namespaces_without_their_own_proc_get_the_quota_back() {
    let _serial = serial();
    if can_unshare() {
        restart_cycles(false, &ENDS);
    }
}

/// `sh -c SCRIPT` in a new pid namespace (no /proc of its own): the
/// client is `$C`.
fn sh_in_new_ns(sim: &Sim, script: &str) -> Run {
    let client = artifacts().bin.join("cuclient-via_link");
    let out = sim
        .cmd("/usr/bin/env", true)
        .args(["unshare", "-pf", "sh", "-c", script])
        .env("C", client)
        .output()
        .unwrap();
    Run::from(out)
}

#[test]
fn a_live_holder_in_another_namespace_is_never_reclaimed() {
    let _serial = serial();
    if !can_unshare() {
        return;
    }
    let sim = machine();
    let gib = GIB.to_string();
    // The overcommit: a holder at pid 2 of a namespace without its
    // own /proc, where /proc/2 is another process; asked past the grace.
    let r = sh_in_new_ns(
        &sim,
        &format!("$C hold {gib} 8 >/dev/null & sleep 4; $C alloc buffer {gib}; kill $!"),
    );
    assert_eq!(r.i64("alloc_rc"), 2, "{}{}", r.stdout, r.stderr);
    // A holder in a namespace with its own /proc, asked from another such
    // namespace and from ours, after its heartbeat's limit.
    // (It waits for the first scenario's quota to come back.)
    let mut holder = in_new_ns(&sim, true, &["await", &gib, "8", "15"]);
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("await_rc=0"), "{line}");
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    let other = finish(in_new_ns(&sim, true, &["alloc", "buffer", &gib]));
    let ours = sim.client(Path3::Dlsym, true, &["alloc", "buffer", &gib]);
    assert!(
        t.elapsed() < Duration::from_secs(14),
        "the holder still lives"
    );
    kill9(holder.id());
    for pid in children(holder.id()) {
        kill9(pid);
    }
    let _ = holder.wait();
    assert_eq!(other.i64("alloc_rc"), 2, "{}", other.stderr);
    assert_eq!(ours.i64("alloc_rc"), 2, "{}", ours.stderr);
}
