//! Suspension and restore of this process, run by its watcher thread.
//!
//! Every tick (`tick`) the watcher publishes what the process holds on
//! which card and when it last called CUDA. When another process on one
//! of its cards waits for room and this one is the idlest there
//! (`policy`), it reserves host memory within the node's bound
//! (`VGPU_OVERSUBSCRIBE_HOST_LIMIT`; over it, no suspension), locks its own
//! process (1 s timeout: a process busy inside the driver stays), and
//! checkpoints it. Its threads' next CUDA call (`resume`) asks the
//! watcher to restore it, which waits until the card has room (publishing
//! what it needs, so that the idle processes there make it), restores and
//! unlocks. If the watcher stops beating, the calling thread restores the
//! process itself. One log line per suspension and per restore.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use vgpu_shm::board::ProcState;

use super::admission::WAITING;
use super::policy::{Seen, card_to_free};
use super::{
    ACTIVE, ACTIVITY, FAILED, Here, IN_CALL, RESTORING, RUNNING, STATE, SUSPENDED, SUSPENDING,
    checkpoint, here, settings,
};
use crate::attach::Attach;
use crate::cuda::sys::CUresult;
use crate::quota::grant::fmt_bytes;
use crate::{clock, process, watcher};

/// How long the lock waits for calls in flight before giving up.
const LOCK_TIMEOUT_MS: u32 = 1000;
/// A watcher silent this long is gone: callers restore the process.
const WATCHER_GONE_NS: u64 = 2_000_000_000;
const RETRY: Duration = Duration::from_millis(20);

/// The watcher's last tick.
static BEAT: AtomicU64 = AtomicU64::new(0);
/// ACTIVITY as the watcher last saw it, and when it changed.
static SEEN_ACTIVITY: AtomicU64 = AtomicU64::new(0);
static LAST_ACTIVE: AtomicU64 = AtomicU64::new(0);
/// A thread waits for the process to be restored.
static RESTORE_WANTED: AtomicBool = AtomicBool::new(false);
/// What the process held on each card when it was suspended.
static SAVED: Mutex<Vec<([u8; 16], u64)>> = Mutex::new(Vec::new());
/// One restore at a time (the watcher, or a caller when it is gone).
static RESTORER: Mutex<()> = Mutex::new(());
/// Callers wait here for the restore.
static DONE: Mutex<()> = Mutex::new(());
static DONE_CV: Condvar = Condvar::new();

/// Whether this process's memory is off the card (the watcher then does
/// nothing else: any other step could call into the locked driver).
pub fn suspended() -> bool {
    ACTIVE.load(Ordering::Relaxed) && STATE.load(Ordering::Acquire) != RUNNING
}

/// The watcher's step; false when the watcher should stop
/// (`VGPU_TEST_WATCHER_STOP`, after a suspension).
pub fn tick(attach: &Attach) -> bool {
    if !ACTIVE.load(Ordering::Relaxed) {
        return true;
    }
    let now = clock::monotonic_ns();
    BEAT.store(now, Ordering::Release);
    let Some(h) = here() else { return true };
    let act = ACTIVITY.load(Ordering::Relaxed);
    if SEEN_ACTIVITY.swap(act, Ordering::Relaxed) != act
        || IN_CALL.load(Ordering::Acquire) != 0
        || WAITING.load(Ordering::Acquire) != 0
        || LAST_ACTIVE.load(Ordering::Relaxed) == 0
    {
        LAST_ACTIVE.store(now, Ordering::Relaxed);
        h.entry().last_active_ns.store(now, Ordering::Release);
    }
    match STATE.load(Ordering::Acquire) {
        RUNNING => {
            publish_cards(attach, h);
            maybe_suspend(h, now)
        }
        SUSPENDED if RESTORE_WANTED.load(Ordering::Acquire) => {
            restore_now(h);
            true
        }
        _ => true,
    }
}

/// What this process holds on each card it uses, from its slot.
fn publish_cards(attach: &Attach, h: &Here) {
    let Some(slot) = attach.slot() else { return };
    for dev in process::devices_in_use() {
        if !attach.intact() {
            return;
        }
        let uuid = attach.region.device(dev).uuid();
        h.entry()
            .set_bytes_on(&uuid, attach.region.slot_total(slot, dev));
    }
}

