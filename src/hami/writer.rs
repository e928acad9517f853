//! The process that keeps the HAMi part true. One per region, elected
//! through a lease in the region (renewed every tick, taken over after
//! 2 s of silence or when its holder dies), on its watcher thread:
//! - gives each device the container knows its HAMi index: the device's
//!   number in the container (`numbering.rs`: its place in
//!   `NVIDIA_VISIBLE_DEVICES`, else its NVML index), as HAMi-core numbers
//!   them;
//! - once a second asks NVML for each device's processes (used memory:
//!   `monitorused`) and, on devices no compute leader measures, their SM
//!   utilisation, and shows both in the slots of the container's
//!   processes;
//! - mirrors the slots into the HAMi part (`Region::mirror_hami`).
//!
//! NVML is asked with no lock held; the region file is checked after each
//! NVML call, before the region is touched (`tamper.rs`).
//!
//! When the writer's process exits normally, it makes a last pass without
//! itself (`atexit`), so that a container whose last process exits shows
//! none; one killed leaves its slot there until another process of the
//! container runs.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use vgpu_shm::procinfo::pid_exists;
use vgpu_shm::{EntryIndex, MAX_DEVICES};

use crate::attach::Attach;
use crate::clock;
use crate::nvml::client;

/// Seconds without a heartbeat before another process takes over.
const LEASE_S: u64 = 2;
/// NVML is sampled this often.
const SAMPLE_NS: u64 = 1_000_000_000;

/// The writer's state in this process.
#[derive(Default)]
pub struct Writer {
    last_sample_ns: u64,
    /// The newest utilisation sample seen per device entry (µs since the
    /// epoch).
    last_seen_us: [u64; MAX_DEVICES],
}

impl Writer {
    /// One watcher tick (the region was just checked).
    pub fn tick(&mut self, attach: &'static Attach) {
        let region = &attach.region;
        let me = std::process::id();
        let now_s = clock::monotonic_ns() / 1_000_000_000;
        if !region.elect_hami_writer(me, now_s, LEASE_S, |p| pid_exists(p as i32)) {
            return;
        }
        // Not a `Once`: a fork while one ran would leave the child's
        // watcher waiting on it forever.
        static REGISTERED: AtomicBool = AtomicBool::new(false);
        if !REGISTERED.swap(true, Ordering::AcqRel) {
            let _ = EXITING.set(attach);
            if !crate::ffi::at_exit(last_pass) {
                crate::warn_once!(
                    "atexit failed: an exiting process stays in the HAMi part until another one runs"
                );
            }
        }
        self.assign_indices(attach);
        let now = clock::monotonic_ns();
        if now.saturating_sub(self.last_sample_ns) >= SAMPLE_NS && client::is_ready() {
            self.last_sample_ns = now;
            self.sample(attach);
        }
        // One pass at a time with `last_pass` (on the exiting thread): the
        // flags are SeqCst, so of the two at least one sees the other.
        IN_PASS.store(true, Ordering::SeqCst);
        if !EXITED.load(Ordering::SeqCst) && attach.intact() {
            region.mirror_hami();
        }
        IN_PASS.store(false, Ordering::SeqCst);
    }

    /// Gives every device entry without one its HAMi index.
    fn assign_indices(&self, attach: &Attach) {
        let region = &attach.region;
        let new: Vec<(EntryIndex, [u8; 16])> = EntryIndex::all()
            .filter(|&e| region.device(e).is_used() && region.hami_index(e).is_none())
            .map(|e| (e, region.device(e).uuid()))
            .collect();
        for (e, uuid) in new {
            // May ask NVML: the file is checked again before it is touched.
            let number = attach.device_number(&uuid).map(|n| n.get());
            if !attach.intact() {
                return;
            }
            if let Err(e) = region.assign_hami_index(e, number) {
                crate::warn_once!("{e}: the HAMi part does not show every device");
            }
        }
    }

    /// NVML's per-process memory and (where no leader measures it) SM
    /// utilisation, into the slots.
    fn sample(&mut self, attach: &Attach) {
        let region = &attach.region;
        let devices: Vec<(EntryIndex, [u8; 16], bool)> = EntryIndex::all()
            .filter(|&e| region.device(e).is_used())
            .map(|e| (e, region.device(e).uuid(), region.enforces_sm_limit(e)))
            .collect();
        for (e, uuid, led) in devices {
            let Some(nd) = client::device(&uuid) else {
                continue;
            };
            let used = client::processes(nd).ok();
            let util = if led {
                None
            } else {
                client::utilization(nd, self.last_seen_us[e.get()]).ok()
            };
            if !attach.intact() {
                return;
            }
            let mut sm: HashMap<u32, (u64, u32)> = HashMap::new();
            for s in util.iter().flatten() {
                self.last_seen_us[e.get()] = self.last_seen_us[e.get()].max(s.timestamp);
                let v = sm.entry(s.pid).or_default();
                v.0 += u64::from(s.sm);
                v.1 += 1;
            }
            for slot in region.occupied_slots() {
                let Some(host) = region.host_pid(slot) else {
                    continue;
                };
                if let Some(used) = &used {
                    let bytes = used.iter().find(|p| p.0 == host).map_or(0, |p| p.1);
                    region.set_nvml_used(slot, e, bytes);
                }
                if util.is_some() {
                    let percent = sm
                        .get(&host)
                        .map_or(0, |&(sum, n)| (sum / u64::from(n.max(1))).min(100));
                    region.set_sm_util(slot, e, percent as u32);
                }
            }
        }
    }
}

/// The attachment, for [`last_pass`].
static EXITING: OnceLock<&'static Attach> = OnceLock::new();
/// The watcher is in a mirror pass.
static IN_PASS: AtomicBool = AtomicBool::new(false);
/// The process is exiting: the watcher makes no more passes.
static EXITED: AtomicBool = AtomicBool::new(false);

/// At exit: the writer leaves the HAMi part (a forked child, which
/// inherits the handler, is not the writer and does nothing). The watcher
/// still runs: its pass in progress, if any, ends first (100 ms at most).
extern "C" fn last_pass() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(attach) = EXITING.get() else { return };
        let me = std::process::id();
        if attach.region.hami_writer() != me {
            return;
        }
        EXITED.store(true, Ordering::SeqCst);
        for _ in 0..100 {
            if !IN_PASS.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if attach.intact() {
            attach.region.mirror_hami_leaving(me as i32);
        }
    }));
}
