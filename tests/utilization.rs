//! The container utilisation operators read (`vgpuctl status`'s UTIL,
//! `hami_container_device_utilization_ratio`) equals what HAMi's monitor
//! computes from the same file, in every policy and switch state, and
//! follows the work (never frozen). The reference is hami_reader's
//! summary, which sums `device_util[d].sm_util` over `procs[0..proc_num)`
//! skipping `status == 0`, as HAMi's Go monitor does (`DeviceSmUtil`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;

/// hami_reader, built from the header once per test binary.
fn reader() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let exe = artifacts().bin.join("hami_reader_util");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/programs/hami_reader.c");
        let cc = Command::new("cc")
            .args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(src)
            .output()
            .unwrap();
        assert!(
            cc.status.success(),
            "{}",
            String::from_utf8_lossy(&cc.stderr)
        );
        exe
    })
}

/// HAMi's figure for device 0 and proc_num, None while the file is not a
/// region the reader accepts.
fn hami_util(region: &Path) -> Option<(u64, u64)> {
    let out = Command::new(reader())
        .arg(region)
        .args(["watch", "0", "1"])
        .output()
        .unwrap();
    let r = Run::from(out);
    let get = |k: &str| r.kv.get(k).and_then(|v| v.parse().ok());
    if !r.status.success() {
        return None;
    }
    Some((get("dev0.sm_util")?, get("proc_num")?))
}

fn set_switch(region: &Path, v: i64) {
    Run::from(
        Command::new(reader())
            .arg(region)
            .args(["set", "utilization_switch", &v.to_string()])
            .output()
            .unwrap(),
    )
    .ok();
}

/// vgpuctl's figure (status --json) and the exporter's source are the same.
fn ctl_util(sim: &Sim, region: &Path) -> f64 {
    sim.status(region)["devices"][0]["utilization_percent"]
        .as_f64()
        .unwrap()
}

/// One consistent reading: vgpuctl's figure read between two of HAMi's
/// that agree with each other (the figures change once a second).
fn reading(sim: &Sim, region: &Path) -> (u64, f64) {
    for _ in 0..20 {
        let (a, _) = hami_util(region).unwrap();
        let ctl = ctl_util(sim, region);
        let (b, _) = hami_util(region).unwrap();
        if a == b {
            return (a, ctl);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the HAMi figure never held still for one reading");
}

/// Readings every 0.4 s for `secs`; each must agree.
fn follow(sim: &Sim, region: &Path, secs: f64) -> Vec<(u64, f64)> {
    let t = Instant::now();
    let mut out = Vec::new();
    while t.elapsed().as_secs_f64() < secs {
        let (h, c) = reading(sim, region);
        assert_eq!(c, h as f64, "vgpuctl {c} where HAMi's monitor reads {h}");
        out.push((h, c));
        std::thread::sleep(Duration::from_millis(400));
    }
    out
}

fn spin(sim: &Sim, secs: u32) -> std::process::Child {
    let s = secs.to_string();
    let child = sim.spawn_client(Path3::Link, true, &["spin", "1000000", "132", &s, "kernel"]);
    let region = sim.region();
    assert!(wait_until(10.0, || hami_util(&region).is_some_and(|(_, n)| n == 1)));
    child
}

fn mean(v: &[(u64, f64)]) -> f64 {
    v.iter().map(|x| x.1).sum::<f64>() / v.len() as f64
}

#[test]
fn no_sm_limit_a_busy_container_shows_its_utilisation() {
    let _serial = serial();
    let sim = Sim::new(1, "8g");
    let child = spin(&sim, 8);
    std::thread::sleep(Duration::from_secs(3));
    let seen = follow(&sim, &sim.region(), 3.0);
    finish(child).ok();
    assert!(mean(&seen) >= 80.0, "{seen:?}");
}

/// Readings from 2 s after the monitor switches limiting off at 4 s.
fn switched_off(policy: &str) -> Vec<(u64, f64)> {
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_SM_LIMIT", "20")
        .set("GPU_CORE_UTILIZATION_POLICY", policy);
    let child = spin(&sim, 11);
    let region = sim.region();
    std::thread::sleep(Duration::from_secs(3));
    let before = follow(&sim, &region, 1.0);
    set_switch(&region, 0);
    std::thread::sleep(Duration::from_secs(2));
    let after = follow(&sim, &region, 3.0);
    finish(child).ok();
    let b = mean(&before);
    assert!((10.0..=35.0).contains(&b), "{policy}, limited: {before:?}");
    after
}

#[test]
fn switch_off_under_the_default_policy_shows_the_lifted_utilisation() {
    let _serial = serial();
    let after = switched_off("default");
    assert!(mean(&after) >= 60.0, "default, switched off: {after:?}");
}

#[test]
fn switch_off_under_force_still_agrees_with_hami() {
    let _serial = serial();
    let after = switched_off("force");
    let m = mean(&after);
    assert!((10.0..=35.0).contains(&m), "force, switched off: {after:?}");
}

#[test]
fn the_disable_policy_shows_the_unlimited_utilisation() {
    let _serial = serial();
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_SM_LIMIT", "20")
        .set("GPU_CORE_UTILIZATION_POLICY", "disable");
    let child = spin(&sim, 8);
    std::thread::sleep(Duration::from_secs(3));
    let seen = follow(&sim, &sim.region(), 3.0);
    finish(child).ok();
    assert!(mean(&seen) >= 80.0, "{seen:?}");
}

#[test]
fn the_figure_follows_busy_and_idle_spells_after_the_switch() {
    let _serial = serial();
    let mut sim = Sim::new(1, "8g");
    sim.set("CUDA_DEVICE_SM_LIMIT", "20");
    // Bursts of 2000 1 ms kernels, 4 s idle between, the process alive.
    let child = sim.spawn_client(
        Path3::Link,
        true,
        &["bursts", "1048576", "0", "1", "2000", "4", "4"],
    );
    let region = sim.region();
    assert!(wait_until(10.0, || hami_util(&region).is_some_and(|(_, n)| n == 1)));
    set_switch(&region, 0);
    let seen = follow(&sim, &region, 12.0);
    finish(child).ok();
    let high = seen.iter().filter(|x| x.1 >= 50.0).count();
    let idle = seen.iter().filter(|x| x.1 <= 5.0).count();
    // Busy, then idle, and busy again: the figure moved both ways.
    let first_high = seen.iter().position(|x| x.1 >= 50.0);
    let idle_after = first_high.and_then(|i| seen[i..].iter().position(|x| x.1 <= 5.0));
    assert!(high >= 2 && idle >= 2 && idle_after.is_some(), "{seen:?}");
}
