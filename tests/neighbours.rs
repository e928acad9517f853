//! Containers that share one GPU (issue 9): each is its own process with
//! its own region and SM limit, and the simulated GPU time-slices their
//! contexts as a real one does (tests/sim-gpu/src/sched.rs): a kernel's
//! wall time includes the other context's slices, every switch costs
//! device time, and NVML hands each sample period to one process.

mod common;

use std::process::Child;

use common::*;

const KERNEL_NS: u64 = 1_000_000;
const SECS: u32 = 10;

/// Launches back to back (the device has work all the time).
const DENSE: &str = "kernel";
/// Host-bound: 0.1 ms kernels, a launch every 0.11 ms, so the GPU is
/// busy about 91 % of the time (as a real loop of 0.05 ms kernels keeps
/// an H200).
const PACED: &str = "paced";
/// 0.1 ms kernels, the context synchronised after every ten (as a
/// PyTorch loop that reads a result back now and then).
const SYNCED: &str = "synced";
/// 1.6 ms kernels, synchronised after every ten (as the PyTorch GEMM loop
/// of gpu-tests/neighbours.py): shorter than a time slice, so beside an
/// unlimited neighbour most of their timings hold one of its slices.
const SYNCED_LONG: &str = "synced-long";
/// 0.055 ms kernels, synchronised after every ten: steps of 0.55 ms, too
/// few to a 60 % window of 100 ms (`limiter/period.rs`).
const SYNCED_SHORT: &str = "synced-short";

fn spin_args(secs: u32, mode: &str) -> Vec<String> {
    let (kernel_ns, mode) = match mode {
        PACED | SYNCED => (KERNEL_NS / 10, mode),
        SYNCED_LONG => (KERNEL_NS * 16 / 10, SYNCED),
        SYNCED_SHORT => (KERNEL_NS * 55 / 1000, SYNCED),
        _ => (KERNEL_NS, mode),
    };
    vec![
        "spin".into(),
        kernel_ns.to_string(),
        "132".into(),
        secs.to_string(),
        mode.into(),
    ]
}

