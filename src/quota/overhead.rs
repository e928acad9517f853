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

use std::sync::atomic::Ordering;

use vgpu_shm::{EntryIndex, Kind, Region, SlotIndex};

use super::counters::DeviceQuota;
use crate::attach::Attach;
use crate::guard::Guard;
use crate::hostpid;
use crate::nvml::client;
use crate::process;

pub const PROVISIONAL: u64 = 640 << 20;
/// At most one synchronous measurement per device in this window.
const MIN_INTERVAL_NS: u64 = 20_000_000;
/// How long an overhead estimate stands before a lower one may replace it.
const SETTLE_NS: u64 = 1_000_000_000;

/// The quota's counters of device entry `dev` in this process.
fn counters(dev: EntryIndex) -> &'static DeviceQuota {
    &process::device(dev).quota
}

/// An allocation of `bytes` on `dev` completed.
pub fn allocated(dev: EntryIndex, bytes: u64) {
    counters(dev).allocated.fetch_add(bytes, Ordering::AcqRel);
}

/// A free of `bytes` on `dev` is about to start. (Counted before the
/// driver frees it: once it has, NVML no longer sees the bytes.)
pub fn freeing(dev: EntryIndex, bytes: u64) {
    counters(dev).freed.fetch_add(bytes, Ordering::AcqRel);
}

/// An allocation or free call entered the driver on `dev`: from before
/// the call until its bytes are counted as allocated or freed.
pub fn call_started(dev: EntryIndex) {
    counters(dev).started.fetch_add(1, Ordering::SeqCst);
}

/// The call [`call_started`] announced is over, its bytes counted.
pub fn call_finished(dev: EntryIndex) {
    counters(dev).finished.fetch_add(1, Ordering::SeqCst);
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
    if process::context_added(dev) {
        counters(dev).measured.store(false, Ordering::Release);
    }
    let Some(slot) = attach.slot() else { return };
    if client::is_ready() {
        counters(dev).last_ns.store(0, Ordering::Release);
        reconcile_now(attach, slot, dev);
    }
}

/// A context of ours on `dev` is gone; with the last one, so is the overhead.
pub fn context_destroyed(attach: &Attach, dev: EntryIndex) {
    if process::context_removed(dev)
        && attach.intact()
        && let Some(slot) = attach.slot()
    {
        attach.region.set_usage(slot, dev, Kind::Context, 0);
    }
}

/// Measures our overhead on `dev` now (the denial path, and the watcher).
/// False when it could not be measured.
pub fn reconcile_now(attach: &Attach, slot: SlotIndex, dev: EntryIndex) -> bool {
    if !process::device(dev).in_use() {
        return false;
    }
    let now = crate::clock::monotonic_ns();
    let c = counters(dev);
    let last = c.last_ns.load(Ordering::Acquire);
    if now.saturating_sub(last) < MIN_INTERVAL_NS
        || c.last_ns
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
    let started = counters(dev).started.load(Ordering::SeqCst);
    let idle_before = counters(dev).finished.load(Ordering::SeqCst) == started;
    let allocated_before = counters(dev).allocated.load(Ordering::SeqCst);
    let Ok(list) = client::processes(nd) else {
        return false;
    };
    let freed_after = counters(dev).freed.load(Ordering::SeqCst);
    if !attach.intact() {
        return false;
    }
    let exact = idle_before && counters(dev).started.load(Ordering::SeqCst) == started;
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
    let first = !counters(dev).measured.swap(true, Ordering::AcqRel);
    if first && measured > 0 {
        // What contexts cost here, for the next one to reserve. (Exact:
        // not a figure inflated by frees racing with NVML.)
        region.device(dev).set_context_bytes(measured);
    }
    if first || measured >= current {
        counters(dev).raised_ns.store(now, Ordering::Release);
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
    let settled = now.saturating_sub(counters(dev).raised_ns.load(Ordering::Acquire)) >= SETTLE_NS;
    if measured < current && settled {
        region.set_usage(slot, dev, Kind::Context, measured);
    }
    true
}