fn seen(h: &Here, i: usize) -> Seen {
    let e = h.board.entry(i);
    Seen {
        index: i,
        state: e.state(),
        last_active_ns: e.last_active_ns.load(Ordering::Acquire),
        cards: e.cards(),
        wants: e.wants(),
    }
}

fn maybe_suspend(h: &'static Here, now: u64) -> bool {
    let s = settings();
    let others: Vec<Seen> = h
        .board
        .others(Some(h.entry))
        .map(|(i, _)| seen(h, i))
        .collect();
    let me = seen(h, h.entry);
    let Some(card) = card_to_free(&me, &others, now, s.idle_ns) else {
        return true;
    };
    let bytes: u64 = me.cards.iter().map(|&(_, b)| b).sum();
    if !h.board.reserve_host(h.entry, bytes, s.host_limit) {
        crate::warn_once!(
            "CUDA_OVERSUBSCRIBE: suspending this process would take host memory for suspended state past {} (VGPU_OVERSUBSCRIBE_HOST_LIMIT, {} in use): no more suspensions until some is freed",
            fmt_bytes(s.host_limit),
            fmt_bytes(h.board.host_bytes(Some(h.entry)))
        );
        return true;
    }
    suspend(h, card, bytes, &me.cards);
    !(s.test_watcher_stop && STATE.load(Ordering::Acquire) == SUSPENDED)
}

fn suspend(h: &Here, card: [u8; 16], bytes: u64, cards: &[([u8; 16], u64)]) {
    let e = h.entry();
    let t0 = Instant::now();
    e.set_state(ProcState::Suspending, clock::monotonic_ns());
    let before = ACTIVITY.load(Ordering::Relaxed);
    let undo = |why: String| {
        e.host_bytes.fetch_sub(bytes, Ordering::SeqCst);
        e.set_state(ProcState::Running, clock::monotonic_ns());
        log::info!("CUDA_OVERSUBSCRIBE: not suspended: {why}");
    };
    if let Err(rc) = checkpoint::lock(LOCK_TIMEOUT_MS) {
        return undo(format!(
            "the lock was not taken within {LOCK_TIMEOUT_MS} ms ({rc})"
        ));
    }
    // Not SUSPENDED before the checkpoint is done and SAVED says what to
    // restore: a caller that took the watcher's silence during a 25 s
    // checkpoint for its death restored a half-checkpointed process with
    // nothing saved, and the driver failed it (run 19).
    STATE.store(SUSPENDING, Ordering::Release);
    if let Err(rc) = checkpoint::checkpoint() {
        if checkpoint::state() == Some(checkpoint::FAILED) {
            fail(
                h,
                format!("the checkpoint failed ({rc}) and the driver marks the process failed"),
            );
            return;
        }
        let _ = checkpoint::unlock();
        STATE.store(RUNNING, Ordering::Release);
        return undo(format!("the checkpoint failed ({rc})"));
    }
    *SAVED.lock().unwrap_or_else(PoisonError::into_inner) = cards.to_vec();
    BEAT.store(clock::monotonic_ns(), Ordering::Release);
    STATE.store(SUSPENDED, Ordering::Release);
    for (c, _) in cards {
        e.set_bytes_on(c, 0);
    }
    e.suspensions.fetch_add(1, Ordering::Relaxed);
    e.set_state(ProcState::Suspended, clock::monotonic_ns());
    log::warn!(
        "CUDA_OVERSUBSCRIBE: suspended this process: {} of device memory moved to the host in {} ms, to make room on {}",
        fmt_bytes(bytes),
        t0.elapsed().as_millis(),
        vgpu_shm::format_uuid(&card)
    );
    // A call that came in meanwhile may be blocked inside the driver.
    if ACTIVITY.load(Ordering::Relaxed) != before {
        RESTORE_WANTED.store(true, Ordering::Release);
        restore_now(h);
    }
}

