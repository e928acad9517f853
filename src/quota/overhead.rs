//! Context and library overhead: real device memory that no allocation
//! call accounts for. Each process's `Context` counter holds NVML's
//! per-process used memory minus what the process counted itself, so the
//! quota bounds what the container really holds.
//!
//! Until the first measurement (moments after the context exists) a
//! provisional figure stands in, a little above what a CUDA context costs
//! on an H200 (518 MiB bare, about 610 MiB with PyTorch's kernels loaded).
//! Erring high is safe: a denial re-measures before it is final.
//!
//! A measurement may raise the estimate only when no allocation or free of
//! ours was inside the driver while NVML looked; one that raced with them
//! is an upper bound, and may only lower it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use vgpu_shm::{EntryIndex, Kind, MAX_DEVICES, Region, SlotIndex};

use crate::attach::Attach;
use crate::guard::Guard;
use crate::hostpid;
use crate::nvml::client;

pub const PROVISIONAL: u64 = 640 << 20;
/// At most one synchronous measurement per device in this window.
const MIN_INTERVAL_NS: u64 = 20_000_000;
/// How long an overhead estimate stands before a lower one may replace it.
const SETTLE_NS: u64 = 1_000_000_000;

static CONTEXTS: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];
static LAST_NS: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Bytes of allocations that completed, and of frees that started, per
/// device, ever (monotonic; a failed free adds its bytes back on the
/// allocated side). A measurement brackets NVML's reading with
/// them, so an allocation or free racing with it can only make the
/// overhead look larger, never smaller.
static ALLOCATED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static FREED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Allocation and free calls that entered the driver, and that left it,
/// per device. A measurement is exact only when no call was inside the
/// driver while NVML looked: its bracket above is then tight.
static STARTED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static FINISHED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Whether each device's estimate is a measurement (not the provisional).
static MEASURED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
/// When each device's estimate last rose (CLOCK_MONOTONIC ns).
static RAISED_NS: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// An allocation of `bytes` on `dev` completed.
pub fn allocated(dev: EntryIndex, bytes: u64) {
    ALLOCATED[dev.get()].fetch_add(bytes, Ordering::AcqRel);
}

/// A free of `bytes` on `dev` is about to start. (Counted before the
/// driver frees it: once it has, NVML no longer sees the bytes.)
pub fn freeing(dev: EntryIndex, bytes: u64) {
    FREED[dev.get()].fetch_add(bytes, Ordering::AcqRel);
}

/// An allocation or free call entered the driver on `dev`: from before
/// the call until its bytes are counted as allocated or freed.
pub fn call_started(dev: EntryIndex) {
    STARTED[dev.get()].fetch_add(1, Ordering::SeqCst);
}

/// The call [`call_started`] announced is over, its bytes counted.
pub fn call_finished(dev: EntryIndex) {
    FINISHED[dev.get()].fetch_add(1, Ordering::SeqCst);
}

/// An allocation or creation call inside the driver on one device
/// ([`call_started`] to [`call_finished`], as a guard).
#[must_use]
pub struct InDriver(EntryIndex);

pub fn in_driver(dev: EntryIndex) -> InDriver {
    call_started(dev);
    InDriver(dev)
}

impl Drop for InDriver {
    fn drop(&mut self) {
        call_finished(self.0);
    }
}

/// What a new context on `dev` is expected to cost: the last measured
/// one, or the provisional figure before any was measured.
pub fn expected_context_bytes(attach: &Attach, dev: EntryIndex) -> u64 {
    attach
        .region
        .device(dev)
        .context_bytes()
        .unwrap_or(PROVISIONAL)
}

/// A context of ours now lives on device `dev` (its expected cost was
/// reserved before it was made): measured at once when NVML is up.
pub fn context_created(attach: &Attach, dev: EntryIndex) {
    if CONTEXTS[dev.get()].fetch_add(1, Ordering::AcqRel) == 0 {
        MEASURED[dev.get()].store(false, Ordering::Release);
    }
    let Some(slot) = attach.slot() else { return };
    if client::is_ready() {
        LAST_NS[dev.get()].store(0, Ordering::Release);
        reconcile_now(attach, slot, dev);
    }
}

