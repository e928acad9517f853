//! The compute quota on the simulated GPU: the limit holds, is shared by
//! the container's processes, throttles graphs, and survives the death of
//! the process that leads the bucket.

mod common;

use common::*;

/// Per-second completions of a spin run.
fn per_sec(r: &Run) -> Vec<f64> {
    r.get("per_sec")
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect()
}

fn spin_args(ns: u64, secs: u32, mode: &str) -> Vec<String> {
    vec![
        "spin".into(),
        ns.to_string(),
        "132".into(),
        secs.to_string(),
        mode.into(),
    ]
}

fn run_spin(sim: &Sim, path: Path3, ns: u64, secs: u32, mode: &str) -> Run {
    let args = spin_args(ns, secs, mode);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    sim.client(path, true, &args).ok()
}

fn spawn_spin(sim: &Sim, path: Path3, ns: u64, secs: u32, mode: &str) -> std::process::Child {
    let args = spin_args(ns, secs, mode);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    sim.spawn_client(path, true, &args)
}

/// Kernels a second of one process alone and unlimited that launches
/// `ns`-ns kernels back to back (any launch family, graphs too): the
/// simulated device's own clock, one kernel per `ns` (a measured solo run
/// gives 999.7 a second for 1 ms, idle or beside two busy loops: the
/// device, not the host, sets it), so no run measures it.
fn device_rate(ns: u64) -> f64 {
    1e9 / ns as f64
}

fn with_limit(percent: &str) -> Sim {
    let mut s = Sim::new(1, "8g");
    s.set("CUDA_DEVICE_SM_LIMIT", percent);
    s
}

#[test]
fn a_30_percent_limit_holds_over_10_seconds() {
    let _serial = serial();
    let free = device_rate(1_000_000);
    let sim = with_limit("30");
    let mut watch = sim.cmd("smi", false);
    let limited = spawn_spin(&sim, Path3::ProcAddr, 1_000_000, 10, "kernel");
    std::thread::sleep(std::time::Duration::from_secs(5));
    let smi = Run::from(watch.output().unwrap()).ok();
    let limited = finish(limited).ok();
    let fraction = limited.f64("rate") / free;
    assert!(
        (0.27..=0.33).contains(&fraction),
        "achieved {fraction:.3} of unlimited"
    );
    // The simulated NVML agrees (device utilisation over the last second).
    let util = smi.u64("gpu0_util");
    assert!((25..=35).contains(&util), "NVML utilisation {util}%");
    for (i, s) in per_sec(&limited).iter().enumerate().skip(2) {
        let f = s / free;
        assert!((0.22..=0.38).contains(&f), "second {i}: {f:.3}");
    }
}

#[test]
fn two_processes_share_one_limit() {
    let _serial = serial();
    let free = device_rate(1_000_000);
    let sim = with_limit("30");
    let a = spawn_spin(&sim, Path3::Link, 1_000_000, 8, "kernel");
    let b = spawn_spin(&sim, Path3::Dlsym, 1_000_000, 8, "kernel");
    let (a, b) = (finish(a).ok(), finish(b).ok());
    let sum = (a.f64("rate") + b.f64("rate")) / free;
    // Two processes wake for the same windows: beside two busy loops on
    // this 2-core machine they lost up to 0.032 (0.268 once), so 0.25 at
    // the low end; more than the limit is never right.
    assert!((0.25..=0.33).contains(&sum), "together {sum:.3}");
    // Neither starves. The two race for the bucket's leases with no order
    // between them (an ordered hand-out cost 9 % on an H100), so the split
    // follows how often the host runs each process: beside two busy loops
    // on this 2-core machine one got about 1/5 of the other (1/11 once,
    // 26 and 283 a second, in a loaded fresh-clone CI run), while a
    // process that the limiter shut out would get next to nothing. So a
    // twentieth of the other's rate, not an even split.
    let (ra, rb) = (a.f64("rate"), b.f64("rate"));
    assert!(
        ra > 0.05 * rb && rb > 0.05 * ra,
        "one starves: {ra:.0} and {rb:.0} a second; per second {:?} and {:?}",
        per_sec(&a),
        per_sec(&b)
    );
}

#[test]
fn graph_launches_are_throttled() {
    let _serial = serial();
    let free = device_rate(500_000);
    let limited = run_spin(&with_limit("30"), Path3::ProcAddr, 500_000, 6, "graph");
    let fraction = limited.f64("rate") / free;
    assert!(
        (0.25..=0.35).contains(&fraction),
        "graphs ran at {fraction:.3} of unlimited"
    );
}

#[test]
fn every_launch_family_is_throttled() {
    let _serial = serial();
    for mode in ["ex", "coop"] {
        let free = device_rate(1_000_000);
        let limited = run_spin(&with_limit("30"), Path3::Dlsym, 1_000_000, 4, mode);
        let fraction = limited.f64("rate") / free;
        assert!((0.25..=0.35).contains(&fraction), "{mode}: {fraction:.3}");
    }
    let mut sim = with_limit("30");
    sim.set("CU_PTDS", "1");
    let free = device_rate(1_000_000);
    let limited = run_spin(&sim, Path3::ProcAddr, 1_000_000, 4, "kernel");
    let fraction = limited.f64("rate") / free;
    assert!((0.25..=0.35).contains(&fraction), "_ptsz: {fraction:.3}");
}

