//! The device scheduler: how a simulated GPU runs the work processes queue
//! on it, the way a real one time-slices contexts of different processes
//! (no MPS).
//!
//! Each process has a FIFO of work items per device (kernels with their
//! duration, and markers that event records leave). The device runs one
//! process's context at a time:
//! - a context alone with work is never preempted;
//! - while others have work too, a context runs for at most a time slice
//!   (`slice_ns`), then the next one in turn gets the device; one that
//!   runs out of work gives it up at once;
//! - handing the device to another context costs `switch_ns` of device
//!   time in which nothing progresses (counted as the incoming context's
//!   busy time, as NVML sees a busy device);
//! - a marker is reached only while its context runs: an event's time
//!   includes every other context's slice before it. One right behind the
//!   context's work is written as that work ends, even when its slice
//!   ends at the same instant (1 ms kernels fill 2 ms slices exactly: a
//!   switch back for each such event cost twice the measured overhead).
//!
//! Kernel end times are not known at launch (a later launch by another
//! process changes them), so nothing is computed then: [`run`] replays the
//! schedule up to a given time whenever a process asks what has finished
//! (queue.rs, under a lock of the state file), and records each process's
//! busy intervals for NVML. Items that were queued before the schedule got
//! to them count as arriving when it does.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::state::{Proc, RING, Shared};

pub const QUEUE: usize = 4096;
/// `Item::work` of a marker.
pub const MARKER: u64 = u64::MAX;

#[repr(C)]
pub struct Item {
    /// Nanoseconds of device time, or `MARKER`.
    pub work: AtomicU64,
    /// When it was queued (CLOCK_MONOTONIC ns).
    pub arrival: AtomicU64,
    pub seq: AtomicU64,
    /// When the device reached it (markers; written by the scheduler).
    pub ts: AtomicU64,
}

#[repr(C)]
pub struct Queue {
    /// The process whose work this is (0: dropped).
    pub owner: AtomicI32,
    _pad: AtomicU32,
    /// Sequence number of the next item (written by the owner).
    pub tail: AtomicU64,
    /// Items before this one are done (written by the scheduler).
    pub head: AtomicU64,
    /// Nanoseconds of the head item already run.
    pub progress: AtomicU64,
    pub items: [Item; QUEUE],
}

pub fn index(seq: u64) -> usize {
    (seq % QUEUE as u64) as usize
}

impl Queue {
    /// Empties the queue for `owner`, numbering its items from `base`.
    pub fn reset(&self, base: u64, owner: i32) {
        self.tail.store(base, Ordering::Release);
        self.head.store(base, Ordering::Release);
        self.progress.store(0, Ordering::Release);
        self.owner.store(owner, Ordering::Release);
    }

    /// Whether item `seq` is done (an item of an earlier claim always is).
    pub fn done(&self, seq: u64) -> bool {
        self.head.load(Ordering::Acquire) > seq
    }
}

/// A device's scheduler state, replayed forward by [`run`].
#[repr(C)]
pub struct Sched {
    /// The schedule is known up to here (CLOCK_MONOTONIC ns).
    pub t: AtomicU64,
    /// Entry index + 1 of the context that holds (or last held) the
    /// device; 0: none yet.
    pub cur: AtomicU64,
    /// When the current context's slice ends.
    pub slice_end: AtomicU64,
    /// While later than `t`: the device is switching to `cur` until then.
    pub switch_end: AtomicU64,
}

/// One process's queue, as a run sees it.
struct Active<'a> {
    slot: usize,
    proc_: &'a Proc,
    q: &'a Queue,
    head: u64,
    tail: u64,
    progress: u64,
}

impl Active<'_> {
    fn item(&self) -> &Item {
        &self.q.items[index(self.head)]
    }

    /// When its next item arrives, if it has one.
    fn arrival(&self) -> Option<u64> {
        (self.head < self.tail).then(|| self.item().arrival.load(Ordering::Acquire))
    }

    fn runnable(&self, t: u64) -> bool {
        self.arrival().is_some_and(|a| a <= t)
    }

    /// Its process died: the driver drops what it queued.
    fn drop_work(&mut self) {
        self.head = self.tail;
        self.progress = 0;
        self.q.owner.store(0, Ordering::Release);
    }
}

/// Appends busy time [s, e) to `p`'s intervals on `dev`.
fn record_busy(p: &Proc, dev: usize, s: u64, e: u64) {
    if e <= s {
        return;
    }
    let head = p.head[dev].load(Ordering::Relaxed);
    if head > 0 {
        let last = &p.ring[dev][((head - 1) % RING as u64) as usize];
        if last.end.load(Ordering::Relaxed) == s {
            last.end.store(e, Ordering::Release);
            return;
        }
    }
    let slot = &p.ring[dev][(head % RING as u64) as usize];
    slot.start.store(s, Ordering::Release);
    slot.end.store(e, Ordering::Release);
    p.head[dev].store(head + 1, Ordering::Release);
}

