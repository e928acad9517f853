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

fn spin_args(secs: u32) -> Vec<String> {
    vec![
        "spin".into(),
        KERNEL_NS.to_string(),
        "132".into(),
        secs.to_string(),
        "kernel".into(),
    ]
}

/// Per-second completions of a spin run.
fn per_sec(r: &Run) -> Vec<f64> {
    r.get("per_sec")
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect()
}

/// A container on `sim`'s GPU: its own region, and `limit` if any; with
/// no limit it runs without vgpu at all.
fn container(sim: &Sim, name: &str, limit: Option<u32>) -> Child {
    let args = spin_args(SECS);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = sim.client_cmd(Path3::ProcAddr, limit.is_some(), &args);
    c.env(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        sim.dir.path().join(format!("{name}.cache")),
    );
    match limit {
        Some(l) => c.env("CUDA_DEVICE_SM_LIMIT", l.to_string()),
        None => c.env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE"),
    };
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn cuclient")
}

/// The rate of one process alone and unlimited.
fn solo_rate() -> f64 {
    let args = spin_args(3);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Sim::new(1, "8g")
        .client(Path3::ProcAddr, true, &args)
        .ok()
        .f64("rate")
}

/// Runs the containers at once; (limit, fraction of solo, per-second
/// fractions) of each.
fn share(limits: &[Option<u32>]) -> Vec<(Option<u32>, f64, Vec<f64>)> {
    let solo = solo_rate();
    let sim = Sim::new(1, "8g");
    let children: Vec<Child> = limits
        .iter()
        .enumerate()
        .map(|(i, &l)| container(&sim, &format!("c{i}"), l))
        .collect();
    let runs: Vec<Run> = children.into_iter().map(|c| finish(c).ok()).collect();
    let out: Vec<_> = limits
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

#[test]
fn two_containers_at_30_and_60_each_get_their_limit() {
    let _serial = serial();
    for (limit, fraction, secs) in share(&[Some(30), Some(60)]) {
        let want = f64::from(limit.unwrap()) / 100.0;
        assert!(
            (fraction - want).abs() <= 0.03,
            "limit {want}: got {fraction:.3} of solo; per second {secs:.3?}"
        );
        for (i, f) in secs.iter().enumerate().skip(3) {
            assert!(
                (f - want).abs() <= 0.08,
                "limit {want}, second {i}: {f:.3}; per second {secs:.3?}"
            );
        }
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
