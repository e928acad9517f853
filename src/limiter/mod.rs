//! The compute quota. A launch hook (`cuda/launch.rs`) asks
//! [`any_limit`] first: with no SM limit anywhere in this process that is
//! the whole cost, one atomic load. Otherwise it resolves the launch's
//! device and calls [`admit`], which spends credit this process bought
//! from the device's shared bucket (one atomic subtraction) and buys more
//! (one CAS on the bucket) a lease at a time. Its driver calls (event
//! timings and probes) go through `cuda::real`, as oversub's do.
//!
//! - `bucket`: the GCRA bucket in the shared region (pure)
//! - `estimate`: per-shape launch costs, learned (pure)
//! - `credit`: what this process bought, where a limit is in force, how
//!   it judged the windows
//! - `launch`: one limited launch: admission, timing sample, probe
//! - `events`: launch timings with CUDA events, for `estimate`
//! - `probes`: window timings for the turns, judged by `judge` (pure)
//! - `windows`: finished probes gathered into the windows they timed (pure)
//! - `synced`: this thread's last synchronisation, and how long it waited
//! - `settle`: a paced step's wait, taken at its synchronisation
//! - `shortfall`: whether a container paced side by side is short of the GPU (pure)
//! - `controller`: refill scale from NVML utilisation (pure)
//! - `leader`: the elected per-device controller, run by the watcher
//! - `readings`: what NVML says of the container on a device, for it
//! - `neighbours`: whether other containers share a device (pure)
//! - `pacing`: beside others, pace or take turns (the node's SM board)
//! - `rest`: a container without a limit takes what the limits leave
//! - `tiling`: where three or more take turns, their windows placed from
//!   the board
//! - `cut`: what a container in turns leaves unspent of each share
//! - `turns`: windows on the shared clock, so that containers sharing a
//!   GPU run in turns instead of time-slicing (pure)
#![forbid(unsafe_code)]

pub mod bucket;
pub mod controller;
pub mod credit;
pub mod cut;
pub mod estimate;
pub mod events;
pub mod fill;
pub mod following;
pub mod judge;
pub mod launch;
pub mod leader;
pub mod neighbours;
pub mod pacing;
pub mod period;
pub mod probes;
pub mod readings;
pub mod rest;
pub mod room;
pub mod settle;
pub mod shortfall;
pub mod streams;
pub mod synced;
pub mod tiling;
pub mod turns;
pub mod verdicts;
pub mod windows;

use std::time::Duration;

use bucket::Admit;
use estimate::Slot;
use vgpu_shm::EntryIndex;

use crate::attach::Attach;
use crate::{clock, duty, process};

/// The least GPU time bought at once: about one time slice of a shared
/// GPU (2.5 ms on an H200), so that beside another container's context a
/// limited one runs its kernels in slices' worth, not one context switch
/// per kernel; still far below what shows in a one-second window.
const LEASE_NS: u64 = 2_000_000;

/// Whether any device this process uses has an SM limit in force: the
/// launch path's first and, without a limit, only question.
#[inline]
pub fn any_limit() -> bool {
    // The launch path's word (`duty.rs`), bit LIMIT: set when some device
    // this process uses has an SM limit in force, never cleared (kept in
    // a forked child: its container's limits are its parent's).
    duty::any(duty::LIMIT)
}

/// A synchronisation of this thread returned after waiting `ns` for the
/// GPU: the wait is counted on the one device the process uses, for
/// `pacing` (a process on several devices is not counted: which device a
/// wait was for is not known without asking the driver); then a paced
/// step waits for the bucket there (`settle`).
pub fn sync_returned(attach: &Attach, ns: u64) {
    if let Some(dev) = process::only_device() {
        attach.region.device(dev).add_sync_wait_ns(ns);
    }
    settle_at_sync(attach);
}

/// The host took `ns` from a synchronisation's return to a launch on
/// device entry `dev`: counted in the process's slot, for `pacing`, where
/// the process uses that device alone (as its synchronisations' waits).
fn count_host_gap(attach: &Attach, dev: EntryIndex, ns: u64) {
    if process::only_device() != Some(dev) {
        return;
    }
    // (Not claimed here: a launch path takes no lock. A gap of seconds
    // lands in one judged span whatever its length: the span is then
    // judged whole, `shortfall::while_busy`.)
    if let Some(slot) = attach.slot_index() {
        attach.region.add_host_gap(slot, dev, ns.min(MOST_GAP_NS));
    }
}

/// The most one host gap counts for: a judged span is 0.3 s.
const MOST_GAP_NS: u64 = 1_000_000_000;

/// A paced step's wait for the bucket, taken at its synchronisation, on
/// the one device this process uses (`settle`).
fn settle_at_sync(attach: &Attach) {
    let now = clock::monotonic_ns();
    let Some(owed) = settle::owed_at(now) else {
        return;
    };
    // (A process on several devices: which one the synchronisation was
    // for is not known without asking the driver.)
    if process::only_device() != Some(owed.dev) || !enforced(owed.dev) || capturing() {
        return;
    }
    let entry = attach.region.device(owed.dev);
    let wait = settle::wait_at(owed, entry, now);
    if wait == 0 {
        return;
    }
    // (The next launch's wait, taken early: counted as its, once, for the
    // pacing's judging and vgpuctl's throttled launches.)
    entry.count_wait();
    pause(wait, now);
    let after = clock::monotonic_ns();
    settle::waited_until(after);
    entry.add_wait_ns(after.saturating_sub(now));
}

/// Whether an SM limit is in force on device entry `dev`.
pub fn enforced(dev: EntryIndex) -> bool {
    process::device(dev).limiter.enforced()
}