/// A context of ours on `dev` is gone; with the last one, so is the overhead.
pub fn context_destroyed(attach: &Attach, dev: EntryIndex) {
    let before = CONTEXTS[dev.get()]
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            Some(n.saturating_sub(1))
        })
        .unwrap_or(0);
    if before <= 1
        && attach.intact()
        && let Some(slot) = attach.slot()
    {
        attach.region.set_usage(slot, dev, Kind::Context, 0);
    }
}

/// Devices on which this process has a context.
pub fn devices_in_use() -> impl Iterator<Item = EntryIndex> {
    EntryIndex::all().filter(|&d| CONTEXTS[d.get()].load(Ordering::Acquire) > 0)
}

pub fn after_fork_child() {
    for c in &CONTEXTS {
        c.store(0, Ordering::Release);
    }
    for m in &MEASURED {
        m.store(false, Ordering::Release);
    }
    // A parent thread inside the driver at the fork never finishes here.
    for c in ALLOCATED
        .iter()
        .chain(&FREED)
        .chain(&STARTED)
        .chain(&FINISHED)
    {
        c.store(0, Ordering::Release);
    }
}

/// Measures our overhead on `dev` now (the denial path, and the watcher).
/// False when it could not be measured.
pub fn reconcile_now(attach: &Attach, slot: SlotIndex, dev: EntryIndex) -> bool {
    if CONTEXTS[dev.get()].load(Ordering::Acquire) == 0 {
        return false;
    }
    let now = crate::clock::monotonic_ns();
    let last = LAST_NS[dev.get()].load(Ordering::Acquire);
    if now.saturating_sub(last) < MIN_INTERVAL_NS
        || LAST_NS[dev.get()]
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
    // (NVML calls came before: the region file is checked again.)
    if !attach.intact() {
        return false;
    }
    let Some(nd) = client::device(&attach.region.device(dev).uuid()) else {
        return false;
    };
    // Started is read before finished: a call that slips between the two
    // reads shows up as a change of `started` afterwards.
    let started = STARTED[dev.get()].load(Ordering::SeqCst);
    let idle_before = FINISHED[dev.get()].load(Ordering::SeqCst) == started;
    let allocated_before = ALLOCATED[dev.get()].load(Ordering::SeqCst);
    let Ok(list) = client::processes(nd) else {
        return false;
    };
    let freed_after = FREED[dev.get()].load(Ordering::SeqCst);
    if !attach.intact() {
        return false;
    }
    let exact = idle_before && STARTED[dev.get()].load(Ordering::SeqCst) == started;
    let Some(&(_, used)) = list.iter().find(|(p, _)| *p == pid) else {
        return false;
    };
    // A lower bound of what our allocations held when NVML looked; exact
    // when no call was in the driver meanwhile.
    let held = allocated_before.saturating_sub(freed_after);
    let measured = used.saturating_sub(held);
    let region = &attach.region;
    let current = region.slot_usage(slot, dev, Kind::Context);
    if !exact {
        // Frees or allocations raced with NVML (a cache emptied in another
        // thread can be gigabytes), so `measured` is only an upper bound:
        // good for lowering the estimate, never for raising it.
        return lower(region, slot, dev, measured, current, now);
    }
    let first = !MEASURED[dev.get()].swap(true, Ordering::AcqRel);
    if first && measured > 0 {
        // What contexts cost here, for the next one to reserve. (Exact:
        // not a figure inflated by frees racing with NVML.)
        region.device(dev).set_context_bytes(measured);
    }
    if first || measured >= current {
        RAISED_NS[dev.get()].store(now, Ordering::Release);
        region.set_usage(slot, dev, Kind::Context, measured);
        return true;
    }
    lower(region, slot, dev, measured, current, now)
}

/// The driver's own memory jitters between measurements: an estimate may
/// rise at once but fall only once it is a second old.
fn lower(
    region: &Region,
    slot: SlotIndex,
    dev: EntryIndex,
    measured: u64,
    current: u64,
    now: u64,
) -> bool {
    let settled = now.saturating_sub(RAISED_NS[dev.get()].load(Ordering::Acquire)) >= SETTLE_NS;
    if measured < current && settled {
        region.set_usage(slot, dev, Kind::Context, measured);
    }
    true
}
