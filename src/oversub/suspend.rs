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
//! unlocks. A call waits for room up to `VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS`;
//! then it returns `CUDA_ERROR_OUT_OF_MEMORY` and the process stays
//! suspended, its host copy intact, for its next call to try again. If the
//! watcher stops beating, the calling thread restores the process itself.
//! One log line per suspension, per restore and per call that gives up.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use vgpu_shm::board::ProcState;

use super::admission::WAITING;
use super::blocked::Baseline;
use super::policy::{Seen, card_to_free};
use super::room;
use super::{
    ACTIVE, ACTIVITY, FAILED, Here, IN_CALL, RESTORING, RUNNING, STATE, SUSPENDED, SUSPENDING,
    checkpoint, here, settings,
};
use crate::attach::Attach;
use crate::cuda::sys::CUresult;
use crate::log::fmt_bytes;
use crate::{clock, process};

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
/// How long (monotonic ns) the restore may wait for room: the latest
/// deadline of the calls waiting for it. Past it, the restorer gives up.
static RESTORE_UNTIL: AtomicU64 = AtomicU64::new(0);
/// The restore is inside the driver, moving memory back: a call past its
/// deadline waits for it rather than fail while its memory arrives.
static MOVING: AtomicBool = AtomicBool::new(false);
/// What the process held on each card when it was suspended.
/// Runs `call` (a checkpoint: 25 s for 46 GiB on an H200) while a
/// helper thread beats the region slot every half second, as the watcher
/// would: in a pid namespace a slot without a heartbeat looks dead to its
/// neighbours after 3 s. (The beat touches neither CUDA nor NVML.)
fn beating<R>(attach: Option<&Attach>, call: impl FnOnce() -> R) -> R {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let beat = std::thread::Builder::new()
            .name("vgpu-beat".into())
            .spawn_scoped(s, || {
                while !done.load(Ordering::Acquire) {
                    if let Some(a) = attach {
                        a.tick();
                    }
                    std::thread::park_timeout(Duration::from_millis(500));
                }
            });
        let r = call();
        done.store(true, Ordering::Release);
        if let Ok(t) = beat {
            t.thread().unpark();
        }
        r
    })
}

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

/// What a restore leaves free beyond the bytes it moves: the driver's own
/// needs around them, and memory that moves meanwhile. A restore the
/// driver refuses loses the process, so it is never tried on a guess.
fn margin(bytes: u64) -> u64 {
    (512 << 20) + bytes / 50
}

/// The first card without room for what this process saved there (cards
/// it held nothing on need none), and the room judged on each (room.rs:
/// this process's own figure only, asked at or after `after`). `waited`:
/// how long this restore has waited so far.
fn short_of_room(
    h: &Here,
    saved: &[([u8; 16], u64)],
    wait: Duration,
    waited: Duration,
    after: u64,
) -> (Option<[u8; 16]>, u64) {
    let mut least = u64::MAX;
    for &(card, bytes) in saved.iter().filter(|&&(_, b)| b > 0) {
        let r = room::room_on(h, &card, wait, waited, after);
        least = least.min(r);
        if r < bytes.saturating_add(margin(bytes)) {
            return (Some(card), least);
        }
    }
    (None, least)
}

/// Claims the room on the board, under the node's restore lock (waited
/// for within `room::LOCK_BOUND`). The bytes go on the board first, with
/// the process restoring: allocations on the card wait for it from then
/// on (admission.rs), and every other restore counts them as moving. Then,
/// after [`CLAIM_SETTLE`] for an allocation that passed its check just
/// before to land, room is judged on a figure asked since: a figure from
/// before the claim may miss an allocation that took the room meanwhile
/// (its want already gone from the board), and a restore the driver
/// refuses loses the process. Without room the claim is taken back. One
/// claim at a time on the node, so two restores never count on the same
/// room. The room judged, or None when no claim was made.
fn claim_room(h: &Here, saved: &[([u8; 16], u64)], waited: Duration) -> Option<u64> {
    let _node = room::restore_lock(h).ok()?;
    let e = h.entry();
    for &(card, bytes) in saved {
        e.set_bytes_on(&card, bytes);
    }
    std::thread::sleep(CLAIM_SETTLE);
    let after = clock::monotonic_ns();
    let (short, judged) = short_of_room(h, saved, CLAIM_NVML_WAIT, waited, after);
    if short.is_some() {
        for &(card, _) in saved {
            e.set_bytes_on(&card, 0);
        }
        return None;
    }
    e.set_want(&[0; 16], 0);
    Some(judged)
}

