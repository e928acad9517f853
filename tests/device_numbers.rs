//! `_N` names the container's N-th device, whichever process registers
//! the device first (issue 10, bug 1): the order of
//! `NVIDIA_VISIBLE_DEVICES` when it lists UUIDs, else NVML's enumeration,
//! never a process's `CUDA_VISIBLE_DEVICES`-adjusted ordinal. Limits in
//! the region win over later processes, so a wrong first registration
//! would stand for the container's life.
//!
//! Two simulated GPUs, `_0` = 1 GiB and `_1` = 3 GiB, registered first by
//! a CUDA process that sees only the second card (a per-rank launcher's
//! `CUDA_VISIBLE_DEVICES=1`), by an NVML process (nvidia-smi), or by both
//! at once.

mod common;

use std::process::Child;

use common::*;

const LIMIT_0: u64 = GIB;
const LIMIT_1: u64 = 3 * GIB;

/// The simulated GPU's UUID of physical device `d`, as NVML prints it.
fn uuid(d: u8) -> String {
    format!("GPU-51516d67-9000-0000-0000-0000000000{d:02x}")
}

fn machine() -> Sim {
    let mut sim = Sim::new(2, "8g");
    sim.set("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .set("CUDA_DEVICE_MEMORY_LIMIT_1", "3g");
    sim
}

/// A CUDA process that sees only physical device `visible` (as its
/// ordinal 0): the total its cuMemGetInfo reports.
fn cuda_total(sim: &Sim, visible: &str) -> u64 {
    let r = cuda_cmd(sim, visible).output().expect("run cuclient");
    Run::from(r).ok().u64("during_total")
}

fn cuda_cmd(sim: &Sim, visible: &str) -> std::process::Command {
    let mut c = sim.client_cmd(Path3::Dlsym, true, &["alloc", "buffer", "1048576"]);
    c.env("CUDA_VISIBLE_DEVICES", visible);
    c
}

/// What nvidia-smi shows as each card's total (NVML's enumeration).
fn smi_totals(sim: &Sim) -> (u64, u64) {
    let r = Run::from(sim.cmd("smi", true).output().expect("run smi")).ok();
    (r.u64("gpu0_v1_total"), r.u64("gpu1_v1_total"))
}

/// The memory limit the region holds for the card with `uuid`.
fn region_limit(sim: &Sim, uuid: &str) -> Option<u64> {
    let s = sim.status(&sim.region());
    s["devices"]
        .as_array()?
        .iter()
        .find(|d| d["uuid"] == uuid)?["memory_limit_bytes"]
        .as_u64()
}

/// Every later process, through either API and any `CUDA_VISIBLE_DEVICES`,
/// sees `_0` on the first card and `_1` on the second.
fn assert_registered_right(sim: &Sim) {
    assert_eq!(smi_totals(sim), (LIMIT_0, LIMIT_1), "nvidia-smi's view");
    assert_eq!(
        cuda_total(sim, "1"),
        LIMIT_1,
        "the second card through CUDA"
    );
    assert_eq!(cuda_total(sim, "0"), LIMIT_0, "the first card through CUDA");
    assert_eq!(
        cuda_total(sim, "1,0"),
        LIMIT_1,
        "the second card as ordinal 0"
    );
    assert_eq!(region_limit(sim, &uuid(0)), Some(LIMIT_0), "first card");
    assert_eq!(region_limit(sim, &uuid(1)), Some(LIMIT_1), "second card");
}

#[test]
fn cuda_first_with_a_narrowed_view() {
    let sim = machine();
    // Its ordinal 0 is the second card: it must get _1's limit.
    assert_eq!(cuda_total(&sim, "1"), LIMIT_1);
    assert_registered_right(&sim);
}

#[test]
fn nvml_first() {
    let sim = machine();
    assert_eq!(smi_totals(&sim), (LIMIT_0, LIMIT_1));
    assert_registered_right(&sim);
}

#[test]
fn cuda_and_nvml_at_once() {
    for _ in 0..3 {
        let sim = machine();
        let spawn = |mut c: std::process::Command| -> Child {
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        };
        let racers = [
            spawn(cuda_cmd(&sim, "1")),
            spawn(sim.cmd("smi", true)),
            spawn(cuda_cmd(&sim, "1,0")),
        ];
        for r in racers {
            finish(r).ok();
        }
        assert_registered_right(&sim);
    }
}

#[test]
fn nvidia_visible_devices_gives_the_order() {
    // The device plugin gave this container the second card first.
    let mut sim = machine();
    sim.set(
        "NVIDIA_VISIBLE_DEVICES",
        &format!("{},{}", uuid(1), uuid(0)),
    );
    assert_eq!(cuda_total(&sim, "1"), LIMIT_0, "the second card is _0");
    assert_eq!(smi_totals(&sim), (LIMIT_1, LIMIT_0));
    assert_eq!(region_limit(&sim, &uuid(1)), Some(LIMIT_0));
    assert_eq!(region_limit(&sim, &uuid(0)), Some(LIMIT_1));
}

#[test]
fn without_nvml_a_device_gets_the_least_limit() {
    let mut sim = machine();
    sim.set("SIM_GPU_NVML", "0");
    let out = cuda_cmd(&sim, "1").output().expect("run cuclient");
    let r = Run::from(out).ok();
    assert_eq!(r.u64("during_total"), LIMIT_0, "fail closed: the least");
    assert!(r.stderr.contains("cannot be told"), "{}", r.stderr);
    // Only `_N` makes the number matter: a global limit needs no NVML.
    let mut sim = Sim::new(2, "8g");
    sim.set("SIM_GPU_NVML", "0")
        .set("CUDA_DEVICE_MEMORY_LIMIT", "2g");
    let out = cuda_cmd(&sim, "1").output().expect("run cuclient");
    let r = Run::from(out).ok();
    assert_eq!(r.u64("during_total"), 2 * GIB);
    assert!(!r.stderr.contains("cannot be told"), "{}", r.stderr);
}