/// A caller's way back: the watcher restores the process (or the caller
/// itself, if the watcher is gone). Err: the call's answer.
pub fn resume() -> Result<(), CUresult> {
    RESTORE_WANTED.store(true, Ordering::Release);
    watcher::kick();
    let mut g = DONE.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        match STATE.load(Ordering::Acquire) {
            RUNNING => return Ok(()),
            FAILED => {
                crate::warn_once!(
                    "CUDA_OVERSUBSCRIBE: this process's device memory could not be restored; its CUDA calls fail with CUDA_ERROR_ILLEGAL_STATE"
                );
                return Err(CUresult::ERROR_ILLEGAL_STATE);
            }
            _ => {}
        }
        let silent = clock::monotonic_ns().saturating_sub(BEAT.load(Ordering::Acquire));
        // (While SUSPENDING the watcher is inside the checkpoint: silent.)
        if silent > WATCHER_GONE_NS
            && STATE.load(Ordering::Acquire) == SUSPENDED
            && let Some(h) = here()
        {
            drop(g);
            crate::warn_once!(
                "CUDA_OVERSUBSCRIBE: the watcher thread is gone ({} ms silent): restoring this process from the calling thread",
                silent / 1_000_000
            );
            restore_now(h);
            g = DONE.lock().unwrap_or_else(PoisonError::into_inner);
            continue;
        }
        g = DONE_CV
            .wait_timeout(g, Duration::from_millis(50))
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Restores the process: waits until its cards have room for it (asking
/// for it on the board), then restore and unlock.
fn restore_now(h: &Here) {
    let _one = RESTORER.lock().unwrap_or_else(PoisonError::into_inner);
    if STATE.load(Ordering::Acquire) != SUSPENDED {
        return;
    }
    STATE.store(RESTORING, Ordering::Release);
    let e = h.entry();
    e.set_state(ProcState::Restoring, clock::monotonic_ns());
    let saved = SAVED.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let total: u64 = saved.iter().map(|&(_, b)| b).sum();
    let t0 = Instant::now();
    let mut waited = Duration::ZERO;
    let mut said = Instant::now();
    loop {
        BEAT.store(clock::monotonic_ns(), Ordering::Release);
        let short = saved.iter().find(|&&(card, bytes)| {
            crate::nvml::client::free_memory(&card).is_some_and(|free| free < bytes)
        });
        if short.is_none() {
            let t = Instant::now();
            match checkpoint::restore() {
                Ok(()) => match checkpoint::unlock() {
                    Ok(()) => break,
                    Err(rc) => return fail(h, format!("unlock after restore failed ({rc})")),
                },
                Err(rc) if rc == CUresult::ERROR_OUT_OF_MEMORY => {}
                Err(rc) => return fail(h, format!("the restore failed ({rc})")),
            }
            waited += t.elapsed();
        }
        let (card, _) = short
            .copied()
            .unwrap_or(saved.first().copied().unwrap_or(([0; 16], 0)));
        e.set_want(&card, total);
        if said.elapsed() >= Duration::from_secs(10) {
            said = Instant::now();
            log::warn!(
                "CUDA_OVERSUBSCRIBE: still waiting for room for {} on {} to restore this process ({} s so far)",
                fmt_bytes(total),
                vgpu_shm::format_uuid(&card),
                t0.elapsed().as_secs()
            );
        }
        std::thread::sleep(RETRY);
        waited += RETRY;
    }
    for &(card, bytes) in &saved {
        e.set_bytes_on(&card, bytes);
    }
    e.set_want(&[0; 16], 0);
    e.host_bytes.fetch_sub(total, Ordering::SeqCst);
    e.restores.fetch_add(1, Ordering::Relaxed);
    e.last_active_ns
        .store(clock::monotonic_ns(), Ordering::Release);
    LAST_ACTIVE.store(clock::monotonic_ns(), Ordering::Relaxed);
    e.set_state(ProcState::Running, clock::monotonic_ns());
    RESTORE_WANTED.store(false, Ordering::Release);
    finish(RUNNING);
    log::warn!(
        "CUDA_OVERSUBSCRIBE: restored this process: {} back on the card in {} ms ({} ms of it waiting for room)",
        fmt_bytes(total),
        t0.elapsed().as_millis(),
        waited.min(t0.elapsed()).as_millis()
    );
}

fn fail(h: &Here, why: String) {
    h.entry()
        .set_state(ProcState::Failed, clock::monotonic_ns());
    log::error!("CUDA_OVERSUBSCRIBE: {why}; this process's CUDA calls fail from now on");
    finish(FAILED);
}

fn finish(state: u8) {
    let _g = DONE.lock().unwrap_or_else(PoisonError::into_inner);
    STATE.store(state, Ordering::Release);
    DONE_CV.notify_all();
}