/// The next context in turn after entry `cur - 1` with work at `t`,
/// dropping the work of dead processes on the way.
fn next_in_turn(
    act: &mut [Active],
    cur: u64,
    t: u64,
    alive: &mut dyn FnMut(usize) -> bool,
) -> Option<usize> {
    let n = act.len();
    let start = act
        .iter()
        .position(|a| a.slot as u64 + 1 > cur)
        .unwrap_or(0);
    for k in 0..n {
        let i = (start + k) % n;
        if act[i].slot as u64 + 1 == cur || !act[i].runnable(t) {
            continue;
        }
        if alive(act[i].slot) {
            return Some(i);
        }
        act[i].drop_work();
    }
    None
}

/// Replays device `dev`'s schedule up to `target`. The caller holds the
/// device's lock; `alive(entry)` says whether a process still runs.
pub fn run(sh: &Shared, dev: usize, target: u64, alive: &mut dyn FnMut(usize) -> bool) {
    let s = &sh.sched[dev];
    let d = &sh.dev[dev];
    let slice = d.slice_ns.load(Ordering::Relaxed).max(1);
    let switch = d.switch_ns.load(Ordering::Relaxed);
    let mut t = s.t.load(Ordering::Acquire);
    if target <= t {
        return;
    }
    let mut act: Vec<Active> = sh
        .procs
        .iter()
        .enumerate()
        .filter_map(|(slot, p)| {
            let pid = p.pid.load(Ordering::Acquire);
            let q = &p.queue[dev];
            let (head, tail) = (
                q.head.load(Ordering::Acquire),
                q.tail.load(Ordering::Acquire),
            );
            (pid != 0 && q.owner.load(Ordering::Acquire) == pid && head < tail).then(|| Active {
                slot,
                proc_: p,
                q,
                head,
                tail,
                progress: q.progress.load(Ordering::Relaxed),
            })
        })
        .collect();
    let mut cur = s.cur.load(Ordering::Relaxed);
    let mut slice_end = s.slice_end.load(Ordering::Relaxed);
    let mut switch_end = s.switch_end.load(Ordering::Relaxed);
    if cur != 0 && sh.procs[cur as usize - 1].pid.load(Ordering::Acquire) == 0 {
        cur = 0; // its process is gone: nothing to switch away from
    }
    // Each process is asked about at most once a run.
    let (mut asked, mut dead) = (0u64, 0u64);
    let mut alive = |slot: usize| {
        let bit = 1u64 << slot;
        if asked & bit == 0 {
            asked |= bit;
            if !alive(slot) {
                dead |= bit;
            }
        }
        dead & bit == 0
    };
    while t < target {
        if switch_end > t {
            let end = switch_end.min(target);
            if cur != 0 {
                record_busy(&sh.procs[cur as usize - 1], dev, t, end);
            }
            t = end;
            if t == switch_end {
                slice_end = t + slice;
            }
            continue;
        }
        let running = act
            .iter()
            .position(|a| a.slot as u64 + 1 == cur && a.runnable(t));
        let Some(ci) = running else {
            // The device is free: the next context with work takes it.
            match next_in_turn(&mut act, cur, t, &mut alive) {
                Some(n) if cur != 0 && switch > 0 => {
                    cur = act[n].slot as u64 + 1;
                    switch_end = t + switch;
                }
                Some(n) => {
                    cur = act[n].slot as u64 + 1;
                    slice_end = t + slice;
                }
                None => {
                    let next = act.iter().filter_map(Active::arrival).filter(|&a| a > t);
                    t = next.min().unwrap_or(target).min(target);
                }
            }
            continue;
        };
        if !alive(act[ci].slot) {
            act[ci].drop_work();
            continue;
        }
        // An event right behind the context's work is written as that
        // work ends, even when the slice ends at the same instant.
        let item = act[ci].item();
        if item.work.load(Ordering::Relaxed) == MARKER {
            item.ts.store(t, Ordering::Release);
            act[ci].head += 1;
            act[ci].progress = 0;
            continue;
        }
        if slice_end <= t {
            let others = act
                .iter()
                .enumerate()
                .any(|(i, a)| i != ci && a.runnable(t));
            if others {
                let n = next_in_turn(&mut act, cur, t, &mut alive);
                if let Some(n) = n {
                    cur = act[n].slot as u64 + 1;
                    switch_end = t + switch;
                    slice_end = t + switch + slice;
                    continue;
                }
            }
            // Alone: the slice timer just starts over.
            slice_end += ((t - slice_end) / slice + 1) * slice;
        }
        let a = &mut act[ci];
        let item = a.item();
        let work = item.work.load(Ordering::Relaxed);
        let end = target.min(slice_end).min(t + (work - a.progress));
        record_busy(a.proc_, dev, t, end);
        a.progress += end - t;
        t = end;
        if a.progress >= work {
            a.head += 1;
            a.progress = 0;
        }
    }
    for a in &act {
        a.q.progress.store(a.progress, Ordering::Relaxed);
        a.q.head.store(a.head, Ordering::Release);
    }
    s.cur.store(cur, Ordering::Relaxed);
    s.slice_end.store(slice_end, Ordering::Relaxed);
    s.switch_end.store(switch_end, Ordering::Relaxed);
    s.t.store(t, Ordering::Release);
}

#[cfg(test)]
#[path = "sched_tests.rs"]
mod tests;
