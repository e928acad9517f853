//! The compute quota. [`around`] is the one call a launch hook makes:
//! with no SM limit anywhere in this process it costs one atomic load;
//! with a limit, a launch spends credit this process bought from the
//! device's shared bucket (one atomic subtraction), and buys more (one CAS
//! on the bucket) a lease at a time.
//!
//! - `bucket`: the GCRA bucket in the shared region (pure)
//! - `estimate`: per-shape launch costs, learned (pure)
//! - `timing`: event timing of sampled launches
//! - `controller`: refill scale from NVML utilisation (pure)
//! - `leader`: the elected per-device controller, run by the watcher

pub mod bucket;
pub mod controller;
pub mod credit;
pub mod estimate;
pub mod leader;
pub mod timing;

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use bucket::Admit;
use vgpu_shm::EntryIndex;

use crate::attach::Attach;
use crate::cuda::driver;
use crate::cuda::exports::real;
use crate::cuda::{device, sys::*};
use crate::{clock, init, process};

/// Some device this process uses has an SM limit in force.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Stream captures in progress in this process.
static CAPTURES: AtomicI32 = AtomicI32::new(0);

/// What a launch is, for the bucket.
#[derive(Clone, Copy)]
pub struct Launch {
    pub key: u64,
    /// The stream as the event API names it (`CU_STREAM_PER_THREAD` for a
    /// `_ptsz` launch on the default stream).
    pub stream: CUstream,
}

impl Launch {
    pub fn kernel(
        func: CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        stream: CUstream,
        per_thread: bool,
    ) -> Launch {
        Launch {
            key: estimate::kernel_key(func as usize, grid, block),
            stream: event_stream(stream, per_thread),
        }
    }

    pub fn graph(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> Launch {
        Launch {
            key: estimate::graph_key(exec as usize),
            stream: event_stream(stream, per_thread),
        }
    }
}

fn event_stream(stream: CUstream, per_thread: bool) -> CUstream {
    if per_thread && stream.is_null() {
        STREAM_PER_THREAD
    } else {
        stream
    }
}

/// Notes that this process uses device entry `dev`.
pub fn device_in_use(attach: &Attach, dev: EntryIndex) {
    let on = attach.region.device(dev).enforces_sm_limit();
    process::device(dev).limiter.set_enforced(on);
    if on {
        ACTIVE.store(true, Ordering::Release);
    }
}

/// Runs a launch through the bucket of its device.
#[inline]
pub fn around(launch: impl FnOnce() -> Launch, go: impl FnOnce() -> CUresult) -> CUresult {
    if !ACTIVE.load(Ordering::Relaxed) {
        return go();
    }
    limited(launch(), go)
}

thread_local! {
    /// (context, device entry) of this thread's last launch.
    static LAST: Cell<(usize, Option<EntryIndex>)> = const { Cell::new((0, None)) };
}

fn current_device() -> Option<(&'static Attach, EntryIndex)> {
    let attach = init::attach()?;
    if let Some(only) = process::only_device() {
        return Some((attach, only));
    }
    let ctx = driver::current_context()? as usize;
    if let (c, Some(d)) = LAST.with(Cell::get)
        && c == ctx
    {
        return Some((attach, d));
    }
    let (dev, _) = device::current_entry(attach)?;
    LAST.with(|l| l.set((ctx, Some(dev))));
    Some((attach, dev))
}

fn capturing(stream: CUstream) -> bool {
    let mut status: c_int = 0;
    real::cuStreamIsCapturing(stream, &mut status).is_ok() && status != 0
}

fn limited(l: Launch, go: impl FnOnce() -> CUresult) -> CUresult {
    let capture = CAPTURES.load(Ordering::Acquire) > 0;
    if capture && capturing(l.stream) {
        // Recorded into a graph, not run: the graph's launches pay.
        return go();
    }
    let Some((attach, dev)) = current_device() else {
        return go();
    };
    if !process::device(dev).limiter.enforced() {
        return go();
    }
    let slot = estimate::slot(l.key);
    if slot.cost_ns() == 0 && !capture {
        timing::wait_for(slot);
    }
    let cost = match slot.cost_ns() {
        0 => estimate::DEFAULT_NS,
        c => c,
    };
    pay(attach, dev, cost);
    let sample = if capture {
        None
    } else {
        timing::begin(slot, l.stream, clock::coarse_ns())
    };
    let rc = go();
    if let Some(s) = sample {
        timing::end(s, rc);
    }
    rc
}

/// The least GPU time bought at once: about one time slice of a shared
/// GPU (2.5 ms on an H200), so that beside another container's context a
/// limited one runs its kernels in slices' worth, not one context switch
/// per kernel; still far below what shows in a one-second window.
const LEASE_NS: u64 = 2_000_000;

/// Pays `cost` GPU-ns for a launch on device entry `dev`, waiting for the
/// bucket when this process has no credit left.
fn pay(attach: &Attach, dev: EntryIndex, cost: u64) {
    let credit = &process::device(dev).limiter;
    if credit.spend(i64::try_from(cost).unwrap_or(i64::MAX / 2)) {
        return;
    }
    let lease = cost.max(LEASE_NS);
    let mut now = clock::monotonic_ns();
    // (Not intact only when even a private copy failed: the launch goes.)
    while attach.intact() {
        let entry = attach.region.device(dev);
        let Admit::Wait(ns) = bucket::admit(entry, lease, now) else {
            break;
        };
        entry.count_wait();
        std::thread::sleep(Duration::from_nanos(ns));
        now = clock::monotonic_ns();
    }
    credit.add(i64::try_from(lease - cost).unwrap_or(0));
}

/// A stream capture began (`delta` 1) or ended (-1).
pub fn capture_changed(delta: i32) {
    let _ = CAPTURES.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        Some((n + delta).max(0))
    });
}

/// Sets a graph's first cost estimate, computed once at instantiation.
pub fn graph_instantiated(exec: CUgraphExec, cost_ns: u64) {
    estimate::slot(estimate::graph_key(exec as usize)).seed(cost_ns);
}

/// The learned cost of a kernel shape, if any.
pub fn kernel_cost(func: usize, grid: [u32; 3], block: [u32; 3]) -> Option<u64> {
    estimate::find(estimate::kernel_key(func, grid, block))
        .map(estimate::Slot::cost_ns)
        .filter(|&c| c != 0)
}

/// Context `ctx` is about to be destroyed or reset.
pub fn context_ending(ctx: usize) {
    timing::destroy_idle_events(ctx);
}

/// A context is gone: forget its events.
pub fn context_gone(ctx: usize) {
    timing::forget_context(ctx);
    LAST.with(|l| {
        if l.get().0 == ctx {
            l.set((0, None));
        }
    });
}

/// The watcher re-checks whether limits appeared in the region.
pub fn refresh(attach: &Attach, devices: impl Iterator<Item = EntryIndex>) {
    for dev in devices {
        device_in_use(attach, dev);
    }
}

pub fn fork_prepare() {
    timing::fork_prepare();
}

pub fn fork_parent() {
    timing::fork_parent();
}

pub fn fork_child() {
    timing::fork_child();
    CAPTURES.store(0, Ordering::Release);
}