/// How long a claim lets an allocation that passed its check before the
/// claim reach the driver, before room is judged anew.
const CLAIM_SETTLE: Duration = Duration::from_millis(50);
/// How long a claim waits for its new figure (a child process's NVML).
const CLAIM_NVML_WAIT: Duration = Duration::from_secs(2);

/// How long a restore waits for its own figure (a child process's NVML)
/// in one look; it looks again every 20 ms.
const NVML_WAIT: Duration = Duration::from_millis(100);

/// When the first restore since the last suspension began (monotonic ns;
/// 0: none yet).
static FIRST_TRY_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The threads when the last suspension began (blocked.rs).
static BASELINE: Mutex<Option<Baseline>> = Mutex::new(None);
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
        RUNNING if !h.board.intact() => {
            // Cut short or replaced by someone: shared with nobody now.
            crate::warn_once!(
                "CUDA_OVERSUBSCRIBE: the board {} was cut short or replaced: this process stops making room for others (its own allocations still wait for room)",
                h.board.path().display()
            );
            true
        }
        RUNNING => {
            publish_cards(attach, h);
            maybe_suspend(attach, h, now)
        }
        SUSPENDED if RESTORE_WANTED.load(Ordering::Acquire) => {
            restore_now(Some(attach), h);
            true
        }
        SUSPENDED => {
            let waiting = BASELINE
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .and_then(Baseline::waiting_in_driver);
            if let Some((tid, name)) = waiting {
                // Its call cannot be answered, only let through: after a
                // bound that passes, the next tick asks again.
                log::warn!(
                    "CUDA_OVERSUBSCRIBE: thread {tid} ({name}) waits inside the driver, where the suspension blocks it: restoring this process"
                );
                request_restore(deadline_from_now());
                restore_now(Some(attach), h);
            }
            true
        }
        _ => true,
    }
}

/// This process's bytes on `card` from its region slot, now (the
/// watcher publishes them every tick).
pub(super) fn publish_card(attach: &Attach, h: &Here, card: &[u8; 16]) {
    publish_slot(attach, h, Some(card));
}

/// What this process holds on each card it uses, from its slot.
fn publish_cards(attach: &Attach, h: &Here) {
    publish_slot(attach, h, None);
}

