//! This process's own state, in one place: one [`DeviceState`] per device
//! entry of the region, the contexts and pools it made, and the few
//! process-wide facts the hot paths read. The modules that own the parts
//! keep their fields private; a forked child resets all of it in one step
//! ([`reset_in_child`], and [`CONTEXTS`] and [`POOLS`] as `fork.rs` gives
//! their locks back).
//!
//! This is also the one record of the devices this process uses
//! ([`devices_in_use`]): a device is in use while a context of ours lives
//! on it. The watcher asks it which devices to measure and lead.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};

use vgpu_shm::{EntryIndex, MAX_DEVICES};

use crate::cuda::sys::CudaOrdinal;
use crate::limiter::credit::DeviceCredit;
use crate::lock::{Listed, Lock, Map, Name, map};
use crate::quota::counters::DeviceQuota;

/// What this process keeps about one device entry.
pub struct DeviceState {
    /// Contexts of ours on the device.
    contexts: AtomicU32,
    /// Memory accounting (`quota`).
    pub quota: DeviceQuota,
    /// The compute bucket's side in this process (`limiter`).
    pub limiter: DeviceCredit,
}

impl DeviceState {
    const fn new() -> DeviceState {
        DeviceState {
            contexts: AtomicU32::new(0),
            quota: DeviceQuota::new(),
            limiter: DeviceCredit::new(),
        }
    }

    fn reset(&self) {
        self.contexts.store(0, Ordering::Release);
        self.quota.reset();
        self.limiter.reset();
    }

    /// Whether a context of ours lives on the device.
    pub fn in_use(&self) -> bool {
        self.contexts.load(Ordering::Acquire) > 0
    }
}

static DEVICES: [DeviceState; MAX_DEVICES] = [const { DeviceState::new() }; MAX_DEVICES];

/// The device entry this process uses while it uses exactly one (`NONE`
/// before its first context, `MANY` after a second device's): spares the
/// launch path a driver call to find the current context's device.
static ONLY_DEVICE: AtomicUsize = AtomicUsize::new(NONE);
const NONE: usize = usize::MAX;
const MANY: usize = usize::MAX - 1;

/// A context of ours the driver made.
#[derive(Clone, Copy, Debug)]
pub struct LiveContext {
    /// Its device's region entry.
    pub dev: EntryIndex,
    /// Its device as this process numbers it.
    pub ordinal: CudaOrdinal,
    /// The device's primary context.
    pub primary: bool,
}

/// Our contexts, by handle (`cuda/context.rs`).
pub static CONTEXTS: Lock<Map<usize, LiveContext>> = Lock::new(map(), |m| m.clear());

/// Memory pools we saw created, with their device (`cuda/memory.rs`).
pub static POOLS: Lock<Map<usize, CudaOrdinal>> = Lock::new(map(), |m| m.clear());

/// This module's locks, for the fork handlers (`fork.rs`).
pub fn locks() -> [Listed; 2] {
    [
        (Name::of("contexts"), &CONTEXTS),
        (Name::of("pools"), &POOLS),
    ]
}

/// This process's pid as NVML sees it (0: unknown yet; `hostpid.rs`
/// finds it).
static HOST_PID: AtomicU32 = AtomicU32::new(0);

/// Stream captures in progress in this process (`cuda/graph.rs` counts
/// them): launches into a capturing stream are recorded, not run.
static CAPTURES: AtomicI32 = AtomicI32::new(0);

/// What this process keeps about device entry `dev`.
pub fn device(dev: EntryIndex) -> &'static DeviceState {
    &DEVICES[dev.get()]
}

/// A context of ours was made on `dev`; true for the device's first.
pub fn context_added(dev: EntryIndex) -> bool {
    let _ = ONLY_DEVICE.fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| match d {
        NONE => Some(dev.get()),
        d if d == dev.get() || d == MANY => None,
        _ => Some(MANY),
    });
    device(dev).contexts.fetch_add(1, Ordering::AcqRel) == 0
}

/// A context of ours on `dev` is gone; true when it was the last there.
pub fn context_removed(dev: EntryIndex) -> bool {
    let before = device(dev)
        .contexts
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            Some(n.saturating_sub(1))
        })
        .unwrap_or(0);
    before <= 1
}

/// The devices on which this process has a context.
pub fn devices_in_use() -> impl Iterator<Item = EntryIndex> {
    EntryIndex::all().filter(|&d| device(d).in_use())
}

/// The one device this process has used, while it has used exactly one.
pub fn only_device() -> Option<EntryIndex> {
    EntryIndex::new(ONLY_DEVICE.load(Ordering::Relaxed))
}

/// This process's pid as NVML sees it, once known.
pub fn host_pid() -> Option<u32> {
    Some(HOST_PID.load(Ordering::Acquire)).filter(|&p| p != 0)
}

/// Records this process's pid as NVML sees it; returns the one before.
pub fn set_host_pid(pid: u32) -> Option<u32> {
    Some(HOST_PID.swap(pid, Ordering::AcqRel)).filter(|&p| p != 0)
}

/// Stream captures in progress.
pub fn captures() -> i32 {
    CAPTURES.load(Ordering::Acquire)
}

/// A stream capture began (`delta` 1) or ended (-1).
pub fn capture_changed(delta: i32) {
    let _ = CAPTURES.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        Some((n + delta).max(0))
    });
}

/// In a forked child: nothing of the parent's devices or captures is
/// this process's.
pub fn reset_in_child() {
    for d in &DEVICES {
        d.reset();
    }
    ONLY_DEVICE.store(NONE, Ordering::Release);
    CAPTURES.store(0, Ordering::Release);
    HOST_PID.store(0, Ordering::Release);
}
