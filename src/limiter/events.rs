//! Times launches with CUDA events, for the limiter's cost estimates
//! (`limiter/estimate.rs`), a sample at a time: the first launch of a
//! shape, then one every `RESAMPLE_NS`. Events come from a per-context
//! pool, destroyed with their context; finished timings are collected
//! without blocking at later samples. No lock is held across a driver
//! call, and nothing here runs while a stream capture is in progress (an
//! event query could invalidate it).
#![forbid(unsafe_code)]

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use super::estimate::{self, Slot};
use crate::cuda::sys::*;
use crate::cuda::{driver, real};
use crate::ffi::Out;
use crate::lock::{Listed, Lock, Name};

/// A timing in flight.
pub struct Pending {
    slot: &'static Slot,
    ctx: usize,
    start: usize,
    end: usize,
    /// The start event did not wait for queued work: the timing may hold
    /// the launch latency and the host's submission time.
    idle: bool,
}

/// An event pair waiting for its launch.
pub struct Sample {
    slot: &'static Slot,
    ctx: usize,
    start: CUevent,
    end: CUevent,
    stream: CUstream,
    /// When the start event was recorded (CLOCK_MONOTONIC ns).
    recorded_ns: u64,
    idle: bool,
}

/// A sample whose launch call returned this long after its start event
/// was recorded is discarded: on an idle stream the GPU would have timed
/// the host's delay (a preemption, a full launch queue) as kernel time.
const MAX_HOST_GAP_NS: u64 = 100_000;

/// Timings in flight. In a forked child there are none: no shape waits
/// for one (its events were the parent's).
pub static PENDING: Lock<Vec<Pending>> = Lock::new(Vec::new(), |pending| {
    pending.clear();
    estimate::clear_pending();
});
/// Idle events: (context, event). A forked child has none.
pub static POOL: Lock<Vec<(usize, usize)>> = Lock::new(Vec::new(), |pool| pool.clear());

/// This module's locks, for the fork handlers (`fork.rs`).
pub fn locks() -> [Listed; 2] {
    [
        (Name::of("events.pending"), &PENDING),
        (Name::of("events.pool"), &POOL),
    ]
}

const EVENT_DEFAULT: c_int = 0;

pub(super) fn take_event(ctx: usize) -> Option<CUevent> {
    let pooled = {
        let mut pool = POOL.lock();
        pool.iter()
            .position(|&(c, _)| c == ctx)
            .map(|i| pool.swap_remove(i).1)
    };
    if let Some(e) = pooled {
        return Some(e as CUevent);
    }
    let mut e: CUevent = std::ptr::null_mut();
    real::cuEventCreate(Out::from(&mut e), EVENT_DEFAULT as u32)
        .is_ok()
        .then_some(e)
}

pub(super) fn give_back(ctx: usize, events: &[usize]) {
    POOL.lock().extend(events.iter().map(|&e| (ctx, e)));
}

/// [`give_back`] unless the pool is locked (the events then stay out of
/// it): for a thread's exit, which may run inside `exit()` called from a
/// signal handler that interrupted this very thread holding the lock.
pub(super) fn try_give_back(ctx: usize, events: &[usize]) {
    if let Some(mut pool) = POOL.try_lock() {
        pool.extend(events.iter().map(|&e| (ctx, e)));
    }
}

/// Finished timings are collected at most this often outside samples
/// (compared on the coarse clock).
const POLL_EVERY_NS: u64 = 2_000_000;
static LAST_POLL_NS: AtomicU64 = AtomicU64::new(0);

