//! Restore of a suspended process (suspend.rs suspends it).
//!
//! Its threads' next CUDA call (`resume`) asks the watcher to restore it,
//! which waits until the card has room (publishing what it needs, so that
//! the idle processes there make it), restores and unlocks. A call waits
//! for room up to `VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS`; then it returns
//! `CUDA_ERROR_OUT_OF_MEMORY` and the process stays suspended, its host
//! copy intact, for its next call to try again. If the watcher stops
//! beating, the calling thread restores the process itself. One log line
//! per restore and per call that gives up.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vgpu_shm::board::ProcState;

use super::claim::{Gate, claim_room, short_of_room};
use super::handover::{BEAT, LAST_ACTIVE, SAVED, beating};
use super::mover::Back;
use super::restore_room;
use super::state::{
    FAILED, Here, RESTORING, RUNNING, STATE, SUSPENDED, SUSPENDING, here, settings,
};
use crate::attach::Attach;
use crate::clock;
use crate::cuda::sys::CUresult;
use crate::lock::{CondLock, Listed, Name, keep};
use crate::log::fmt_bytes;

/// A watcher silent this long is gone: callers restore the process.
const WATCHER_GONE_NS: u64 = 2_000_000_000;
const RETRY: Duration = Duration::from_millis(20);

/// A thread waits for the process to be restored.
pub(super) static RESTORE_WANTED: AtomicBool = AtomicBool::new(false);
/// How long (monotonic ns) the restore may wait for room: the latest
/// deadline of the calls waiting for it. Past it, the restorer gives up.
pub(super) static RESTORE_UNTIL: AtomicU64 = AtomicU64::new(0);
/// The restore is inside the driver, moving memory back: a call past its
/// deadline waits for it rather than fail while its memory arrives.
static MOVING: AtomicBool = AtomicBool::new(false);

/// Whether a restore is moving memory onto `card` now: allocations there
/// wait for it (admission.rs), since a restore the driver refuses loses
/// the process.
pub(super) fn restore_moving_on(h: &Here, card: &[u8; 16]) -> bool {
    // On every allocation: the entry's words first, the liveness lock
    // (a syscall) only for a candidate.
    (0..vgpu_shm::board::BOARD_ENTRIES)
        .filter(|&i| i != h.entry)
        .any(|i| {
            let e = h.board.entry(i);
            e.state() == ProcState::Restoring && e.bytes_on(card) > 0 && h.board.held_by_other(i)
        })
}

/// How long a restore waits for its own figure (a child process's NVML)
/// in one look; it looks again every 20 ms.
const NVML_WAIT: Duration = Duration::from_millis(100);