/// Whether a stream capture may be in progress in this process (its
/// launches are recorded into a graph, not run).
pub fn capturing() -> bool {
    process::captures() > 0
}

/// The learned cost of a launch shape (`estimate::kernel_key`,
/// `estimate::graph_key`), claimed on first use.
pub fn shape(key: u64) -> &'static Slot {
    estimate::slot(key)
}

/// Admits a launch of `shape` on device entry `dev` (a limit is in force
/// there): pays its cost from the credit this process bought, and buys
/// more from the device's bucket when it has none, waiting for it.
pub fn admit(attach: &Attach, dev: EntryIndex, shape: &Slot) {
    let cost = cost_ns(shape);
    let credit = &process::device(dev).limiter;
    // (A synchronisation that took this launch's wait counted it.)
    let settle::Admitted {
        counted,
        host_gap_ns,
    } = settle::admitted(dev, cost);
    if host_gap_ns != 0 {
        count_host_gap(attach, dev, host_gap_ns);
    }
    if credit.spend(i64::try_from(cost).unwrap_or(i64::MAX / 2)) {
        return;
    }
    let lease = cost.max(LEASE_NS);
    let start = clock::monotonic_ns();
    let (mut now, mut waited) = (start, false);
    // (Not intact only when even a private copy failed: the launch goes.)
    while attach.intact() {
        let entry = attach.region.device(dev);
        let admitted = bucket::admit(entry, cost, lease, now);
        match admitted {
            Admit::Now(granted) => {
                entry.add_admitted_ns(granted);
                entry.add_held_ns(shape.held_ns(granted, cost));
                if waited {
                    entry.add_wait_ns(now - start);
                }
                credit.add(i64::try_from(granted.saturating_sub(cost)).unwrap_or(0));
                return;
            }
            Admit::Wait(ns) | Admit::NextWindow(ns) => {
                if !waited {
                    if !counted {
                        entry.count_wait();
                    }
                    waited = true;
                    if matches!(admitted, Admit::NextWindow(_))
                        && entry.limited_beside(now)
                        && !capturing()
                    {
                        // The window's last steps are timed (no driver
                        // call while a capture is under way). Only beside
                        // a container that takes turns: beside one that
                        // takes none every tail reads lost, and a 30 %
                        // container of long kernels beside a process
                        // without vgpu moved and fell to 0.20-0.25 of
                        // solo (simulated GPU, 9d77219).
                        probes::close_at_window_end(dev, entry.turns_in_force());
                    }
                }
                pause(ns, now);
                now = clock::monotonic_ns();
            }
        }
    }
}

/// Waits shorter than this are spun (yielding), not slept: a sleep
/// overshoots by Linux's timer slack (50 µs) and more on a busy host, as
/// long as a paced 0.1 ms step's whole wait at 90 % (about 0.01 ms), and
/// the step then took 2-5 times its ideal at its p99.
const SPIN_NS: u64 = 100_000;

/// Waits `ns` from `now` for the bucket.
fn pause(ns: u64, now: u64) {
    if ns > SPIN_NS {
        std::thread::sleep(Duration::from_nanos(ns));
        return;
    }
    let until = now.saturating_add(ns);
    while clock::monotonic_ns() < until {
        std::thread::yield_now();
    }
}

/// What a launch of `shape` is charged: its learned cost, or the guess
/// for a shape not timed yet.
pub fn cost_ns(shape: &Slot) -> u64 {
    match shape.cost_ns() {
        0 => estimate::DEFAULT_NS,
        c => c,
    }
}

/// Notes that this process uses device entry `dev`, and whether an SM
/// limit is in force there. A container with a limit runs in turns: the
/// first of its processes to see one picks where they begin.
pub fn device_in_use(attach: &Attach, dev: EntryIndex) {
    let entry = attach.region.device(dev);
    // A rest whose leader is gone (the container's last process exited
    // beside limited neighbours) holds no one: its next leader sets it
    // again if the neighbours are still busy.
    if entry.sm_limit() == 0 && entry.rest_percent() != 0 {
        let leader = entry.leader_pid();
        if leader == 0 || !vgpu_shm::procinfo::pid_exists(leader as i32) {
            entry.set_rest_percent(0);
        }
    }
    let on = attach.region.enforces_sm_limit(dev);
    if on && entry.turn_anchor() == 0 {
        let now = clock::monotonic_ns();
        let random =
            now.rotate_left(29) ^ u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        entry.choose_turn_anchor(turns::first_anchor(now, random, period::of(entry)));
    }
    process::device(dev).limiter.set_enforced(on);
    if on && !duty::any(duty::LIMIT) {
        duty::set(duty::LIMIT);
    }
}

/// The watcher re-checks whether limits appeared in the region.
pub fn refresh(attach: &Attach, devices: impl Iterator<Item = EntryIndex>) {
    for dev in devices {
        device_in_use(attach, dev);
    }
}

/// A stream capture began (`delta` 1) or ended (-1).
pub fn capture_changed(delta: i32) {
    process::capture_changed(delta);
}

/// Sets a graph's first cost estimate, computed once at instantiation.
pub fn graph_instantiated(exec: usize, cost_ns: u64) {
    estimate::slot(estimate::graph_key(exec)).seed(cost_ns);
}

/// The learned cost of a kernel shape, if any.
pub fn kernel_cost(func: usize, grid: [u32; 3], block: [u32; 3]) -> Option<u64> {
    estimate::find(estimate::kernel_key(func, grid, block))
        .map(Slot::cost_ns)
        .filter(|&c| c != 0)
}
