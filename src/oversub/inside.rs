//! The count of threads inside CUDA hooks while oversubscription is on:
//! a suspension that moves memory itself (mover.rs) waits until it is
//! zero, and a thread that only waits (for room) steps outside.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::mover;
use super::state::{ACTIVITY, RUNNING, STATE};
use crate::cuda::sys::CUresult;

/// A thread inside a hook, while oversubscription is on: a suspension
/// that moves memory itself (mover.rs) waits until none is. Holds the
/// hook's name and when it entered, to name a call that kept a
/// suspension waiting.
#[must_use]
pub struct Inside(Option<(&'static str, Instant)>);

impl Inside {
    /// Not counted (oversubscription is off).
    pub(super) fn none() -> Inside {
        Inside(None)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        if let Some((name, since)) = self.0 {
            // (try_with: a hook may run from a thread-local destructor
            // after this one's; `with` would panic there.)
            let _ = HELD.try_with(|h| h.set(h.get().saturating_sub(1)));
            mover::INSIDE.fetch_sub(1, Ordering::SeqCst);
            mover::left(name, since);
        }
    }
}

thread_local! {
    /// How many `Inside` guards this thread holds (a hook inside a hook).
    static HELD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Runs `wait` (no driver call in it) as if this thread had left its
/// hooks, so a suspension need not wait for it: an allocation waiting for
/// room must not keep its own process from giving its turn. Then enters
/// again as a hook does, restoring the process first if it was suspended
/// meanwhile (`resume`: restore.rs's, passed in below the restore's
/// layer). Err: the restore's answer (the guards count again).
pub(super) fn outside<R>(
    wait: impl FnOnce() -> R,
    resume: fn() -> Result<(), CUresult>,
) -> Result<R, CUresult> {
    let held = HELD.try_with(|h| h.get()).unwrap_or(0);
    if held == 0 {
        return Ok(wait());
    }
    mover::INSIDE.fetch_sub(held, Ordering::SeqCst);
    let r = wait();
    loop {
        mover::INSIDE.fetch_add(held, Ordering::SeqCst);
        if STATE.load(Ordering::SeqCst) == RUNNING {
            return Ok(r);
        }
        mover::INSIDE.fetch_sub(held, Ordering::SeqCst);
        if let Err(rc) = resume() {
            mover::INSIDE.fetch_add(held, Ordering::SeqCst);
            return Err(rc);
        }
    }
}

/// Out of line: inlined, its stack frame was set up on every hook, with
/// oversubscription off too.
#[cold]
#[inline(never)]
pub(super) fn entered(
    name: &'static str,
    resume: fn() -> Result<(), CUresult>,
) -> Result<Inside, CUresult> {
    ACTIVITY.fetch_add(1, Ordering::Relaxed);
    loop {
        // Counted before the state is read (SeqCst both sides): a
        // suspension that stores SUSPENDING and then reads the count
        // either sees this thread or this thread sees SUSPENDING.
        mover::INSIDE.fetch_add(1, Ordering::SeqCst);
        if STATE.load(Ordering::SeqCst) == RUNNING {
            let _ = HELD.try_with(|h| h.set(h.get() + 1));
            return Ok(Inside(Some((name, Instant::now()))));
        }
        mover::INSIDE.fetch_sub(1, Ordering::SeqCst);
        resume()?;
    }
}
