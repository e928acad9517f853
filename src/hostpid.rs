//! The pid NVML reports for this process. Inside a container `getpid()`
//! differs from it, so it is found without a lock and without an extra
//! context:
//! - in the initial pid namespace, it is `getpid()`;
//! - where `/proc` shows the initial namespace (`unshare -pf` without
//!   `--mount-proc`), the kernel says it: the first `NSpid` entry
//!   (`vgpu_shm::ProcView`, set when the slot is claimed). These two are
//!   marked verified in the slot: a reclaimer may look them up in /proc.
//!   Outside the initial namespace NVML is asked anyway (below), and the
//!   kernel's pid stays verified only if NVML shows us by it;
//! - otherwise, the pids that appear in NVML's process list for a device
//!   between just before our first context on it and just after, less the
//!   pids other processes of the container already claimed. If `getpid()`
//!   is among the new ones, it is ours: driver 580 shows a caller in a pid
//!   namespace the processes of that namespace only, by their pids there
//!   (docs/benchmarks.md, run 18), so a restarted container's pid 1 sees
//!   itself as pid 1, which its predecessor's slot may still claim.
//!
//! Nothing on the allocation or launch path waits for it; the watcher
//! resolves it in the background.
#![forbid(unsafe_code)]

use vgpu_shm::procinfo::INIT_PIDNS;
use vgpu_shm::{EntryIndex, Region, SlotIndex};

use crate::attach::Attach;
use crate::lock::{Listed, Lock, Name};
use crate::nvml::client;
use crate::process;

/// NVML pids on a device (region entry) just before our first context
/// there. A forked child has had no context yet.
pub static BEFORE: Lock<Option<(EntryIndex, Vec<u32>)>> = Lock::new(None, |b| *b = None);

/// This module's lock, for the fork handlers (`fork.rs`).
pub fn locks() -> [Listed; 1] {
    [(Name::of("hostpid.before"), &BEFORE)]
}

fn in_initial_namespace() -> bool {
    vgpu_shm::procinfo::my_pidns() == INIT_PIDNS
}

/// Records NVML's pids on `dev` before our first context is created there.
/// Costs one NVML query, once per process outside the initial namespace,
/// and waits for NVML's initialisation (started at `cuInit`, so usually
/// done; at most 2 s): without this list the host pid is never found, and
/// the context's cost never measured.
pub fn before_first_context(attach: &Attach, dev: EntryIndex) {
    if process::host_pid().is_some() || in_initial_namespace() || BEFORE.lock().is_some() {
        return;
    }
    if !client::init() || !attach.intact() {
        return;
    }
    let uuid = attach.region.device(dev).uuid();
    let Some(nd) = client::device(&uuid) else {
        return;
    };
    if let Ok(list) = client::processes(nd) {
        *BEFORE.lock() = Some((dev, list.into_iter().map(|(p, _)| p).collect()));
    }
}

/// Pids other live processes of the container already own.
fn claimed_by_others(region: &Region, my_slot: Option<SlotIndex>) -> Vec<u32> {
    region
        .occupied_slots()
        .filter(|&i| Some(i) != my_slot)
        .filter_map(|i| region.host_pid(i))
        .collect()
}

/// Picks our pid out of NVML's list for device `dev`; pure, for tests.
pub fn choose(
    me: u32,
    initial_ns: bool,
    now: &[u32],
    before: Option<&[u32]>,
    others: &[u32],
) -> Option<u32> {
    if initial_ns {
        return now.contains(&me).then_some(me);
    }
    let before = before?;
    if now.contains(&me) && !before.contains(&me) {
        return Some(me);
    }
    let mut new = now
        .iter()
        .filter(|p| !before.contains(p) && !others.contains(p));
    match (new.next(), new.next()) {
        (Some(&p), None) => Some(p),
        _ => None,
    }
}

/// Finds our host pid through device `dev`; stores it in our slot.
pub fn resolve(attach: &Attach, dev: EntryIndex) -> Option<u32> {
    if let Some(p) = process::host_pid() {
        return Some(p);
    }
    if !attach.intact() {
        return None;
    }
    let uuid = attach.region.device(dev).uuid();
    let nd = client::device(&uuid)?;
    let now: Vec<u32> = client::processes(nd)
        .ok()?
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    if !attach.intact() {
        return None;
    }
    let slot = attach.slot();
    let before = BEFORE
        .lock()
        .clone()
        .filter(|(d, _)| *d == dev)
        .map(|(_, l)| l);
    let pid = choose(
        std::process::id(),
        in_initial_namespace(),
        &now,
        before.as_deref(),
        &claimed_by_others(&attach.region, slot),
    )?;
    if let Some(s) = slot {
        // Verified (fit for a reclaimer's /proc lookup) when the kernel
        // gives the same pid; under driver 580 in a pid namespace it is
        // our pid there, and the heartbeat judges us.
        let kernel = vgpu_shm::ProcView::current().host_pid;
        attach
            .region
            .set_host_pid(s, pid as i32, kernel == Some(pid as i32));
    }
    if process::set_host_pid(pid) != Some(pid) {
        log::debug!("host pid {pid}");
    }
    Some(pid)
}

#[cfg(test)]
mod tests {
    use super::choose;

    #[test]
    fn initial_namespace_uses_getpid_only_when_nvml_lists_it() {
        assert_eq!(choose(42, true, &[7, 42], None, &[]), Some(42));
        assert_eq!(choose(42, true, &[7], None, &[]), None);
    }

    #[test]
    fn containers_take_the_one_new_pid() {
        assert_eq!(
            choose(5, false, &[100, 200, 300], Some(&[100, 200]), &[]),
            Some(300)
        );
        // A sibling of the container started at the same time and already
        // claimed its pid.
        assert_eq!(
            choose(5, false, &[100, 300, 400], Some(&[100]), &[400]),
            Some(300)
        );
        // Two unknown newcomers: ambiguous, wait.
        assert_eq!(choose(5, false, &[100, 300, 400], Some(&[100]), &[]), None);
        // No snapshot: cannot tell.
        assert_eq!(choose(5, false, &[100], None, &[]), None);
    }

    #[test]
    fn a_driver_that_shows_namespace_pids_gives_ours_even_if_a_dead_slot_claims_it() {
        // A restarted container's pid 1; its predecessor's slot says 1 too.
        assert_eq!(choose(1, false, &[1], Some(&[]), &[1]), Some(1));
        // Already listed before our first context: someone else's.
        assert_eq!(choose(1, false, &[1, 9], Some(&[1]), &[]), Some(9));
    }
}