#[test]
fn killing_the_leader_stops_neither_throttling_nor_launches() {
    let _serial = serial();
    let free = device_rate(1_000_000);
    let sim = with_limit("30");
    let mut first = spawn_spin(&sim, Path3::Dlsym, 1_000_000, 30, "kernel");
    // Wait until the first process leads the bucket.
    assert!(wait_until(10.0, || {
        sim.try_status(&sim.region())
            .is_some_and(|s| s["devices"][0]["leader_pid"] == first.id())
    }));
    let second = spawn_spin(&sim, Path3::Dlsym, 1_000_000, 8, "kernel");
    std::thread::sleep(std::time::Duration::from_secs(2));
    first.kill().unwrap();
    first.wait().unwrap();
    let second = finish(second).ok();
    let rates = per_sec(&second);
    // After the kill (second 2 on), the survivor alone gets the whole 30%.
    let after: f64 = rates[4..].iter().sum::<f64>() / (rates.len() - 4) as f64 / free;
    assert!(
        (0.25..=0.35).contains(&after),
        "survivor ran at {after:.3}: {rates:?}"
    );
    let s = sim.status(&sim.region());
    assert_ne!(
        s["devices"][0]["leader_pid"],
        first.id(),
        "a new leader took over"
    );
}

#[test]
fn policy_disable_and_unlimited_values_do_not_throttle() {
    let _serial = serial();
    let free = device_rate(1_000_000);
    for (k, v) in [
        ("GPU_CORE_UTILIZATION_POLICY", "disable"),
        ("CUDA_DEVICE_SM_LIMIT", "100"),
    ] {
        let mut sim = with_limit("30");
        sim.set(k, v);
        let r = run_spin(&sim, Path3::Dlsym, 1_000_000, 2, "kernel");
        let fraction = r.f64("rate") / free;
        assert!(fraction > 0.9, "{k}={v}: {fraction:.3}");
    }
}

#[test]
fn threads_that_exit_under_a_limit_give_their_events_back() {
    // Each thread leaves a probe of the turns open (its launches cost less
    // than a probe takes in) when it exits.
    let _serial = serial();
    let sim = with_limit("30");
    let r = sim
        .client(Path3::ProcAddr, true, &["threads", "24", "2", "100000"])
        .ok();
    let (first, all) = (r.i64("events_after_first"), r.i64("events_after_all"));
    assert!(first > 0, "the simulator counts events: {first}");
    assert!(
        all <= first + 2,
        "events held after one thread {first}, after 24 threads {all}"
    );
}

#[test]
fn a_process_launching_on_two_streams_from_two_threads_gets_its_limit() {
    // Each thread's probes of the turns hold the other stream's kernels:
    // the process's own work, not a neighbour's. Alone on the GPU, its
    // windows must not take that for another context (on an H200 they did:
    // windows moved and a quarter of each share went unspent, run 74).
    let _serial = serial();
    let total = |r: &Run| r.f64("rate") + r.f64("side_rate");
    // The two streams share one device: 1003 a second together, solo.
    let free = device_rate(1_000_000);
    let sim = with_limit("30");
    let limited = spawn_spin(&sim, Path3::ProcAddr, 1_000_000, 10, "streams");
    let mut seen = Vec::new();
    for _ in 0..12 {
        std::thread::sleep(std::time::Duration::from_millis(500));
        seen.push(sim.status(&sim.region())["devices"][0]["turns"].clone());
    }
    let limited = finish(limited).ok();
    let fraction = total(&limited) / free;
    eprintln!(
        "two streams at 30 %: {fraction:.3} of unlimited ({:.0} + {:.0} a second, {free:.0} unlimited); per second {:?}; turns {seen:?}",
        limited.f64("rate"),
        limited.f64("side_rate"),
        per_sec(&limited)
    );
    assert!(
        (0.27..=0.33).contains(&fraction),
        "achieved {fraction:.3} of unlimited"
    );
    let turns = seen.iter().filter(|t| !t.is_null()).collect::<Vec<_>>();
    assert!(turns.len() >= 8, "turns in the region: {seen:?}");
    // (The leader's first look may come after the turns' first window.)
    let last = seen.last().map(|t| t["alone"].clone());
    assert_eq!(last, Some(true.into()), "not found alone: {seen:?}");
    for t in &turns {
        assert_eq!(
            t["phase_ms"], turns[0]["phase_ms"],
            "alone, yet moving: {seen:?}"
        );
        assert_eq!(t["shared"], false, "alone, yet sharing: {t}");
        assert_eq!(t["unspent_ms"], 0.0, "alone, yet leaving time unspent: {t}");
    }
}