/// The period the containers run at (`NEIGHBOURS_SM_PERIOD_MS`, or the
/// library's default, 100 ms), in ms.
fn period_ms() -> f64 {
    std::env::var("NEIGHBOURS_SM_PERIOD_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100.0)
}

/// Per-second completions of a spin run.
fn per_sec(r: &Run) -> Vec<f64> {
    r.get("per_sec")
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect()
}

/// Each second's completions of a [`DENSE`] spin run, as fractions of the
/// device ([`DEVICE_RATE`]).
fn per_sec_of_device(r: &Run) -> Vec<f64> {
    per_sec(r).iter().map(|s| s / DEVICE_RATE).collect()
}

/// A container on `sim`'s GPU for `secs`: its own region, and `limit` if
/// any; with no limit it runs without vgpu at all, and with `Some(0)`
/// with vgpu and no SM limit.
fn container_for(sim: &Sim, name: &str, limit: Option<u32>, secs: u32) -> Child {
    container_running(sim, name, limit, secs, DENSE)
}

/// [`container_for`], its loop launching in `mode`.
fn container_running(sim: &Sim, name: &str, limit: Option<u32>, secs: u32, mode: &str) -> Child {
    container_command(sim, name, limit, secs, mode)
        .spawn()
        .expect("spawn cuclient")
}

/// A process of container `name` ([`container_for`]) on the GPU of
/// `CUDA_VISIBLE_DEVICES=visible`: processes of one name share its region.
fn container_on(sim: &Sim, name: &str, limit: Option<u32>, secs: u32, visible: &str) -> Child {
    let mut c = container_command(sim, name, limit, secs, DENSE);
    c.env("CUDA_VISIBLE_DEVICES", visible);
    c.spawn().expect("spawn cuclient")
}

/// [`container_running`]'s command, not yet spawned.
fn container_command(
    sim: &Sim,
    name: &str,
    limit: Option<u32>,
    secs: u32,
    mode: &str,
) -> std::process::Command {
    let args = spin_args(secs, mode);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = sim.client_cmd(Path3::ProcAddr, limit.is_some(), &args);
    c.env(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        sim.dir.path().join(format!("{name}.cache")),
    );
    if let Some(ms) = std::env::var_os("NEIGHBOURS_SM_PERIOD_MS") {
        c.env("VGPU_SM_PERIOD_MS", ms); // (to try the suite at another period)
    }
    match limit {
        Some(l) => c.env("CUDA_DEVICE_SM_LIMIT", l.to_string()),
        None => c.env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE"),
    };
    let stderr = match std::env::var_os("NEIGHBOURS_LOG_DIR") {
        // Debug logs go to files: a pipe nobody reads until the first
        // container exits would stall the others.
        Some(dir) => {
            let level = std::env::var("NEIGHBOURS_LOG_LEVEL").unwrap_or_else(|_| "4".into());
            c.env("LIBCUDA_LOG_LEVEL", level);
            let path = std::path::Path::new(&dir).join(format!("{name}.log"));
            std::process::Stdio::from(std::fs::File::create(path).expect("log file"))
        }
        None => std::process::Stdio::piped(),
    };
    c.stdout(std::process::Stdio::piped()).stderr(stderr);
    c
}

/// `cuclient args` as container `name` on `sim`, with vgpu at an SM limit
/// of `percent` (its region `name.cache`).
fn limited_client(sim: &Sim, name: &str, percent: u32, args: &[&str]) -> std::process::Command {
    let mut c = sim.client_cmd(Path3::ProcAddr, true, args);
    c.env(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        sim.dir.path().join(format!("{name}.cache")),
    )
    .env("CUDA_DEVICE_SM_LIMIT", percent.to_string());
    c
}

/// Container `first` (name, limit, seconds: [`container_for`]) alone for
/// 3 s, then `second` beside it: each one's run and its per-second
/// fractions of the device.
fn one_then_another(
    sim: &Sim,
    first: (&str, Option<u32>, u32),
    second: (&str, Option<u32>, u32),
) -> (Run, Vec<f64>, Run, Vec<f64>) {
    let a = container_for(sim, first.0, first.1, first.2);
    std::thread::sleep(std::time::Duration::from_secs(3));
    let b = container_for(sim, second.0, second.1, second.2);
    let b = finish(b).ok();
    let a = finish(a).ok();
    let (wa, wb) = (per_sec_of_device(&a), per_sec_of_device(&b));
    (a, wa, b, wb)
}

/// A container's limit, its fraction of the solo rate, and that fraction
/// in each second.
type Share = (Option<u32>, f64, Vec<f64>);

/// The rate of one process alone and unlimited, launching back to back
/// ([`DENSE`]): the simulated device's own clock, one 1 ms kernel per ms
/// (a measured solo run gives 999.7 a second, idle or beside two busy
/// loops: the device, not the host, sets it), so no run measures it.
const DEVICE_RATE: f64 = 1e9 / KERNEL_NS as f64;

/// The rate of one process alone and unlimited, launching in `mode`, each
/// kernel up to `pct` per cent longer than its work (`SIM_GPU_JITTER_PCT`).
fn solo_rate_jittered(mode: &str, pct: u32) -> f64 {
    let args = spin_args(3, mode);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Sim::new(1, "8g")
        .set("SIM_GPU_JITTER_PCT", &pct.to_string())
        .client(Path3::ProcAddr, true, &args)
        .ok()
        .f64("rate")
}

/// Runs the containers at once; (limit, fraction of solo, per-second
/// fractions) of each.
fn share(limits: &[Option<u32>]) -> Vec<Share> {
    share_for(limits, SECS)
}

fn share_for(limits: &[Option<u32>], secs: u32) -> Vec<Share> {
    share_and_turns(limits, secs, DENSE).0
}

/// [`share_for`], and each limited container's turns at the end
/// (`vgpuctl status`'s `turns`: where its window opens, its fill; None
/// for an unlimited one).
///
/// The solo rate of a [`DENSE`] loop is the device's ([`DEVICE_RATE`]);
/// any other loop is host-bound, and its solo rate is measured first.
fn share_and_turns(
    limits: &[Option<u32>],
    secs: u32,
    mode: &str,
) -> (Vec<Share>, Vec<Option<serde_json::Value>>) {
    let (out, turns, _) = share_turns_and_solo(limits, secs, mode);
    (out, turns)
}

/// [`share_and_turns`], and the solo rate the shares are fractions of.
fn share_turns_and_solo(
    limits: &[Option<u32>],
    secs: u32,
    mode: &str,
) -> (Vec<Share>, Vec<Option<serde_json::Value>>, f64) {
    share_on(Sim::new(1, "8g"), limits, secs, mode)
}

/// Containers c0, c1, ... at `limits`, running `mode` for `secs`.
fn containers_running(sim: &Sim, limits: &[Option<u32>], secs: u32, mode: &str) -> Vec<Child> {
    limits
        .iter()
        .enumerate()
        .map(|(i, &l)| container_running(sim, &format!("c{i}"), l, secs, mode))
        .collect()
}

/// Waits for [`containers_running`]'s `children`; each one's share of a
/// `solo` rate, over the run and per second.
fn shares_of(limits: &[Option<u32>], children: Vec<Child>, solo: f64) -> Vec<Share> {
    let runs: Vec<Run> = children.into_iter().map(|c| finish(c).ok()).collect();
    let out: Vec<Share> = limits
        .iter()
        .zip(&runs)
        .map(|(&l, r)| {
            let secs: Vec<f64> = per_sec(r).iter().map(|s| s / solo).collect();
            (l, r.f64("rate") / solo, secs)
        })
        .collect();
    for (l, f, secs) in &out {
        eprintln!("limit {l:?}: {f:.3} of solo ({solo:.0}/s); per second {secs:.3?}");
    }
    out
}

/// [`share_turns_and_solo`] on `sim`.
fn share_on(
    sim: Sim,
    limits: &[Option<u32>],
    secs: u32,
    mode: &str,
) -> (Vec<Share>, Vec<Option<serde_json::Value>>, f64) {
    let solo = if mode == DENSE {
        DEVICE_RATE
    } else {
        solo_rate_jittered(mode, 0)
    };
    let children = containers_running(&sim, limits, secs, mode);
    let out = shares_of(limits, children, solo);
    let turns = limits
        .iter()
        .enumerate()
        .map(|(i, l)| {
            l.map(|_| {
                let s = sim.status(&sim.dir.path().join(format!("c{i}.cache")));
                eprintln!("c{i}: turns {}", s["devices"][0]["turns"]);
                s["devices"][0]["turns"].clone()
            })
        })
        .collect();
    (out, turns, solo)
}

/// Each container got its limit within 0.03 over the run, and within
/// 0.15 in every second after the first 3 (a second is an accuracy
/// figure: beside two busy loops a 50 % container lost 0.1 of one second
/// waking late for its windows; one starved for a second still fails).
fn assert_each_gets_its_limit(out: &[Share]) {
    assert_each_gets_its_limit_within(out, 0.03);
}

/// [`assert_each_gets_its_limit`] within `tolerance` over the run.
fn assert_each_gets_its_limit_within(out: &[Share], tolerance: f64) {
    for (limit, fraction, secs) in out {
        let want = f64::from(limit.unwrap()) / 100.0;
        assert!(
            (fraction - want).abs() <= tolerance,
            "limit {want}: got {fraction:.3} of solo; per second {secs:.3?}"
        );
        for (i, f) in secs.iter().enumerate().skip(3) {
            assert!(
                (f - want).abs() <= 0.15,
                "limit {want}, second {i}: {f:.3}; per second {secs:.3?}"
            );
        }
    }
}

#[test]
fn two_containers_at_30_and_60_each_get_their_limit() {
    let _serial = serial();
    assert_each_gets_its_limit(&share(&[Some(30), Some(60)]));
}

#[test]
fn limits_that_sum_to_the_whole_gpu_are_met() {
    // Two busy contexts that time-slice get 0.91 of the device between
    // them (the test below), so these hold only if the containers take
    // turns instead: with a board too, which shows them their limits fill
    // the GPU (paced side by side two 50 % containers got 0.455 each on
    // an H200, run 126).
    let _serial = serial();
    let (halves, turns, _) = share_on(with_a_board(), &[Some(50), Some(50)], 20, DENSE);
    for t in &turns {
        assert_eq!(t.as_ref().expect("turns shown")["paced"], false, "{t:?}");
    }
    // The two windows ended half a period apart (vgpuctl shows where).
    let phase = |t: &Option<serde_json::Value>| {
        t.as_ref()
            .and_then(|t| t["phase_ms"].as_f64())
            .expect("turns shown")
    };
    // (vgpuctl shows phases in 100 ms: the region holds no period.)
    let period = period_ms();
    let (a, b) = (phase(&turns[0]) % period, phase(&turns[1]) % period);
    let apart = (a - b).abs().min(period - (a - b).abs());
    eprintln!("windows open at {a:.1} and {b:.1} ms of each {period} ms");
    assert!(apart >= 0.4 * period, "windows {apart:.1} ms apart");
    for (_, fraction, secs) in &halves {
        assert!(
            *fraction >= 0.47,
            "50 %: got {fraction:.3}; per second {secs:.3?}"
        );
    }
    assert_each_gets_its_limit(&halves);
    // Over 20 s, as above: the first seconds, short of the limits while
    // the windows settle, weigh less (over 12 s the 40 % container got
    // 0.375 beside two busy loops, the 50 % ones 0.477).
    assert_each_gets_its_limit(&share_for(&[Some(10), Some(20), Some(30), Some(40)], 20));
}

#[test]
fn four_containers_on_a_board_take_places_that_tile_the_period() {
    // 10 + 20 + 30 + 40 with a board: each works out where its window
    // lies from the others' shares and slots (limiter/tiling.rs), so the
    // windows settle where the probes alone took 20 s to come near
    // (above; on an H200 the 30 and 40 % ones sat at their bounds in
    // 10 s runs, runs 173 and 176).
    let _serial = serial();
    let limits = [Some(10), Some(20), Some(30), Some(40)];
    let (out, turns, _) = share_on(with_a_board(), &limits, 12, DENSE);
    let turns: Vec<_> = turns.into_iter().map(|t| t.expect("turns shown")).collect();
    assert_windows_tile_the_period(&turns, &limits);
    assert_each_gets_its_limit(&out);
}

/// The windows of containers at `limits` (their `turns` as vgpuctl
/// shows them) lie end to end round the period, in some order of slots,
/// as placed from the board: each opens where the one before it ends (a
/// place within a least move of 0 may sit just before the period's
/// end). (Not `placed`: the flag is as the leader last set it, and the
/// last container left running, alone, is placed no more.)
fn assert_windows_tile_the_period(turns: &[serde_json::Value], limits: &[Option<u32>]) {
    let period = period_ms();
    let mut placed: Vec<(f64, f64)> = turns
        .iter()
        .zip(limits)
        .map(|(t, l)| {
            let share = f64::from(l.unwrap()) * period / 100.0;
            (t["phase_ms"].as_f64().expect("a phase") % period, share)
        })
        .collect();
    placed.sort_by(|a, b| a.0.total_cmp(&b.0));
    eprintln!("windows (opens at, share) in ms: {placed:?}");
    for (k, (opens, share)) in placed.iter().enumerate() {
        let next = placed[(k + 1) % placed.len()].0;
        let gap = (next - opens).rem_euclid(period);
        assert!((gap - share).abs() <= 0.6, "windows {placed:?}");
    }
}

/// Each GPU has its own board: three containers whose limits fill the
/// first GPU are placed from its board alone, while two beside them on
/// the second GPU, whose limits leave a tenth of it free, pace side by
/// side. Read as one board, the five would sum to 190 %: none placed,
/// and the second GPU's pair in turns.
#[test]
fn containers_on_two_gpus_are_placed_from_their_own_gpu_s_board() {
    let _serial = serial();
    let sim = with_a_board_on(2);
    let first = [("a", 20), ("b", 30), ("c", 50)];
    let second = [("d", 30), ("e", 60)];
    let children: Vec<(&str, u32, Child)> = first
        .iter()
        .map(|&(n, l)| (n, l, container_on(&sim, n, Some(l), 12, "0")))
        .chain(
            second
                .iter()
                .map(|&(n, l)| (n, l, container_on(&sim, n, Some(l), 12, "1"))),
        )
        .collect();
    let runs: Vec<(&str, u32, Run)> = children
        .into_iter()
        .map(|(n, l, c)| (n, l, finish(c).ok()))
        .collect();
    let out: Vec<Share> = runs
        .iter()
        .map(|(n, l, r)| {
            let secs = per_sec_of_device(r);
            let fraction = r.f64("rate") / DEVICE_RATE;
            eprintln!("{n} at {l} %: {fraction:.3}; per second {secs:.3?}");
            (Some(*l), fraction, secs)
        })
        .collect();
    let turns: Vec<serde_json::Value> = runs
        .iter()
        .map(|(n, _, _)| {
            let (used, s) = devices_in_turns(&sim, n);
            assert_eq!(used.len(), 1, "{n}: one device with turns: {s}");
            eprintln!("{n}: turns {}", used[0]["turns"]);
            used[0]["turns"].clone()
        })
        .collect();
    let limits: Vec<Option<u32>> = first.iter().map(|&(_, l)| Some(l)).collect();
    assert_windows_tile_the_period(&turns[..3], &limits);
    for t in &turns[3..] {
        assert_eq!(t["paced"], true, "{t}");
    }
    assert_each_gets_its_limit(&out);
}

#[test]
fn a_host_bound_loop_s_window_spans_its_share_of_the_period() {
    // 30 + 60 % of loops that keep the GPU 91 % busy: their launches'
    // cost, 90 % of the period, spans 99 % of it, so shares counted in
    // cost leave the windows no room (the 60 % container got 0.545 on an
    // H200, run 43). Counted in span, both fit.
    // vgpuctl shows the fill each one measured: 0.1 ms of every 0.11.
    thirty_and_sixty_meet_their_limits_with_fills(PACED, 0.85..=1.0);
}

#[test]
fn a_loop_that_synchronises_often_finds_its_turns() {
    // Ten 0.1 ms kernels, then a synchronisation: a probe (3 ms of
    // launches) spans several, each a pause with the stream dry. Probes
    // that dropped at such pauses never closed, the windows never moved
    // apart, and the two time-sliced (30 + 60 at 0.05 ms on an H200:
    // 0.325 + 0.548, run 47).
    // Their probes closed: each measured the fill of its windows (the
    // pauses at the synchronisations included).
    thirty_and_sixty_meet_their_limits_with_fills(SYNCED, 0.85..=1.0);
}

/// Containers at 30 and 60 % whose loops launch in `mode` each get their
/// limit, and every one's turns show a fill within `range`.
fn thirty_and_sixty_meet_their_limits_with_fills(mode: &str, range: std::ops::RangeInclusive<f64>) {
    let _serial = serial();
    let (out, turns, solo) = share_turns_and_solo(&[Some(30), Some(60)], SECS, mode);
    // A host-bound loop's rate, its solo rate too, follows how much of
    // this machine's cores it gets, and the two are measured apart: beside
    // two busy loops a paced loop's solo rate fell from 9000 to 7400 a
    // second (nice -10, `serial`) and the 30 % container then got 0.358
    // of it. So the shares are judged only where the solo loop kept its
    // pace (a launch every 0.11 ms: 9091 a second), within 0.05, which
    // still catches a window counted in cost (0.545 at 60 %). The
    // accuracy itself is the GPU's to show (docs/benchmarks.md).
    if solo >= 8500.0 {
        assert_each_gets_its_limit_within(&out, 0.05);
    } else {
        // (Nor is the 60 % container's rate against the 30 % one's: 1.19
        // once, its loop too slow to fill its window.)
        eprintln!("shares not judged: the solo loop ran at {solo:.0}/s, the host too busy");
    }
    for t in turns.iter().flatten() {
        let fill = t["fill"].as_f64();
        assert!(
            fill.is_some_and(|f| range.contains(&f)),
            "fill {fill:?}, not in {range:?}"
        );
    }
}

#[test]
fn thirty_percent_beside_an_unlimited_neighbour() {
    let _serial = serial();
    let out = share(&[Some(30), None]);
    let (_, fraction, secs) = &out[0];
    assert!(
        (0.25..=0.33).contains(fraction),
        "got {fraction:.3} of solo; per second {secs:.3?}"
    );
}

#[test]
fn thirty_percent_of_long_kernels_beside_an_unlimited_neighbour() {
    // Most timings of a 1.6 ms kernel hold one of the neighbour's slices.
    // Costs taken from the last 8 timings were now and then all
    // straddled (fixed: `estimate` keeps 32), and windows covered but for
    // one probe cut up to a quarter of the share: a 30 % GEMM container
    // got 0.19-0.23 on an H200 (docs/benchmarks.md, run 57). Here it got
    // 0.234-0.25 until such a short window, and the window running while
    // the turns moved, stopped starting the covered streak anew.
    let _serial = serial();
    let (out, _) = share_and_turns(&[Some(30), None], SECS, SYNCED_LONG);
    let (_, fraction, secs) = &out[0];
    assert!(
        (0.25..=0.33).contains(fraction),
        "got {fraction:.3} of solo; per second {secs:.3?}"
    );
}

#[test]
fn unlimited_processes_time_slice_the_simulated_gpu() {
    // The model itself, without vgpu: two always-busy contexts get 0.456
    // of their solo throughput each on an H200 (the switches cost the
    // rest).
    let _serial = serial();
    let out = share(&[None, None]);
    let total: f64 = out.iter().map(|(_, f, _)| f).sum();
    assert!((0.87..=0.94).contains(&total), "together {total:.3}");
    for (_, f, _) in &out {
        assert!((0.42..=0.49).contains(f), "each {f:.3}");
    }
}

#[test]
fn a_container_is_back_at_its_limit_within_2_s_of_a_neighbour_leaving() {
    let _serial = serial();
    let solo = DEVICE_RATE;
    let (a, wa, b, wb) =
        one_then_another(&Sim::new(1, "8g"), ("a", Some(30), 14), ("b", Some(60), 5));
    eprintln!("30 %: {wa:.3?}\n60 % from 3 s to 8 s: {wb:.3?}");
    let fraction = a.f64("rate") / solo;
    assert!((fraction - 0.30).abs() <= 0.03, "30 % got {fraction:.3}");
    // Before the neighbour, beside it (after it settled), and from 2 s
    // after it left (it starts a few hundred ms after its spawn).
    for i in [1, 2, 6, 7, 11, 12, 13] {
        assert!(
            (wa[i] - 0.30).abs() <= 0.08,
            "second {i}: {:.3}; per second {wa:.3?}",
            wa[i]
        );
    }
    let fb = b.f64("rate") / solo;
    assert!((fb - 0.60).abs() <= 0.05, "the neighbour got {fb:.3}");
}

/// `smi putil`: each process's NVML SM utilisation over the last `ms`.
fn nvml_util(sim: &Sim, ms: u32) -> Vec<(u32, f64)> {
    let out = sim
        .cmd("smi", false)
        .args(["putil", "0", &ms.to_string()])
        .output()
        .expect("run smi");
    let r = Run::from(out);
    r.stdout
        .lines()
        .filter_map(|l| {
            let pid = l.strip_prefix("pid=")?.split(' ').next()?.parse().ok()?;
            let sm: f64 = l.split("sm=").nth(1)?.parse().ok()?;
            Some((pid, sm / 100.0))
        })
        .collect()
}

fn region_util(sim: &Sim, name: &str) -> f64 {
    let region = sim.dir.path().join(format!("{name}.cache"));
    let s = sim.status(&region);
    s["devices"][0]["utilization_percent"].as_f64().unwrap() / 100.0
}

#[test]
fn the_region_shows_the_container_s_true_utilisation() {
    let _serial = serial();
    // Alone on the GPU, NVML's figure is steady: equal within 0.02.
    let sim = Sim::new(1, "8g");
    let a = container_for(&sim, "a", Some(30), 8);
    std::thread::sleep(std::time::Duration::from_secs(5));
    let pid = a.id();
    let shown = region_util(&sim, "a");
    let nvml = nvml_util(&sim, 2000)
        .into_iter()
        .find(|&(p, _)| p == pid)
        .map_or(0.0, |(_, u)| u);
    finish(a).ok();
    assert!(
        (shown - nvml).abs() <= 0.02 && (shown - 0.30).abs() <= 0.03,
        "alone: region {shown:.3}, NVML {nvml:.3}"
    );
    // Beside a neighbour one NVML period goes to one process, so the
    // region shows the GPU time its admitted launches typically hold
    // instead: over the run, its true share (its fraction of the solo
    // rate: the solo loop keeps the simulated GPU busy). NVML's figure
    // over the same 2 s the region averages is printed, not judged: a
    // coin toss per period (0.265 for a true 0.300 in one run). Kernels
    // take up to 15 % longer than their work, as a GEMM's vary: a cost is
    // the least of their timings, so the cost admitted is under the time
    // held (0.562 shown for a true 0.593 when the region counted costs).
    let solo = solo_rate_jittered(DENSE, 15);
    let mut sim = Sim::new(1, "8g");
    sim.set("SIM_GPU_JITTER_PCT", "15");
    let a = container_for(&sim, "a", Some(30), 16);
    let b = container_for(&sim, "b", Some(60), 16);
    let (pa, pb) = (a.id(), b.id());
    std::thread::sleep(std::time::Duration::from_secs(3));
    let (mut shown, mut nvml) = ([0.0; 2], [0.0; 2]);
    let mut n = 0.0;
    for _ in 0..22 {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let now = nvml_util(&sim, 2000);
        for (i, (pid, name)) in [(pa, "a"), (pb, "b")].into_iter().enumerate() {
            shown[i] += region_util(&sim, name);
            nvml[i] += now
                .iter()
                .find(|&&(p, _)| p == pid)
                .map_or(0.0, |&(_, u)| u);
        }
        n += 1.0;
    }
    let truth = [finish(a).ok(), finish(b).ok()].map(|r| r.f64("rate") / solo);
    for i in 0..2 {
        let (s, v, t) = (shown[i] / n, nvml[i] / n, truth[i]);
        eprintln!("container {i}: region {s:.3}, NVML {v:.3}, true share {t:.3}");
        assert!(
            (s - t).abs() <= 0.02,
            "container {i}: region {s:.3}, NVML {v:.3}, true share {t:.3}"
        );
    }
}

/// `vgpuctl status`'s `turns.alone` for the region at `region`, or None
/// while the container has no turns.
fn alone(sim: &Sim, region: &std::path::Path) -> Option<bool> {
    sim.status(region)["devices"][0]["turns"]["alone"].as_bool()
}

#[test]
fn a_container_in_its_own_pid_namespace_is_not_alone_beside_a_neighbour() {
    // Driver 580 shows a caller in a pid namespace only that namespace's
    // processes (docs/benchmarks.md, run 18), as the simulator does: there
    // NVML's list holds the container's processes alone, and what tells
    // of the neighbour is the memory it holds.
    let _serial = serial();
    let unshare_ok = std::process::Command::new("unshare")
        .args(["-pf", "--mount-proc", "true"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !unshare_ok {
        eprintln!("SKIPPED: unshare --pid is not permitted here");
        return;
    }
    let mut sim = Sim::new(1, "8g");
    sim.set("SIM_GPU_HOST_PROC_FD", &host_proc_fd().to_string());
    let neighbour = container_for(&sim, "n", None, 4);
    let region = sim.dir.path().join("pidns.cache");
    let args = spin_args(10, DENSE);
    let limited = sim
        .cmd("/usr/bin/env", true)
        .args(["unshare", "-pf", "--mount-proc"])
        .arg(artifacts().bin.join("cuclient-via_link"))
        .args(&args)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .env("CUDA_DEVICE_SM_LIMIT", "30")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn cuclient in a pid namespace");
    let sample = |from_ms: u64, to_ms: u64, start: std::time::Instant| {
        let mut seen = Vec::new();
        while start.elapsed() < std::time::Duration::from_millis(to_ms) {
            if start.elapsed() >= std::time::Duration::from_millis(from_ms) {
                seen.push(alone(&sim, &region));
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
        seen
    };
    let start = std::time::Instant::now();
    let beside = sample(2000, 3500, start);
    let neighbour = finish(neighbour).ok();
    let after = sample(7000, 8500, start);
    let limited = finish(limited).ok();
    eprintln!(
        "alone beside the neighbour {beside:?}, after it left {after:?}; the limited one {:.0}/s, the neighbour {:.0}/s",
        limited.f64("rate"),
        neighbour.f64("rate")
    );
    // (None: no turns yet, on a slow machine.)
    assert!(
        beside.contains(&Some(false)) && !beside.contains(&Some(true)),
        "beside a neighbour: {beside:?}"
    );
    // Once it has gone, the same container in the same namespace is alone
    // (the check above is not one that can never pass).
    assert!(
        after.last() == Some(&Some(true)),
        "after the neighbour left: {after:?}"
    );
}

/// Synchronised 1 ms steps at 30 % beside a busy 60 % container, both at
/// a `period_ms` period, for 10 s: (steps' share of the GPU, p50, p99,
/// max in ms, the neighbour's share).
fn steps_beside_sixty(period_ms: u32) -> (f64, f64, f64, f64, f64) {
    let mut sim = Sim::new(1, "8g");
    sim.set("VGPU_SM_PERIOD_MS", &period_ms.to_string());
    steps_beside_sixty_on(sim, period_ms)
}

/// [`steps_beside_sixty`] on `sim`, whose period is `period_ms`.
fn steps_beside_sixty_on(sim: Sim, period_ms: u32) -> (f64, f64, f64, f64, f64) {
    steps_beside(sim, Some(60), 1_000_000, period_ms)
}

/// Synchronised steps of `step_ns` at 30 % beside a busy neighbour at
/// `limit` ([`container_for`]) on `sim`, whose period is `period_ms`:
/// (the steps' share of the GPU, p50, p99, max in ms, the neighbour's
/// share).
fn steps_beside(
    sim: Sim,
    limit: Option<u32>,
    step_ns: u64,
    period_ms: u32,
) -> (f64, f64, f64, f64, f64) {
    let (share, p50, p99, max, beside, _) = steps_at_beside(&sim, 30, limit, step_ns, period_ms);
    (share, p50, p99, max, beside)
}

/// [`steps_beside`], the steps at `steps_limit` percent; also what the
/// steps' process wrote to stderr (its log).
fn steps_at_beside(
    sim: &Sim,
    steps_limit: u32,
    limit: Option<u32>,
    step_ns: u64,
    period_ms: u32,
) -> (f64, f64, f64, f64, f64, String) {
    let solo = DEVICE_RATE;
    let neighbour = container_for(sim, "n", limit, 12);
    let step = step_ns.to_string();
    let mut steps = limited_client(
        sim,
        "steps",
        steps_limit,
        &["steps", &step, "132", "10", "2"],
    );
    if let Some(dir) = std::env::var_os("NEIGHBOURS_LOG_DIR") {
        let level = std::env::var("NEIGHBOURS_LOG_LEVEL").unwrap_or_else(|_| "4".into());
        let path = std::path::Path::new(&dir).join("steps.log");
        steps
            .env("LIBCUDA_LOG_LEVEL", level)
            .stderr(std::fs::File::create(path).expect("log file"));
    }
    let r = Run::from(steps.output().expect("run cuclient steps"));
    let n = finish(neighbour).ok();
    let r = r.ok();
    let share = r.f64("steps_per_s") * step_ns as f64 * 1e-9;
    let (p50, p99, max) = (r.f64("p50_ms"), r.f64("p99_ms"), r.f64("max_ms"));
    let beside = n.f64("rate") / solo;
    eprintln!(
        "{} ms steps at {steps_limit} % beside {limit:?}, configured period {period_ms} ms: share {share:.3} (neighbour {beside:.3}), p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms",
        step_ns as f64 * 1e-6
    );
    // (Its log went to a file where one was asked for.)
    let log = std::env::var_os("NEIGHBOURS_LOG_DIR")
        .and_then(|dir| std::fs::read_to_string(std::path::Path::new(&dir).join("steps.log")).ok())
        .unwrap_or_else(|| r.stderr.clone());
    (share, p50, p99, max, beside, log)
}

/// Issue 29: beside another limited container each one spends its share
/// of a period in one window, so a step that misses its window waits out
/// the rest of the period: about 70 ms at 30 % of the default 100 ms. At
/// a 20 ms period the wait is at most about 14 ms, and the shares hold.
/// (Wall time on a loaded machine: the bound is the period, which a
/// 100 ms period's wait exceeds three times over.)
#[test]
fn steps_beside_a_busy_neighbour_wait_at_most_a_short_period() {
    let _serial = serial();
    let (share, _, p99, _, beside) = steps_beside_sixty(20);
    assert!(p99 <= 20.0, "p99 {p99:.2} ms at a 20 ms period");
    // With the turns tuned to 100 ms the steps got 0.253 here (p99
    // 16 ms); tuned to the period, 0.268-0.282 (p99 11-16 ms). At 100 ms:
    // 0.264, p99 70 ms. (The share follows this machine's load too.)
    assert!(
        (0.25..=0.33).contains(&share),
        "the steps held {share:.3} of the GPU at 30 %"
    );
    assert!(
        (beside - 0.60).abs() <= 0.05,
        "the neighbour got {beside:.3}"
    );
}

/// A serving loop spends host time between its synchronised steps (a
/// PyTorch CUDA-graph loop 0.03 ms of every 0.1 ms step on an H100), its
/// stream dry meanwhile. Counted as time another context took, every
/// probe of its windows looked beside another, and in turns beside a
/// 60 % container its windows moved most periods and never settled
/// (H100 run 138: p99 2.5 ms for 0.1 ms steps). Here 0.3 ms steps with
/// 0.15 ms of host work after each (a 3 ms probe holds ten, 1.4 ms of
/// it dry): in turns, the windows settle.
#[test]
fn a_serving_loop_s_host_pauses_do_not_move_its_windows() {
    let _serial = serial();
    let sim = Sim::new(1, "8g");
    let neighbour = container_for(&sim, "n", Some(60), 14);
    let mut steps = limited_client(
        &sim,
        "steps",
        30,
        &["steps", "300000", "132", "10", "2", "150"],
    );
    steps.env("LIBCUDA_LOG_LEVEL", "4");
    let r = Run::from(steps.output().expect("run cuclient steps"));
    let _ = finish(neighbour);
    let r = r.ok();
    // Each debug line says when (the monotonic clock, s). A window that
    // met another context at its start moves later; one that opened clear
    // and ran into the next moves 0.5 ms earlier, into the room before it
    // (limiter/turns.rs). Count the later moves after the process's first
    // 6 s (2 of warming up, then placing the windows): without the host's
    // pauses taken out, 27 in the last 6 s here; with them, 0 or 1, and
    // up to 5 on a dev VM whose wake-ups ran late (2026-11-29: 5 in two
    // runs in a row of one CI run, and in 1 of 8 runs alone; the code
    // before 2026-11-29 gave 0-2 in 4 runs).
    let at = |l: &str| -> Option<f64> { l.split(' ').nth(2)?.trim_end_matches(']').parse().ok() };
    let start = r.stderr.lines().find_map(at).expect("a timed debug line");
    assert!(
        r.stderr.contains("DEBUG: turns:"),
        "the steps never took turns:\n{}",
        r.stderr
    );
    let moves: Vec<(f64, bool)> = r
        .stderr
        .lines()
        .filter(|l| l.contains("turns: the window met another context"))
        .filter_map(|l| Some((at(l)?, l.ends_with("later"))))
        .collect();
    let settled: Vec<bool> = moves
        .iter()
        .filter(|m| m.0 - start > 6.0)
        .map(|m| m.1)
        .collect();
    let later = settled.iter().filter(|&&l| l).count();
    eprintln!(
        "moves {} (after 6 s: {}, {later} of them later), steps p99 {:.2} ms",
        moves.len(),
        settled.len(),
        r.f64("p99_ms")
    );
    assert!(
        later <= 8,
        "the windows moved later {later} times after the first 6 s:\n{}",
        r.stderr
    );
}

/// The simulated GPU's UUID (GPU-51516d67-9000-...), whose SM board the
/// tests below find or forge.
const SIM_GPU_UUID: [u8; 16] = [
    0x51, 0x51, 0x6d, 0x67, 0x90, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// A simulated node whose containers share an SM board (HAMi's
/// `/tmp/vgpulock`, here a directory of the test's own).
fn with_a_board() -> Sim {
    with_a_board_on(1)
}

/// [`with_a_board`] with `gpus` GPUs.
/// One process that uses two GPUs (a container that sees both) gets its
/// limit on each: alone on the first, beside a 60 % container on the
/// second, whose share stays its own. (Its synchronisations' waits and
/// host gaps count on neither GPU: they count only for a process on one
/// device.)
#[test]
fn one_process_on_two_gpus_gets_its_limit_on_each_beside_a_neighbour_on_one() {
    let _serial = serial();
    let sim = with_a_board_on(2);
    let mut both = container_command(&sim, "a", Some(30), SECS, "twodev");
    both.env("CUDA_VISIBLE_DEVICES", "0,1");
    let both = both.spawn().expect("spawn cuclient");
    let beside = container_on(&sim, "b", Some(60), SECS, "1");
    let a = finish(both).ok();
    let b = finish(beside).ok();
    let first = (Some(30), a.f64("rate") / DEVICE_RATE, per_sec_of_device(&a));
    // (The second GPU's loop prints its rate only.)
    let second = (Some(30), a.f64("side_rate") / DEVICE_RATE, Vec::new());
    let neighbour = (Some(60), b.f64("rate") / DEVICE_RATE, per_sec_of_device(&b));
    for (what, (_, f, secs)) in [
        ("a on GPU 0", &first),
        ("a on GPU 1", &second),
        ("b on GPU 1", &neighbour),
    ] {
        eprintln!("{what}: {f:.3}; per second {secs:.3?}");
    }
    let (limited, status) = devices_in_turns(&sim, "a");
    assert_eq!(limited.len(), 2, "a's turns on both GPUs: {status}");
    assert_each_gets_its_limit(&[first, second, neighbour]);
}

/// The devices of container `name`'s region that show turns (`vgpuctl
/// status`), and the whole status.
fn devices_in_turns(sim: &Sim, name: &str) -> (Vec<serde_json::Value>, serde_json::Value) {
    let s = sim.status(&sim.dir.path().join(format!("{name}.cache")));
    let used = s["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .filter(|d| !d["turns"].is_null())
        .cloned()
        .collect();
    (used, s)
}

fn with_a_board_on(gpus: u32) -> Sim {
    let mut sim = Sim::new(gpus, "8g");
    let board = sim.dir.path().join("vgpulock");
    std::fs::create_dir(&board).unwrap();
    sim.set("VGPU_SM_BOARD_DIR", board.to_str().unwrap());
    sim
}

/// Issue 29: where the containers' limits leave part of the GPU free
/// (30 + 60), the node's SM board tells each so, and they pace their
/// shares evenly side by side, as alone, instead of taking turns: a
/// 1 ms step at 30 % waits about its share, not one step in thirty the
/// rest of a 100 ms period (p99 70 ms in turns, the test above).
#[test]
fn where_the_limits_leave_room_the_containers_pace_side_by_side() {
    let _serial = serial();
    let (out, turns, _) = share_on(with_a_board(), &[Some(30), Some(60)], SECS, DENSE);
    for t in &turns {
        let t = t.as_ref().expect("turns shown");
        assert_eq!(t["paced"], true, "{t}");
    }
    assert_each_gets_its_limit(&out);
    let (share, _, p99, _, beside) = steps_beside_sixty_on(with_a_board(), 100);
    // (Wall time on a loaded machine: 2x the ideal is 6.7 ms.)
    assert!(p99 <= 12.0, "p99 {p99:.2} ms paced beside 60 %");
    assert!(
        (0.26..=0.33).contains(&share),
        "the steps held {share:.3} of the GPU at 30 %"
    );
    assert!(
        (beside - 0.60).abs() <= 0.05,
        "the neighbour got {beside:.3}"
    );
}

/// Issue 29: 1 ms steps at 90 % beside a busy 10 % container take turns
/// (the limits fill the GPU). A 100 ms window holds about 88 of them, so
/// one in 88 waits out the other's window: p99 3.40 ms nested, 7.35 ms
/// placed, against twice the ideal, 2.25 (H200, runs 174-190). The steps
/// ask for a period at which a window holds 135 of them (150 ms), both
/// containers' turns take it, and they are placed end to end
/// (`limiter/period.rs`): p99 1.04-1.06 ms on an H200 (runs 204-205).
///
/// The same two containers hold a second GPU, where the steps are of
/// 10 ms and ask for nothing: a period is its GPU's own, and that one's
/// stays at 100 ms (at 130-150 ms, 10 ms steps waited 27-29 ms, run 195).
#[test]
fn short_steps_that_a_window_holds_too_few_of_lengthen_the_turns() {
    let _serial = serial();
    let sim = with_a_board_on(2);
    let beside_long = container_on(&sim, "n", Some(10), 12, "1");
    let long = limited_client(&sim, "steps", 90, &["steps", "10000000", "132", "10", "2"])
        .env("CUCLIENT_DEVICE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the second GPU's steps");
    let (share, p50, p99, _, beside, _) = steps_at_beside(&sim, 90, Some(10), 1_000_000, 100);
    let long = Run::from(long.wait_with_output().expect("the second GPU's steps")).ok();
    finish(beside_long).ok();
    // (The neighbour reads the period until a hold after the steps' exit,
    // 3 s, and its region keeps it.)
    let turns_on = |gpu: &str| -> Vec<(f64, f64)> {
        ["steps", "n"]
            .iter()
            .map(|name| {
                let s = sim.status(&sim.dir.path().join(format!("{name}.cache")));
                let devices = s["devices"].as_array().expect("devices");
                let d = devices
                    .iter()
                    .find(|d| d["uuid"].as_str().is_some_and(|u| u.ends_with(gpu)))
                    .unwrap_or_else(|| panic!("{name}: no entry for GPU ..{gpu}: {s}"));
                let t = &d["turns"];
                eprintln!("{name} on GPU ..{gpu}: turns {t}");
                let period = t["period_ms"].as_f64().expect("a period");
                (period, t["phase_ms"].as_f64().expect("a phase"))
            })
            .collect()
    };
    let turns = turns_on("00");
    // 150 ms for steps of 1.00 ms, and for any a little longer (the
    // longest). Both alike.
    let period = turns[0].0;
    assert!(period == 150.0 && turns[1].0 == period, "periods {turns:?}");
    // End to end: the 10 % window opens where the 90 % one's share ends.
    let apart = (turns[1].1 - turns[0].1).rem_euclid(period);
    assert!(
        (apart - 0.9 * period).abs() <= 0.6,
        "windows at {turns:?} ms"
    );
    // (Wall time on a loaded machine, 3.4 ms idle and 7.3 beside CI's
    // other tests: one step in 88 waiting out a whole window would put
    // p99 over 10 ms.)
    assert!(p99 <= 10.0, "p99 {p99:.2} ms (p50 {p50:.2})");
    // (What the 90 % window leaves unspent so as not to run into the
    // other's: 7 ms of 126 on this machine, 1-5 on an H200; 0.82-0.83
    // idle, 0.73 beside CI's other tests.)
    assert!(
        (0.70..=0.93).contains(&share),
        "the steps held {share:.3} of the GPU at 90 %"
    );
    assert!(
        (beside - 0.10).abs() <= 0.03,
        "the neighbour got {beside:.3}"
    );
    // The second GPU's turns, of the same two containers, at 100 ms.
    let second = turns_on("01");
    assert!(
        second.iter().all(|&(p, _)| p == 100.0),
        "the second GPU's periods {second:?}"
    );
    assert!(
        long.f64("steps_per_s") * 0.01 > 0.5,
        "the second GPU's steps held {:.3} of it",
        long.f64("steps_per_s") * 0.01
    );
}

/// Side by side, every hand-over between the contexts costs a switch,
/// and loops that synchronise often hand over at each synchronisation:
/// 30 + 60 of 0.05 ms kernels synchronised every 0.5 ms got 0.341 + 0.508
/// paced side by side on an H100 (run 128). The 60 % container, waiting
/// for the GPU most of the time yet short of its limit, asks for turns on
/// the board, and both keep their shares in turns.
#[test]
fn loops_that_hand_the_gpu_over_often_go_back_to_turns() {
    let _serial = serial();
    let (out, turns, _) = share_on(with_a_board(), &[Some(30), Some(60)], 20, SYNCED);
    for t in &turns {
        assert_eq!(t.as_ref().expect("turns shown")["paced"], false);
    }
    assert_each_gets_its_limit(&out);
}

/// 30 + 60 of 0.055 ms kernels synchronised every ten (as the 0.05 ms
/// loop of gpu-tests/neighbours.py on an H200): placed from the board on
/// lengthened turns with room after each window, where each kept 1.6 ms of
/// its share back and the 60 % one got 0.581 (0.565-0.579 on an H200,
/// runs 220-223).
#[test]
fn thirty_and_sixty_of_short_steps_placed_with_room_keep_nothing_back() {
    let _serial = serial();
    let solo = solo_rate_jittered(SYNCED_SHORT, 0);
    let sim = with_a_board();
    let limits = [Some(30), Some(60)];
    let children = containers_running(&sim, &limits, 20, SYNCED_SHORT);
    // What each leaves unspent while both run and are placed, from 8 s
    // to 16 s (at the end the one left alone goes back to its probes).
    let mut unspent: [Vec<f64>; 2] = Default::default();
    std::thread::sleep(std::time::Duration::from_secs(8));
    for _ in 0..8 {
        for (i, u) in unspent.iter_mut().enumerate() {
            let s = sim.status(&sim.dir.path().join(format!("c{i}.cache")));
            let t = &s["devices"][0]["turns"];
            eprintln!("c{i}: turns {t}");
            if t["placed"] == true && t["period_ms"] == 130.0 {
                u.push(t["unspent_ms"].as_f64().expect("unspent"));
            }
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    let out = shares_of(&limits, children, solo);
    assert_each_gets_its_limit(&out);
    // 0.55 ms steps at 60 % ask for 130 ms, and both are placed; the
    // shares leave 6.5 ms after each window, so neither keeps its share
    // back (1.6 and 1.1 ms before, the guard and two steps).
    for (i, mut u) in unspent.into_iter().enumerate() {
        assert!(
            u.len() >= 4,
            "c{i} placed at 130 ms in {} samples of 8",
            u.len()
        );
        u.sort_by(f64::total_cmp);
        assert!(u[u.len() / 2] < 0.3, "c{i} left {u:?} ms unspent");
    }
}

/// A server paced side by side beside a busy 60 % container: requests
/// of 1 ms arriving at random, 250 a second, at 30 %. Between requests it
/// has nothing to run; while it has one, its kernel time-slices with the
/// neighbour's. It gets less than its limit and waits in synchronisations
/// much of the time, as a loop short of the GPU does, but it is short of
/// requests: in turns a request that missed its 30 ms window waited out
/// the other 70 (H200 runs 203-204: p99 117-130 ms against 85). Judged
/// over the time it had work (`limiter/shortfall.rs`), it stays paced.
#[test]
fn a_server_between_requests_stays_paced_beside_others() {
    let _serial = serial();
    let sim = with_a_board();
    let neighbour = container_for(&sim, "n", Some(60), 14);
    let mut server = limited_client(
        &sim,
        "server",
        30,
        &["serve", "1000000", "132", "10", "2", "250", "3330"],
    );
    server.env("LIBCUDA_LOG_LEVEL", "4");
    let r = Run::from(server.output().expect("run cuclient serve"));
    let n = finish(neighbour).ok();
    let r = r.ok();
    let judged: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("paced side by side: got"))
        .collect();
    eprintln!(
        "{} spans judged, e.g. {:?}; p50 {:.2} ms, p99 {:.2} ms (ideal's {:.2}), {:.1} served a second; the neighbour {:.3}",
        judged.len(),
        judged.last(),
        r.f64("p50_ms"),
        r.f64("p99_ms"),
        r.f64("ideal_p99_ms"),
        r.f64("requests_per_s"),
        n.f64("rate") / DEVICE_RATE
    );
    // (Judged paced over most of its 12 s: a span is 0.3 s.)
    assert!(judged.len() >= 10, "{}", r.stderr);
    assert!(
        !r.stderr.contains("waiting for it: turns for"),
        "the server went to turns:\n{}",
        r.stderr
    );
    // (In turns 115 ms here, its ideal's 40: wall time on a loaded
    // machine.)
    assert!(r.f64("p99_ms") <= 90.0, "p99 {:.2} ms", r.f64("p99_ms"));
    // Open loop: every request served.
    assert!(
        (r.f64("requests_per_s") - 250.0).abs() <= 25.0,
        "{} served a second",
        r.f64("requests_per_s")
    );
    assert!(
        (n.f64("rate") / DEVICE_RATE - 0.60).abs() <= 0.05,
        "the neighbour got {:.3}",
        n.f64("rate") / DEVICE_RATE
    );
}

/// Whoever can write the board's directory may put anything at a board's
/// name: here a FIFO, where an open that waited for a writer would hang
/// the container's leader. The container goes on (it takes turns beside
/// others, alone it is paced as ever), says why once, and keeps its limit.
#[test]
fn a_fifo_in_place_of_the_board_hangs_nothing() {
    let _serial = serial();
    let sim = with_a_board();
    let name = vgpu_shm::sm_board::file_name(&SIM_GPU_UUID);
    let fifo = sim.dir.path().join("vgpulock").join(name);
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
    let child = container_running(&sim, "c", Some(30), 4, DENSE);
    let r = finish(child).ok();
    let share = r.f64("rate") / DEVICE_RATE;
    assert!((share - 0.30).abs() <= 0.03, "got {share:.3}");
    assert!(
        r.stderr.contains("SM board in") && r.stderr.contains("not a plain file"),
        "{}",
        r.stderr
    );
}

/// Issue 29: a busy container without an SM limit that runs free leaves
/// a limited neighbour no room: every step of the neighbour waits out its
/// time slice. Beside a limited container it takes the rest instead
/// (`limiter/rest.rs`): 60 % beside 30 %, paced side by side as a 60 %
/// container would be; and once the limited one is gone, the whole GPU
/// again.
#[test]
fn a_container_without_a_limit_takes_the_rest_beside_a_limited_one() {
    let _serial = serial();
    let sim = with_a_board();
    let free = container_for(&sim, "free", Some(0), 15);
    std::thread::sleep(std::time::Duration::from_secs(3));
    let limited = container_for(&sim, "limited", Some(30), 8);
    // While both run, the one without a limit shows the rest it takes.
    let region = sim.dir.path().join("free.cache");
    let mut rests = Vec::new();
    let seen = wait_until(8.0, || {
        let s = sim.status(&region);
        rests.push(s["devices"][0]["sm_rest_percent"].as_u64());
        rests.last() == Some(&Some(60))
    });
    assert!(seen, "rest never 60: {rests:?}");
    let l = finish(limited).ok();
    let f = finish(free).ok();
    let wl = per_sec_of_device(&l);
    let wf = per_sec_of_device(&f);
    eprintln!("30 % from 3 s: {wl:.3?}\nwithout a limit: {wf:.3?}");
    let fl = l.f64("rate") / DEVICE_RATE;
    assert!((fl - 0.30).abs() <= 0.03, "the limited one got {fl:.3}");
    // Alone before, beside it once settled, and alone after it left (its
    // slot on the board goes with its process).
    assert!(wf[1] >= 0.9, "alone: {:.3}; {wf:.3?}", wf[1]);
    let beside = wf[6..10].iter().sum::<f64>() / 4.0;
    assert!(
        (beside - 0.60).abs() <= 0.05,
        "beside 30 %: {beside:.3}; {wf:.3?}"
    );
    assert!(wf[14] >= 0.9, "after: {:.3}; {wf:.3?}", wf[14]);
    assert_eq!(sim.status(&region)["devices"][0]["sm_rest_percent"], 0);
}

/// The leaders' words on who is beside them (`rest_beside_ns`,
/// `limited_beside_ns`), which decide how windows are judged: 30 % and
/// 60 % busy beside a container taking the rest, on one board. Each
/// limited one finds a limited one beside it, and not only rests; the
/// rest never marks itself beside a limited one (it yields, and looks for
/// nothing more).
#[test]
fn the_leaders_note_who_is_beside_them_on_the_board() {
    let _serial = serial();
    let sim = with_a_board();
    let kids = [
        container_for(&sim, "thirty", Some(30), 10),
        container_for(&sim, "sixty", Some(60), 10),
        container_for(&sim, "rest", Some(0), 10),
    ];
    let now = vgpu_shm::procinfo::monotonic_ns;
    // (rest_beside, limited_beside) of each container's device, if up.
    let words = |name: &str| {
        let path = sim.dir.path().join(format!("{name}.cache"));
        let r = vgpu_shm::Region::open(&path, vgpu_shm::OpenMode::ExistingOnly).ok()?;
        let e = vgpu_shm::EntryIndex::all().find(|&e| r.device(e).is_used())?;
        let d = r.device(e);
        Some((d.rest_beside(now()), d.limited_beside(now())))
    };
    let mut seen = Vec::new();
    let ok = wait_until(8.0, || {
        seen = ["thirty", "sixty", "rest"].map(words).to_vec();
        seen[0] == Some((false, true)) && seen[1] == Some((false, true))
    });
    assert!(
        ok,
        "(rest_beside, limited_beside) of 30, 60, rest: {seen:?}"
    );
    // The rest's own words, over the seconds both limited ones run.
    for _ in 0..20 {
        let rest = words("rest");
        assert_eq!(rest.map(|w| w.1), Some(false), "the rest: {rest:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for k in kids {
        let _ = finish(k);
    }
}

/// Whoever can write the board's directory may claim a busy limited
/// neighbour that does not exist, one that asks for turns. A 30 %
/// container beside the forged claim takes turns and takes its word for
/// a limited neighbour (`limited_beside_ns`), which changes only how its
/// windows are judged: with no one really beside it, it keeps its limit
/// and ends on time.
#[test]
fn a_forged_limited_neighbour_on_the_board_costs_no_share() {
    let _serial = serial();
    let sim = with_a_board();
    let dir = sim.dir.path().join("vgpulock");
    let mut board = vgpu_shm::sm_board::SmBoard::open(&dir, &SIM_GPU_UUID).expect("open the board");
    let claim = vgpu_shm::sm_board::Claim::limit(60, true);
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Stops the publisher however the scope ends: a panic before the
    // scope joins it would otherwise wait for it for ever.
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            // Fresh all the time, as a busy container's claim is.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if board
                    .publish(claim, vgpu_shm::procinfo::monotonic_ns())
                    .is_err()
                {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        });
        let started = std::time::Instant::now();
        let mut child = container_for(&sim, "c", Some(30), 6);
        let region = sim.dir.path().join("c.cache");
        // Samples in which the container both took the claim for a
        // limited neighbour and ran in turns, and in which it believed
        // the claim but paced: until the container exits.
        let (mut in_turns, mut paced) = (0, 0);
        while matches!(child.try_wait(), Ok(None)) && started.elapsed().as_secs() < 20 {
            if let Ok(r) = vgpu_shm::Region::open(&region, vgpu_shm::OpenMode::ExistingOnly) {
                let now = vgpu_shm::procinfo::monotonic_ns();
                for e in vgpu_shm::EntryIndex::all() {
                    let d = r.device(e);
                    if d.is_used() && d.limited_beside(now) {
                        if d.paced(now) {
                            paced += 1;
                        } else {
                            in_turns += 1;
                        }
                    }
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let r = finish(child);
        let took = started.elapsed().as_secs_f64();
        let share = r.f64("rate") / DEVICE_RATE;
        eprintln!(
            "beside a forged 60 % asking for turns: {share:.3} in {took:.1} s; \
             samples in turns {in_turns}, paced {paced}"
        );
        assert!(r.status.success(), "{}", r.stderr);
        assert!(
            in_turns > 0,
            "the forged claim was never taken for a neighbour that takes turns"
        );
        assert_eq!(paced, 0, "paced beside a claim that asks for turns");
        assert!((share - 0.30).abs() <= 0.03, "got {share:.3}\n{}", r.stderr);
        assert!(took < 6.0 + 10.0, "a 6 s run took {took:.1} s");
    });
}

/// Short synchronised steps at 30 % beside a busy container without a
/// limit: beside it running free each waits out its time slice; beside it
/// taking the rest the limited loop, paced side by side, goes short of the
/// GPU and asks for turns, and both take turns: the steps run in their
/// windows.
#[test]
fn short_steps_beside_a_container_without_a_limit_get_their_turns() {
    let _serial = serial();
    let (share, p50, p99, _, beside) = steps_beside(with_a_board(), Some(0), 200_000, 100);
    let (free_share, free_p50, _, _, _) = {
        let mut sim = with_a_board();
        sim.set("VGPU_SM_YIELD", "false");
        steps_beside(sim, Some(0), 200_000, 100)
    };
    eprintln!(
        "yielding: share {share:.3}, p50 {p50:.2} ms, p99 {p99:.2} ms; free: share {free_share:.3}, p50 {free_p50:.2} ms"
    );
    // Free beside it, a step waits for its slice (p50 2.6 ms here, 0.08
    // of the GPU). The simulated GPU's windows meet at their edges more
    // than an H100's, whose p99 is the GPU's to show (gpu-tests
    // `latency`): here as beside a 60 % container, p99 about 2.6 ms and
    // 0.2-0.25 of the GPU in the first 12 s.
    assert!(free_p50 >= 2.0, "free beside it, p50 {free_p50:.2} ms");
    assert!(p50 <= 1.0, "p50 {p50:.2} ms beside it taking the rest");
    assert!(
        share >= 0.15 && share >= 2.0 * free_share,
        "the steps held {share:.3} of the GPU at 30 % ({free_share:.3} beside it free)"
    );
    assert!(beside >= 0.5, "the neighbour got {beside:.3}");
}

/// Short steps at 10 %, whose 10 ms windows in turns would hold too
/// few of them (one in each waits out the period: p99 90 ms on an H200),
/// beside a container without a limit: short of the GPU paced beside its
/// rest of 80 %, they ask it for room for their switches instead of for
/// turns, and stay paced (limiter/room.rs, `steps_room`).
#[test]
fn short_steps_at_a_small_limit_ask_the_rest_for_room() {
    let _serial = serial();
    let mut sim = with_a_board();
    sim.set("LIBCUDA_LOG_LEVEL", "4");
    let (share, p50, p99, max, beside, log) = steps_at_beside(&sim, 10, Some(0), 200_000, 100);
    // It asked for room, not turns.
    assert!(
        log.contains("asks the rest for room"),
        "no room asked:\n{}",
        log.lines()
            .filter(|l| l.contains("side by side"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(!log.contains(": turns for"), "it asked for turns");
    // Paced, no step waits out a period (90 ms in turns).
    assert!(max < 40.0, "max {max:.2} ms, p50 {p50:.2}, p99 {p99:.2}");
    assert!(
        (share - 0.10).abs() <= 0.03,
        "the steps held {share:.3} of the GPU at 10 %"
    );
    // The rest left room: under its 80 %, more than its least.
    assert!(
        (0.2..0.75).contains(&beside),
        "the neighbour without a limit got {beside:.3}"
    );
}

/// A container without a limit on two GPUs, a limited one beside it on
/// the first only: it takes the rest there, and runs free on the other
/// (each device's leader reads its own GPU's board).
#[test]
fn a_container_without_a_limit_on_two_gpus_takes_the_rest_only_where_limits_are() {
    let _serial = serial();
    let sim = with_a_board_on(2);
    let limited = container_on(&sim, "limited", Some(30), 10, "0");
    let first = container_on(&sim, "free", Some(0), 10, "0");
    let second = container_on(&sim, "free", Some(0), 10, "1");
    let (l, f0, f1) = (
        finish(limited).ok(),
        finish(first).ok(),
        finish(second).ok(),
    );
    let (wl, w0, w1) = (
        per_sec_of_device(&l),
        per_sec_of_device(&f0),
        per_sec_of_device(&f1),
    );
    eprintln!("30 % on GPU 0: {wl:.3?}\nwithout a limit, GPU 0: {w0:.3?}\nGPU 1: {w1:.3?}");
    let mean = |w: &[f64]| w[3..9].iter().sum::<f64>() / 6.0;
    assert!(
        (mean(&wl) - 0.30).abs() <= 0.03,
        "the limited one: {wl:.3?}"
    );
    assert!(
        (mean(&w0) - 0.60).abs() <= 0.05,
        "beside 30 % on GPU 0: {w0:.3?}"
    );
    assert!(mean(&w1) >= 0.9, "alone on GPU 1: {w1:.3?}");
}

/// The other start order: the limited container first, alone for 3 s,
/// then the one without a limit, which takes its rest from its first
/// second beside it.
#[test]
fn a_container_without_a_limit_that_comes_second_takes_the_rest_too() {
    let _serial = serial();
    let (l, wl, _, wf) = one_then_another(
        &with_a_board(),
        ("limited", Some(30), 12),
        ("free", Some(0), 8),
    );
    eprintln!("30 %: {wl:.3?}\nwithout a limit from 3 s: {wf:.3?}");
    let fl = l.f64("rate") / DEVICE_RATE;
    assert!((fl - 0.30).abs() <= 0.03, "the limited one got {fl:.3}");
    let beside = wf[2..7].iter().sum::<f64>() / 5.0;
    assert!(
        (beside - 0.60).abs() <= 0.05,
        "beside 30 %: {beside:.3}; {wf:.3?}"
    );
}
