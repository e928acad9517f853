//! What NVML says about the container on one device, for its leader
//! (`leader.rs`): its processes' SM utilisation and busy processes of
//! other containers ([`container_utilisation`]), and whether it is alone
//! there ([`alone_on`]). Every call runs in its own guard
//! (`nvml/client.rs`), and the region file is checked again after each.
#![forbid(unsafe_code)]

use std::collections::HashMap;

use vgpu_shm::procinfo::pid_exists;
use vgpu_shm::{EntryIndex, SlotIndex};

use crate::attach::Attach;
use crate::nvml::client;

/// One control period's reading of NVML for a device.
pub(super) struct Reading {
    /// The container's SM utilisation, as a fraction of the device.
    pub(super) ours: f64,
    /// Each process's (slot, fraction of the device).
    pub(super) per_slot: Vec<(SlotIndex, f64)>,
    /// Host pids outside the container that used the device.
    pub(super) busy_neighbours: Vec<u32>,
}

/// The container's SM utilisation of `dev` since the last call, and
/// whether anyone else used the device; None when it cannot be measured.
pub(super) fn container_utilisation(
    attach: &Attach,
    dev: EntryIndex,
    last_seen_us: &mut u64,
) -> Option<Reading> {
    let region = &attach.region;
    let mut pids = Vec::new();
    for i in region.occupied_slots() {
        if region.slot_total(i, dev) == 0 {
            continue;
        }
        match region.host_pid(i) {
            None if pid_exists(region.pid(i)) => {
                crate::warn_once!(
                    "a process of the container has no known host pid yet: the SM limit runs open-loop until it has"
                );
                return None;
            }
            None => {}
            Some(p) => pids.push((i, p)),
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
    let mut busy_neighbours = Vec::new();
    for s in &samples {
        *last_seen_us = (*last_seen_us).max(s.timestamp);
        if pids.iter().any(|&(_, p)| p == s.pid) {
            let e = per_pid.entry(s.pid).or_default();
            e.0 += u64::from(s.sm);
            e.1 += 1;
        } else if s.sm > 0 && !region_holds_pid(region, s.pid) {
            busy_neighbours.push(s.pid);
        }
    }
    let per_slot: Vec<(SlotIndex, f64)> = pids
        .iter()
        .map(|&(slot, pid)| {
            let mean = per_pid
                .get(&pid)
                .map_or(0.0, |&(sum, n)| sum as f64 / f64::from(n));
            (slot, mean / 100.0)
        })
        .collect();
    Some(Reading {
        ours: per_slot.iter().map(|(_, u)| u).sum::<f64>().min(1.0),
        per_slot,
        busy_neighbours,
    })
}

/// Memory allocated on a device that NVML's process list may leave
/// unaccounted while the container counts as alone: less than a context
/// (518 MiB for PyTorch's on an H200), which every process of another
/// container holds; at most half the container's own context where that
/// was measured smaller.
const UNLISTED_SLACK: u64 = 256 << 20;

/// Whether the container is alone on device entry `dev` (None: NVML could
/// not say): [`alone_by`] on NVML's list of compute processes and the
/// memory allocated on the device, read before and after it (the larger
/// reading: an allocation or a free in between would hide a neighbour's
/// memory behind the container's). Then nothing else can have run in the
/// container's windows but its own work (`limiter/probes.rs`).
pub(super) fn alone_on(attach: &Attach, dev: EntryIndex) -> Option<bool> {
    let region = &attach.region;
    let entry = region.device(dev);
    let nd = client::device(&entry.uuid())?;
    let before = client::allocated_memory(nd)?;
    let listed = client::processes(nd).ok()?;
    let after = client::allocated_memory(nd)?;
    // NVML took a while: the region file is checked again (tamper.rs).
    if !attach.intact() {
        return None;
    }
    let slack = entry
        .context_bytes()
        .map_or(UNLISTED_SLACK, |b| UNLISTED_SLACK.min(b / 2));
    alone_by(&listed, before.max(after), slack, |pid| {
        region_holds_pid(region, pid)
    })
}

/// Whether NVML's list of a device's compute processes (`listed`: pid,
/// used bytes) shows a container alone there: non-empty, every pid the
/// container's (`ours`), and their memory all that is `allocated` on the
/// device but less than `slack`. The list alone does not tell: driver 580
/// shows a caller in a pid namespace only that namespace's processes
/// (docs/benchmarks.md, run 18), and graphics contexts never. None when a
/// process's memory is not available.
fn alone_by(
    listed: &[(u32, u64)],
    allocated: u64,
    slack: u64,
    ours: impl Fn(u32) -> bool,
) -> Option<bool> {
    // (NVML_VALUE_NOT_AVAILABLE, all ones, is no figure.)
    let counted = listed.iter().try_fold(0u64, |sum, &(_, used)| {
        (used != u64::MAX).then(|| sum.saturating_add(used))
    })?;
    let all_ours = !listed.is_empty() && listed.iter().all(|&(pid, _)| ours(pid));
    Some(all_ours && allocated.saturating_sub(counted) < slack)
}

/// Whether `pid` is the host pid of a process of this container (one that
/// holds no memory on this device counts as ours, not as a neighbour).
fn region_holds_pid(region: &vgpu_shm::Region, pid: u32) -> bool {
    region
        .occupied_slots()
        .any(|i| region.host_pid(i) == Some(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_takes_a_list_of_the_container_s_own_that_accounts_for_the_memory() {
        const MIB: u64 = 1 << 20;
        let ours = |pid| pid == 10 || pid == 11;
        let slack = 256 * MIB;
        let two = [(10, 600 * MIB), (11, 600 * MIB)];
        assert_eq!(alone_by(&two, 1209 * MIB, slack, ours), Some(true));
        // Another container's process in the list.
        assert_eq!(
            alone_by(&[(10, 600 * MIB), (77, 500 * MIB)], 1100 * MIB, slack, ours),
            Some(false)
        );
        // A list filtered to our pid namespace: the neighbour's context
        // shows only in the device's memory.
        assert_eq!(alone_by(&two, 1709 * MIB, slack, ours), Some(false));
        assert_eq!(alone_by(&two, 1200 * MIB + slack, slack, ours), Some(false));
        assert_eq!(
            alone_by(&two, 1200 * MIB + slack - 1, slack, ours),
            Some(true)
        );
        // An empty list shows not even us: it says nothing.
        assert_eq!(alone_by(&[], 0, slack, ours), Some(false));
        // A process whose memory NVML cannot give: no verdict.
        assert_eq!(alone_by(&[(10, u64::MAX)], 600 * MIB, slack, ours), None);
        // More listed than allocated (a free between the reads) is fine.
        assert_eq!(alone_by(&two, 1000 * MIB, slack, ours), Some(true));
    }
}