/// Issue 29: alone on its GPU, a container at 30 % spent its share of each
/// 100 ms period at once, so one synchronised 1 ms step in about thirty
/// waited ~70 ms. Paced evenly, every step takes about its ideal
/// 1 / 0.3 = 3.3 ms, and waits for it at its synchronisation. (Judged on wall time on a loaded 2-core machine:
/// the bound is 4x the ideal, far under the 70 ms of a period's wait.)
#[test]
fn alone_at_30_percent_synchronised_steps_are_paced_evenly() {
    let _serial = serial();
    let sim = with_limit("30");
    let r = sim
        .client(
            Path3::ProcAddr,
            true,
            &["steps", "1000000", "132", "5", "1.5"],
        )
        .ok();
    let (p50, p99, max) = (r.f64("p50_ms"), r.f64("p99_ms"), r.f64("max_ms"));
    let share = r.f64("steps_per_s") * 1e-3;
    let ideal = 1.0 / 0.3;
    let (launch, sync) = (r.f64("launch_ms"), r.f64("sync_ms"));
    eprintln!(
        "alone at 30 %: share {share:.3}, p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms; \
         {launch:.3} ms a step in the launch, {sync:.3} in the synchronisation"
    );
    assert_waits_at_the_synchronisation("alone at 30 %", launch, sync, ideal);
    assert!(
        p99 <= 4.0 * ideal,
        "p99 {p99:.2} ms against an ideal of {ideal:.2} ms (p50 {p50:.2}, max {max:.2})"
    );
    assert!(
        (0.22..=0.34).contains(&share),
        "the steps held {share:.3} of the GPU at a 30 % limit"
    );
}

/// `steps` of 1 ms for 5 s on `sim` (device ordinal `device`, under the
/// limits `sim`'s environment sets), spawned: its output has the share
/// (`steps_per_s` ms a second), the latency, and where each step spent
/// its time.
fn spawn_steps(sim: &Sim, device: &str) -> std::process::Child {
    sim.client_cmd(
        Path3::ProcAddr,
        true,
        &["steps", "1000000", "132", "5", "1.5"],
    )
    .env("CUCLIENT_DEVICE", device)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("spawn cuclient steps")
}

/// A paced step's wait is taken once its synchronisation returns, not at
/// its next launch (`limiter/settle.rs`): a launch goes at once, and the
/// step takes its pace, not its pace and what the GPU made it wait.
/// `launch` and `sync`: the mean ms a step spent in each, `ideal` its
/// paced length. Without the wait at the synchronisation a 1 ms step at
/// 30 % spends about 2.3 ms in its launch and 1 ms in its
/// synchronisation; with it, 0.07-0.18 ms and 3.1-3.3 ms (at 20 and 50 %
/// on two GPUs up to 0.28 ms in the launch: the longest host gap of late
/// is left to the launch, more on a loaded machine).
fn assert_waits_at_the_synchronisation(who: &str, launch: f64, sync: f64, ideal: f64) {
    assert!(
        launch < 0.5 * (ideal - 1.0),
        "{who}: {launch:.3} ms a step in the launch, {sync:.3} in the synchronisation (paced {ideal:.2} ms)"
    );
    assert!(
        sync > 1.0 + 0.5 * (ideal - 1.0),
        "{who}: {sync:.3} ms a step in the synchronisation, {launch:.3} in the launch (paced {ideal:.2} ms)"
    );
}

/// A container on two GPUs, one process on each, with limits of 20 and
/// 50 %: each process waits at its synchronisation for its own GPU's
/// bucket. Had one waited on the other GPU's schedule, the 50 % one would
/// be held to the 20 % one's pace, or the 20 % one would wait where its
/// own bucket asks nothing.
#[test]
fn each_process_of_a_container_on_two_gpus_waits_for_its_own_gpu_s_bucket() {
    let _serial = serial();
    let mut sim = Sim::new(2, "8g");
    sim.set("CUDA_DEVICE_SM_LIMIT_0", "20")
        .set("CUDA_DEVICE_SM_LIMIT_1", "50");
    let children = [spawn_steps(&sim, "0"), spawn_steps(&sim, "1")];
    let runs: Vec<Run> = children.into_iter().map(|c| finish(c).ok()).collect();
    for (r, limit) in runs.iter().zip([20.0, 50.0]) {
        let (launch, sync) = (r.f64("launch_ms"), r.f64("sync_ms"));
        let share = r.f64("steps_per_s") * 1e-3;
        let who = format!("the process on the GPU at {limit} %");
        eprintln!("{who}: share {share:.3}, launch {launch:.3} ms, sync {sync:.3} ms a step");
        assert_waits_at_the_synchronisation(&who, launch, sync, 100.0 / limit);
        // (Wide: a loaded machine's stalls cost a 50 % container up to a
        // tenth of some second's share, `serial`; on the other GPU's
        // schedule it got 0.21.)
        let target = limit / 100.0;
        assert!((share - target).abs() <= 0.08, "{who}: share {share:.3}");
    }
}