/// The slot's total on each card in use (`only`: that card alone).
fn publish_slot(attach: &Attach, h: &Here, only: Option<&[u8; 16]>) {
    let Some(slot) = attach.slot() else { return };
    for dev in process::devices_in_use() {
        if !attach.intact() {
            return;
        }
        let uuid = attach.region.device(dev).uuid();
        if only.is_none_or(|c| *c == uuid) {
            h.entry()
                .set_bytes_on(&uuid, attach.region.slot_total(slot, dev));
        }
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

fn maybe_suspend(attach: &Attach, h: &'static Here, now: u64) -> bool {
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
    // A want on the board is another process's word: suspend only for a
    // shortage this process sees itself (its NVML answers while it runs),
    // and never for a want no card could hold (a hostile u64::MAX).
    let Some((free, total)) = crate::nvml::client::memory(&card) else {
        return true;
    };
    let wanted = others
        .iter()
        .filter_map(|o| o.wants)
        .filter(|&(c, b)| c == card && b <= total)
        .map(|(_, b)| b)
        .fold(0u64, u64::saturating_add)
        .min(total);
    if free >= wanted {
        log::debug!(
            "CUDA_OVERSUBSCRIBE: not suspended: {} wanted on {}, NVML says {} free",
            fmt_bytes(wanted),
            vgpu_shm::format_uuid(&card),
            fmt_bytes(free)
        );
        return true;
    }
    // The cheap refusal first: no child process is made for a suspension
    // the host memory bound refuses anyway.
    let bytes: u64 = me.cards.iter().map(|&(_, b)| b).sum();
    if h.board.host_bytes(Some(h.entry)).saturating_add(bytes) > s.host_limit {
        crate::warn_once!(
            "CUDA_OVERSUBSCRIBE: suspending this process would take host memory for suspended state past {} (VGPU_OVERSUBSCRIBE_HOST_LIMIT, {} in use): no more suspensions until some is freed",
            fmt_bytes(s.host_limit),
            fmt_bytes(h.board.host_bytes(Some(h.entry)))
        );
        return true;
    }
    // Its restore will need a figure of its own from a child process: no
    // suspension where that cannot be had. One child at most every 10 s
    // where none answers; one that answered stands for 60 s.
    static FRESH_FAILED: AtomicU64 = AtomicU64::new(0);
    static FRESH_OK: AtomicU64 = AtomicU64::new(0);
    let failed = FRESH_FAILED.load(Ordering::Relaxed);
    let ok = FRESH_OK.load(Ordering::Relaxed);
    let known_ok = ok != 0 && now.saturating_sub(ok) < 60_000_000_000;
    if !known_ok {
        if (failed != 0 && now.saturating_sub(failed) < 10_000_000_000)
            || crate::nvml::fresh::free_memory(&card, Duration::from_secs(2)).is_none()
        {
            if failed == 0 || now.saturating_sub(failed) >= 10_000_000_000 {
                FRESH_FAILED.store(now.max(1), Ordering::Relaxed);
            }
            crate::warn_once!(
                "CUDA_OVERSUBSCRIBE: a child process could not read NVML's free memory on {}, which a restore needs: this process is not suspended",
                vgpu_shm::format_uuid(&card)
            );
            return true;
        }
        FRESH_OK.store(now.max(1), Ordering::Relaxed);
    }
    if !h.board.reserve_host(h.entry, bytes, s.host_limit) {
        return true;
    }
    suspend(attach, h, card, bytes, &me.cards);
    !(s.test_watcher_stop && STATE.load(Ordering::Acquire) == SUSPENDED)
}

fn suspend(attach: &Attach, h: &Here, card: [u8; 16], bytes: u64, cards: &[([u8; 16], u64)]) {
    let e = h.entry();
    let t0 = Instant::now();
    e.set_state(ProcState::Suspending, clock::monotonic_ns());
    let before = ACTIVITY.load(Ordering::Relaxed);
    let undo = |why: String| {
        e.host_bytes.fetch_sub(bytes, Ordering::SeqCst);
        e.set_state(ProcState::Running, clock::monotonic_ns());
        log::info!("CUDA_OVERSUBSCRIBE: not suspended: {why}");
    };
    // The threads as they are while idle: one that moves into the driver
    // from now on waits on the lock (blocked.rs).
    let driver = crate::cuda::real::slot::cuInit
        .get()
        .map(|f| f.as_ptr() as u64);
    *BASELINE.lock().unwrap_or_else(PoisonError::into_inner) = Some(Baseline::take(driver));
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
    if let Err(rc) = beating(Some(attach), checkpoint::checkpoint) {
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
    FIRST_TRY_NS.store(0, Ordering::Release);
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
        RESTORE_UNTIL.fetch_max(deadline_from_now(), Ordering::AcqRel);
        RESTORE_WANTED.store(true, Ordering::Release);
        restore_now(Some(attach), h);
    }
}

/// When a restore asked for now must give up waiting for room.
fn deadline_from_now() -> u64 {
    clock::monotonic_ns().saturating_add(settings().restore_wait_ms.saturating_mul(1_000_000))
}

/// Asks for a restore that may wait for room until `deadline`.
fn request_restore(deadline: u64) {
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
    let mut g = DONE.lock().unwrap_or_else(PoisonError::into_inner);
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
            g = DONE.lock().unwrap_or_else(PoisonError::into_inner);
            continue;
        }
        g = DONE_CV
            .wait_timeout(g, Duration::from_millis(50))
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// The line of a call that gave up waiting for room to restore.
fn no_room() {
    let saved = SAVED.lock().unwrap_or_else(PoisonError::into_inner).clone();
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
fn restore_now(attach: Option<&Attach>, h: &Here) {
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
    room::new_restore();
    let mut waited = Duration::ZERO;
    let mut said = Instant::now();
    let mut next_try = Instant::now();
    loop {
        BEAT.store(clock::monotonic_ns(), Ordering::Release);
        // The region slot's heartbeat too: the wait can last minutes.
        if let Some(a) = attach {
            a.tick();
        }
        let (short, _) = short_of_room(h, &saved, NVML_WAIT, since_first(), 0);
        if short.is_none() && Instant::now() >= next_try {
            if let Some(judged) = claim_room(h, &saved, since_first()) {
                MOVING.store(true, Ordering::Release);
                // A move of tens of GiB takes up to a minute: the region
                // slot keeps beating meanwhile.
                let moved = beating(attach, || {
                    checkpoint::restore().map(|()| checkpoint::unlock())
                });
                MOVING.store(false, Ordering::Release);
                match moved {
                    Ok(Ok(())) => break,
                    Ok(Err(rc)) => return fail(h, format!("unlock after restore failed ({rc})")),
                    // Driver 580 answers a restore without room with out of
                    // memory, and every later one with 304: the process
                    // can never be restored (run 28 on the H200).
                    Err(rc) => {
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
        let card = short.unwrap_or(saved.first().map_or([0; 16], |&(c, _)| c));
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::path::Path;
    use std::process::{Command, Stdio};
    use vgpu_shm::board::Board;

    const CARD: [u8; 16] = [9; 16];
    const HOLDER: &str = "VGPU_TEST_BOARD_HOLDER";

    /// Run as a child by the test below: holds one board entry (each
    /// process's own locks are invisible to it, so one entry per child):
    /// a running process whose allocation waits for 1 GiB, or a suspended
    /// one whose restore wants 2 GiB, until killed.
    #[test]
    fn board_holder_for_tests() {
        let Some(v) = std::env::var_os(HOLDER) else {
            return;
        };
        let v = v.into_string().unwrap();
        let (dir, role) = v.rsplit_once(':').unwrap();
        let b = Board::open(Path::new(dir)).unwrap();
        let i = b.claim(std::process::id(), 0).unwrap();
        if role == "peer" {
            b.entry(i).set_state(ProcState::Restoring, 0);
            b.entry(i).set_want(&CARD, 2 << 30);
        } else {
            b.entry(i).set_state(ProcState::Running, 0);
            b.entry(i).set_want(&CARD, 1 << 30);
        }
        println!("holding {i}");
        std::thread::sleep(Duration::from_secs(60));
    }

    fn holder(dir: &Path, role: &str) -> std::process::Child {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "oversub::suspend::tests::board_holder_for_tests",
                "--nocapture",
            ])
            .env(HOLDER, format!("{}:{role}", dir.display()))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.starts_with("holding") {
            line.clear();
            assert_ne!(out.read_line(&mut line).unwrap(), 0, "the holder ended");
        }
        child
    }

    #[test]
    fn only_running_processes_waits_count_against_a_restore() {
        // Two suspended processes that each left room for the other's want
        // would never restore (review of 46678ee).
        let dir = tempfile::tempdir().unwrap();
        let mut children = [holder(dir.path(), "waiter"), holder(dir.path(), "peer")];
        let board = Board::open(dir.path()).unwrap();
        let entry = board.claim(std::process::id(), 0).unwrap();
        let h = Here {
            board,
            entry,
            pid: std::process::id(),
        };
        assert_eq!(h.board.others(Some(entry)).count(), 2);
        assert_eq!(room::wanted_on(&h, &CARD), 1 << 30);
        assert_eq!(room::wanted_on(&h, &[1; 16]), 0);
        for c in &mut children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