/// When the first restore since the last suspension began (monotonic ns;
/// 0: none yet).
pub(super) static FIRST_TRY_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Callers wait here for the restore to end (`STATE` leaving
/// `RESTORING`, under this lock).
static DONE: CondLock<()> = CondLock::new((), keep);

/// This module's lock, for the fork handlers (`fork.rs`).
pub(super) fn locks() -> [Listed; 1] {
    [(Name::of("oversub.restore_done"), &DONE)]
}

/// When a restore asked for now must give up waiting for room (a process
/// that gave its turn waits for the others' turns too, `line.rs`).
pub(super) fn deadline_from_now() -> u64 {
    clock::monotonic_ns()
        .saturating_add(settings().restore_wait_ms.saturating_mul(1_000_000))
        .saturating_add(super::line::restore_extra_ns())
}

/// Asks for a restore that may wait for room until `deadline`.
pub(super) fn request_restore(deadline: u64) {
    RESTORE_UNTIL.fetch_max(deadline, Ordering::AcqRel);
    RESTORE_WANTED.store(true, Ordering::Release);
    (settings().above.kick)();
}

/// A caller's way back: the watcher restores the process (or the caller
/// itself, if the watcher is gone). Err: the call's answer: out of memory
/// when the card had no room within `VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS`
/// (the process stays suspended), illegal state when the restore failed.
pub fn resume() -> Result<(), CUresult> {
    let mut deadline = deadline_from_now();
    request_restore(deadline);
    let mut g = DONE.lock();
    loop {
        let state = STATE.load(Ordering::Acquire);
        match state {
            RUNNING => return Ok(()),
            FAILED => {
                crate::warn_once!(
                    "CUDA_OVERSUBSCRIBE: this process's device memory could not be restored; its CUDA calls fail with CUDA_ERROR_ILLEGAL_STATE"
                );
                return Err(CUresult::ERROR_ILLEGAL_STATE);
            }
            // Our own checkpoint is still running: that is not waiting for
            // room, so the bound starts when it ends.
            SUSPENDING => {
                deadline = deadline_from_now();
                RESTORE_UNTIL.fetch_max(deadline, Ordering::AcqRel);
            }
            _ => {}
        }
        let now = clock::monotonic_ns();
        if now < deadline {
            // The restorer gave up for earlier calls: ask again for this one.
            if state == SUSPENDED && !RESTORE_WANTED.load(Ordering::Acquire) {
                request_restore(deadline);
            }
        } else if state != SUSPENDING && !MOVING.load(Ordering::Acquire) {
            drop(g);
            no_room();
            return Err(CUresult::ERROR_OUT_OF_MEMORY);
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
            restore_now((settings().above.attach)(), h);
            g = DONE.lock();
            continue;
        }
        g = DONE.wait_timeout(g, Duration::from_millis(50));
    }
}

/// The line of a call that gave up waiting for room to restore.
fn no_room() {
    let saved = SAVED.lock().clone();
    let total: u64 = saved.iter().map(|&(_, b)| b).sum();
    let cards: Vec<String> = saved
        .iter()
        .map(|(c, _)| vgpu_shm::format_uuid(c))
        .collect();
    log::warn!(
        "CUDA_OVERSUBSCRIBE: the card had no room to restore this process ({} of device memory, on {}) within {} ms (VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS): this call returns CUDA_ERROR_OUT_OF_MEMORY; the process stays suspended with its memory on the host, and its next CUDA call tries again",
        fmt_bytes(total),
        cards.join(", "),
        settings().restore_wait_ms
    );
}

/// Restores the process: waits until its cards have room for it (asking
/// for it on the board), then restore and unlock. Gives up, the process
/// still suspended, when no call waits any longer (`RESTORE_UNTIL`).
pub(super) fn restore_now(attach: Option<&Attach>, h: &Here) {
    if !become_restorer() {
        return;
    }
    let _unwinding = UnwindSuspended;
    let e = h.entry();
    e.set_state(ProcState::Restoring, clock::monotonic_ns());
    let saved = SAVED.lock().clone();
    let total: u64 = saved.iter().map(|&(_, b)| b).sum();
    let t0 = Instant::now();
    // What the board may hold a restore up for is bounded from the first
    // try since the suspension, not from each call's (a process whose
    // calls each wait less than the bounds would wait for ever).
    let _ = FIRST_TRY_NS.compare_exchange(
        0,
        clock::monotonic_ns(),
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    let since_first = || {
        Duration::from_nanos(
            clock::monotonic_ns().saturating_sub(FIRST_TRY_NS.load(Ordering::Acquire)),
        )
    };
    restore_room::new_restore();
    // When the claim that succeeded began, and when it ended.
    let mut phases: (Instant, Instant);
    let mut said = Instant::now();
    let mut next_try = Instant::now();
    let mut line = super::line::Defer::default();
    let mut gate = Gate::default();
    let first_card = saved
        .iter()
        .find(|&&(_, b)| b > 0)
        .map_or([0; 16], |&(c, _)| c);
    loop {
        BEAT.store(clock::monotonic_ns(), Ordering::Release);
        // The region slot's heartbeat too: the wait can last minutes.
        if let Some(a) = attach {
            a.tick();
        }
        let short = short_of_room(h, &saved, NVML_WAIT, since_first(), 0).err();
        // Room it could take: first those ahead of it in line (turns.rs).
        let ahead = short.is_none() && line.let_first(h, &first_card, || true);
        if let Some(s) = &short {
            line.pause();
            let (at, why) = s.gate();
            gate.at(at, || why);
        } else if ahead {
            gate.at("a waiter ahead in line", String::new);
        }
        if short.is_none() && !ahead && Instant::now() >= next_try {
            let claiming = Instant::now();
            let claimed = claim_room(h, &saved, since_first());
            if let Err(why) = claimed {
                gate.at(why, || format!("{} ms", claiming.elapsed().as_millis()));
            }
            if let Ok(judged) = claimed {
                phases = (claiming, Instant::now());
                MOVING.store(true, Ordering::Release);
                // A move of tens of GiB takes up to a minute: the region
                // slot keeps beating meanwhile.
                let moved = beating(attach, super::mover::bring_back);
                MOVING.store(false, Ordering::Release);
                match moved {
                    Back::Done => break,
                    Back::Unlock(rc) => {
                        return fail(h, format!("unlock after restore failed ({rc})"));
                    }
                    // VMM blocks without room after all: nothing is lost
                    // (their host copy stays), so unlike a refused
                    // checkpoint restore this is tried again later.
                    Back::NoRoom(rc) => {
                        for &(card, _) in &saved {
                            h.entry().set_bytes_on(&card, 0);
                        }
                        gate = Gate::default();
                        log::info!(
                            "CUDA_OVERSUBSCRIBE: the VMM-backed memory found no room on the card ({rc}): this process stays suspended and tries again"
                        );
                    }
                    // Driver 580 answers a restore without room with out of
                    // memory, and every later one with 304: the process
                    // can never be restored (run 28 on the H200).
                    Back::Refused(rc) => {
                        for &(card, _) in &saved {
                            h.entry().set_bytes_on(&card, 0);
                        }
                        return fail(
                            h,
                            format!(
                                "the driver refused the restore ({rc}; {} was judged free); on this driver a refused restore cannot be retried, so the process's device memory is lost",
                                fmt_bytes(judged)
                            ),
                        );
                    }
                }
            }
            // Another restore claimed the room first: a moment, then again.
            next_try = Instant::now() + RETRY * (1 + (h.entry as u32 % 4));
        }
        if clock::monotonic_ns() >= RESTORE_UNTIL.load(Ordering::Acquire) {
            return give_up(h);
        }
        let card = short
            .as_ref()
            .map_or(saved.first().map_or([0; 16], |&(c, _)| c), |s| s.card);
        e.set_want(&card, total);
        if said.elapsed() >= Duration::from_secs(10) {
            said = Instant::now();
            log::warn!(
                "CUDA_OVERSUBSCRIBE: still waiting for room for {} on {} to restore this process ({} s so far, VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS {} ms)",
                fmt_bytes(total),
                vgpu_shm::format_uuid(&card),
                t0.elapsed().as_secs(),
                settings().restore_wait_ms
            );
        }
        std::thread::sleep(RETRY);
    }
    for &(card, bytes) in &saved {
        e.set_bytes_on(&card, bytes);
    }
    e.set_want(&[0; 16], 0);
    e.release_host_bytes(total);
    e.count_restore();
    e.set_last_active_ns(clock::monotonic_ns());
    LAST_ACTIVE.store(clock::monotonic_ns(), Ordering::Relaxed);
    e.set_state(ProcState::Running, clock::monotonic_ns());
    if super::line::GAVE_TURN.swap(false, Ordering::AcqRel) {
        super::line::took_turn(h);
    } else {
        super::line::turn_began(h);
    }
    // Said before the waiting calls go on: one that then ends the
    // process would otherwise leave this line unwritten (seen on a busy
    // CI machine).
    let by_card = if saved.len() > 1 {
        let each: Vec<String> = saved
            .iter()
            .map(|(c, b)| format!("{} on {}", fmt_bytes(*b), vgpu_shm::format_uuid(c)))
            .collect();
        format!("; by card: {}", each.join(", "))
    } else {
        String::new()
    };
    log::warn!(
        "CUDA_OVERSUBSCRIBE: restored this process: {} back on the card in {} ms ({} ms of it waiting for room, {} ms claiming it, {} ms moving){by_card}",
        fmt_bytes(total),
        t0.elapsed().as_millis(),
        phases.0.duration_since(t0).as_millis(),
        phases.1.duration_since(phases.0).as_millis(),
        phases.1.elapsed().as_millis()
    );
    RESTORE_WANTED.store(false, Ordering::Release);
    finish(RUNNING);
}

/// One restore at a time (the watcher, or a caller when it is gone): the
/// state goes from suspended to restoring for this thread alone. Another
/// thread's restore is waited for (it ends running, suspended again if it
/// gave up, or failed); false when there is nothing to restore. (No lock
/// is held across the restore, which waits for room and calls the
/// driver: a fork meanwhile does not wait for it.)
fn become_restorer() -> bool {
    let mut g = DONE.lock();
    loop {
        match STATE.compare_exchange(SUSPENDED, RESTORING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(RESTORING) => g = DONE.wait_timeout(g, Duration::from_millis(50)),
            Err(_) => return false,
        }
    }
}

/// Should the restorer unwind (a bug: nothing here panics by design), the
/// state goes back to suspended, so other callers do not wait on a restore
/// no thread is doing.
struct UnwindSuspended;

impl Drop for UnwindSuspended {
    fn drop(&mut self) {
        if std::thread::panicking() && STATE.load(Ordering::Acquire) == RESTORING {
            finish(SUSPENDED);
        }
    }
}

/// No call waits for the restore any longer: the process stays suspended
/// (its host copy and host reservation kept) and stops asking for room.
fn give_up(h: &Here) {
    let e = h.entry();
    e.set_want(&[0; 16], 0);
    e.set_state(ProcState::Suspended, clock::monotonic_ns());
    // Before the state: a caller that then sees SUSPENDED asks again.
    RESTORE_WANTED.store(false, Ordering::Release);
    finish(SUSPENDED);
}

pub(super) fn fail(h: &Here, why: String) {
    h.entry()
        .set_state(ProcState::Failed, clock::monotonic_ns());
    log::error!("CUDA_OVERSUBSCRIBE: {why}; this process's CUDA calls fail from now on");
    finish(FAILED);
}

fn finish(state: u8) {
    let _g = DONE.lock();
    STATE.store(state, Ordering::Release);
    DONE.notify_all();
}