/// Starts timing a launch on `stream` if `slot` wants a sample now.
pub fn begin(slot: &'static Slot, stream: CUstream, now: u64) -> Option<Sample> {
    if !slot.claim_sample(now) {
        // A timing of this shape may be waiting to be collected.
        let last = LAST_POLL_NS.load(Ordering::Relaxed);
        if slot.timing_pending()
            && now.saturating_sub(last) >= POLL_EVERY_NS
            && LAST_POLL_NS
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            poll();
        }
        return None;
    }
    // An idle stream's start event fires before the launch latency (and
    // the host's submission): a known shape waits for a launch behind
    // queued work, a few times at most.
    let idle = real::cuStreamQuery(stream).is_ok();
    if slot.pass_over_idle(idle) {
        return None;
    }
    poll();
    let started = (|| {
        let ctx = driver::current_context()? as usize;
        let start = take_event(ctx)?;
        let Some(end) = take_event(ctx) else {
            give_back(ctx, &[start as usize]);
            return None;
        };
        if !real::cuEventRecord(start, stream).is_ok() {
            give_back(ctx, &[start as usize, end as usize]);
            return None;
        }
        Some(Sample {
            slot,
            ctx,
            start,
            end,
            stream,
            recorded_ns: crate::clock::monotonic_ns(),
            idle,
        })
    })();
    if started.is_none() {
        slot.timing_done();
    }
    started
}

/// Finishes a timing after the launch returned `rc`.
pub fn end(s: Sample, rc: CUresult) {
    let prompt = crate::clock::monotonic_ns().saturating_sub(s.recorded_ns) <= MAX_HOST_GAP_NS;
    if rc.is_ok() && prompt && real::cuEventRecord(s.end, s.stream).is_ok() {
        // A start event that has fired by the time the launch call returns
        // did not wait for queued work: the GPU reached it while the host
        // was still submitting the kernel, so the timing holds that gap
        // (2-3 us of a 3 us period for a host-bound stream of empty
        // kernels, run 21) and is taken as an idle-stream one. One still
        // waiting is behind work the kernel was queued after: its own time.
        let waited = real::cuEventQuery(s.start) == CUresult::ERROR_NOT_READY;
        log::trace!(
            "sample: stream idle before {}, start event waited {waited}",
            s.idle
        );
        PENDING.lock().push(Pending {
            slot: s.slot,
            ctx: s.ctx,
            start: s.start as usize,
            end: s.end as usize,
            idle: s.idle || !waited,
        });
    } else {
        give_back(s.ctx, &[s.start as usize, s.end as usize]);
        s.slot.timing_done();
    }
}

/// Collects finished timings. With `wait_for`, first blocks until that
/// slot's timing (if any) is done: the second launch of a new shape must
/// not run on a guess.
fn collect(wait_for: Option<&'static Slot>) {
    let mut todo = std::mem::take(&mut *PENDING.lock());
    if let Some(target) = wait_for
        && let Some(p) = todo.iter().find(|p| std::ptr::eq(p.slot, target))
    {
        let _ = real::cuEventSynchronize(p.end as CUevent);
    }
    todo.retain(|p| {
        let rc = real::cuEventQuery(p.end as CUevent);
        if rc == CUresult::ERROR_NOT_READY {
            return true;
        }
        let mut ms = 0f32;
        if rc.is_ok()
            && real::cuEventElapsedTime(Out::from(&mut ms), p.start as CUevent, p.end as CUevent)
                .is_ok()
        {
            p.slot.record_timing((f64::from(ms) * 1e6) as u64, p.idle);
        }
        p.slot.timing_done();
        give_back(p.ctx, &[p.start, p.end]);
        false
    });
    PENDING.lock().extend(todo);
}

/// Collects finished timings without waiting.
pub fn poll() {
    collect(None);
}

/// Waits for the in-flight timing of `slot`, if there is one.
pub fn wait_for(slot: &'static Slot) {
    if slot.timing_pending() {
        collect(Some(slot));
    }
}

/// Context `ctx` is about to be destroyed or reset: its idle events are
/// destroyed now (those of timings in flight go with the context).
pub fn destroy_idle_events(ctx: usize) {
    let idle: Vec<usize> = {
        let mut pool = POOL.lock();
        let mut idle = Vec::new();
        pool.retain(|&(c, e)| {
            if c == ctx {
                idle.push(e);
            }
            c != ctx
        });
        idle
    };
    for e in idle {
        let _ = real::cuEventDestroy_v2(e as CUevent);
    }
}

/// A context was destroyed: its events went with it.
pub fn forget_context(ctx: usize) {
    POOL.lock().retain(|&(c, _)| c != ctx);
    PENDING.lock().retain(|p| {
        if p.ctx == ctx {
            p.slot.timing_done();
        }
        p.ctx != ctx
    });
}
