//! Context and library overhead: real device memory that no allocation
//! call accounts for. Each process's `Context` counter holds NVML's
//! per-process used memory minus what the process counted itself, so the
//! quota bounds what the container really holds.
//!
//! Until the first measurement (moments after the context exists) a
//! provisional figure stands in, a little above what a CUDA context costs
//! on an H200 (518 MiB bare, about 610 MiB with PyTorch's kernels loaded).
//! Erring high is safe: a denial re-measures before it is final.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use vgpu_shm::{Kind, MAX_DEVICES};

use crate::attach::Attach;
use crate::guard::Guard;
use crate::hostpid;
use crate::nvml::client;

pub const PROVISIONAL: u64 = 640 << 20;
/// At most one synchronous measurement per device in this window.
const MIN_INTERVAL_NS: u64 = 20_000_000;

static CONTEXTS: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];
static LAST_NS: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// A context of ours now lives on device `dev`.
pub fn context_created(attach: &Attach, dev: usize) {
    if CONTEXTS[dev].fetch_add(1, Ordering::AcqRel) == 0
        && let Some(slot) = attach.slot()
        && attach.region.slot_usage(slot, dev, Kind::Context) == 0
    {
        attach
            .region
            .set_usage(slot, dev, Kind::Context, PROVISIONAL);
    }
}

/// A context of ours on `dev` is gone; with the last one, so is the overhead.
pub fn context_destroyed(attach: &Attach, dev: usize) {
    let before = CONTEXTS[dev]
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            Some(n.saturating_sub(1))
        })
        .unwrap_or(0);
    if before <= 1
        && let Some(slot) = attach.slot()
    {
        attach.region.set_usage(slot, dev, Kind::Context, 0);
    }
}

/// Devices on which this process has a context.
pub fn devices_in_use() -> impl Iterator<Item = usize> {
    (0..MAX_DEVICES).filter(|&d| CONTEXTS[d].load(Ordering::Acquire) > 0)
}

pub fn after_fork_child() {
    for c in &CONTEXTS {
        c.store(0, Ordering::Release);
    }
}

/// Measures our overhead on `dev` now (the denial path, and the watcher).
/// False when it could not be measured.
pub fn reconcile_now(attach: &Attach, slot: usize, dev: usize) -> bool {
    if CONTEXTS[dev].load(Ordering::Acquire) == 0 {
        return false;
    }
    let now = crate::clock::monotonic_ns();
    let last = LAST_NS[dev].load(Ordering::Acquire);
    if now.saturating_sub(last) < MIN_INTERVAL_NS
        || LAST_NS[dev]
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return false;
    }
    let _internal = Guard::enter();
    if !client::init() {
        return false;
    }
    let Some(pid) = hostpid::resolve(attach, dev) else {
        return false;
    };
    let Some(nd) = client::device(&attach.region.device(dev).uuid()) else {
        return false;
    };
    let Ok(list) = client::processes(nd) else {
        return false;
    };
    let Some(&(_, used)) = list.iter().find(|(p, _)| *p == pid) else {
        return false;
    };
    let region = &attach.region;
    let counted = region.slot_total(slot, dev) - region.slot_usage(slot, dev, Kind::Context);
    region.set_usage(slot, dev, Kind::Context, used.saturating_sub(counted));
    true
}
