//! The elected controller of a device's bucket. One process of the
//! container leads each limited device (a lease in the region, renewed
//! every tick, taken over after 3 s of silence or when its holder dies);
//! it reads NVML's per-process SM utilisation for the container's
//! processes and steers the bucket's refill scale.
//!
//! When utilisation samples cannot be had (NVML missing, unsupported, or a
//! process of the container whose host pid is unknown) it says so once and
//! leaves the scale at 1.0: the bucket then runs open-loop on event-timed
//! costs (0.30 +- 0.003 for 1 ms and 10 ms kernels in a prototype on an
//! H200). It never runs unlimited.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use vgpu_shm::MAX_DEVICES;
use vgpu_shm::layout::DeviceEntry;
use vgpu_shm::procinfo::pid_exists;

use super::controller::Controller;
use crate::attach::Attach;
use crate::clock;
use crate::nvml::client;

/// Seconds without a heartbeat before another process takes over.
const LEASE_S: u64 = 3;
const CONTROL_PERIOD_NS: u64 = 500_000_000;
/// A bucket idle this long starts its next workload at scale 1.0.
const IDLE_RESET_NS: u64 = 10_000_000_000;

#[derive(Default, Clone, Copy)]
struct Device {
    leading: bool,
    last_seen_us: u64,
    last_control_ns: u64,
    last_waits: u64,
}

#[derive(Default)]
pub struct Leader {
    devices: [Device; MAX_DEVICES],
}

fn monotonic_s() -> u64 {
    clock::monotonic_ns() / 1_000_000_000
}

/// Takes or renews the lease on `entry`; true while we hold it.
pub fn elect(entry: &DeviceEntry, me: u32) -> bool {
    let now = monotonic_s();
    let mine = u64::from(me) << 32 | (now & 0xffff_ffff);
    let cur = entry.leader.load(Ordering::Acquire);
    let (pid, beat) = ((cur >> 32) as u32, cur & 0xffff_ffff);
    if pid == me {
        entry.leader.store(mine, Ordering::Release);
        return true;
    }
    let stale =
        pid == 0 || (now & 0xffff_ffff).wrapping_sub(beat) > LEASE_S || !pid_exists(pid as i32);
    stale
        && entry
            .leader
            .compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
}

impl Leader {
    /// One watcher tick for device entry `dev`.
    pub fn tick(&mut self, attach: &Attach, dev: usize) {
        let entry = attach.region.device(dev);
        let percent = entry.sm_limit.load(Ordering::Relaxed);
        let state = &mut self.devices[dev];
        if percent == 0 || !elect(entry, std::process::id()) {
            state.leading = false;
            return;
        }
        let now = clock::monotonic_ns();
        if !state.leading {
            *state = Device {
                leading: true,
                last_seen_us: clock::unix_us(),
                last_control_ns: now,
                last_waits: entry.waits.load(Ordering::Relaxed),
            };
            log::debug!("leading the compute bucket of device entry {dev}");
            return;
        }
        if now.saturating_sub(state.last_control_ns) < CONTROL_PERIOD_NS {
            return;
        }
        state.last_control_ns = now;
        if now.saturating_sub(entry.tat_ns.load(Ordering::Relaxed)) > IDLE_RESET_NS {
            entry.rate_scale_milli.store(1000, Ordering::Relaxed);
        }
        let Some(measured) = container_utilisation(attach, dev, &mut state.last_seen_us) else {
            entry.rate_scale_milli.store(1000, Ordering::Relaxed);
            return;
        };
        let waits = entry.waits.load(Ordering::Relaxed);
        let throttled = waits != state.last_waits;
        state.last_waits = waits;
        let scale_milli = match entry.rate_scale_milli.load(Ordering::Relaxed) {
            0 => 1000,
            s => s,
        };
        let mut c = Controller::new(f64::from(scale_milli) / 1000.0);
        let scale = c.update(f64::from(percent) / 100.0, measured, throttled);
        entry
            .rate_scale_milli
            .store((scale * 1000.0).round() as u32, Ordering::Relaxed);
        entry
            .util_milli
            .store((measured * 1000.0).round() as u32, Ordering::Relaxed);
    }
}

/// The container's SM utilisation of `dev` since the last call, as a
/// fraction; None when it cannot be measured.
fn container_utilisation(attach: &Attach, dev: usize, last_seen_us: &mut u64) -> Option<f64> {
    let region = &attach.region;
    let mut pids = Vec::new();
    for i in region.occupied_slots() {
        let slot = region.slot(i);
        if region.slot_total(i, dev) == 0 {
            continue;
        }
        match slot.host_pid.load(Ordering::Acquire) {
            0 if pid_exists(slot.pid.load(Ordering::Acquire)) => {
                crate::warn_once!(
                    "a process of the container has no known host pid yet: the SM limit runs open-loop until it has"
                );
                return None;
            }
            0 => {}
            p => pids.push((i, p as u32)),
        }
    }
    let nd = client::device(&region.device(dev).uuid())?;
    let samples = match client::utilization(nd, *last_seen_us) {
        Ok(s) => s,
        Err(rc) => {
            crate::warn_once!(
                "NVML per-process utilisation unavailable ({rc}): the SM limit runs open-loop on event-timed kernel costs"
            );
            return None;
        }
    };
    // NVML took a while: the region file is checked again (tamper.rs).
    if !attach.intact() {
        return None;
    }
    let mut per_pid: HashMap<u32, (u64, u32)> = HashMap::new();
    for s in &samples {
        *last_seen_us = (*last_seen_us).max(s.timestamp);
        if pids.iter().any(|&(_, p)| p == s.pid) {
            let e = per_pid.entry(s.pid).or_default();
            e.0 += u64::from(s.sm);
            e.1 += 1;
        }
    }
    let mut total = 0.0;
    for &(slot, pid) in &pids {
        let mean = per_pid
            .get(&pid)
            .map_or(0.0, |&(sum, n)| sum as f64 / f64::from(n));
        region.slot(slot).sm_util[dev].store(mean.round() as u32, Ordering::Relaxed);
        total += mean / 100.0;
    }
    Some(total.min(1.0))
}
