//! Suspension of this process, run by its watcher thread.
//!
//! Every tick (`tick`) the watcher publishes what the process holds on
//! which card and when it last called CUDA. When another process on one
//! of its cards waits for room and this one is the idlest there
//! (`policy`), it reserves host memory within the node's bound
//! (`VGPU_OVERSUBSCRIBE_HOST_LIMIT`; over it, no suspension), locks its own
//! process (1 s timeout: a process busy inside the driver stays), and
//! checkpoints it (restore.rs brings it back). One log line per
//! suspension.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use vgpu_shm::board::ProcState;

use super::blocked::Baseline;
use super::checkpointing::{self, a_child_reads_nvml, not_failed_lately};
use super::handover::{BEAT, LAST_ACTIVE, SAVED, WAITING, beating};
use super::policy::{Seen, card_to_free};
use super::restore::{
    FIRST_TRY_NS, RESTORE_UNTIL, RESTORE_WANTED, deadline_from_now, fail, request_restore,
    restore_now,
};
use super::state::{
    ACTIVE, ACTIVITY, Here, IN_CALL, RUNNING, STATE, SUSPENDED, SUSPENDING, here, settings,
};
use crate::attach::Attach;
use crate::lock::{Listed, Lock, Name};
use crate::log::fmt_bytes;
use crate::{clock, process};

/// ACTIVITY as the watcher last saw it (when it changed: `LAST_ACTIVE`).
static SEEN_ACTIVITY: AtomicU64 = AtomicU64::new(0);
/// A suspension was begun and given up before. The first is a warning: a
/// neighbour waits for room this process set out to make, and an
/// operator reading only the neighbour's out of memory otherwise never
/// learns why (a crowding test on a loaded CI host saw a process idle 31
/// s beside a waiter, never suspended, and nothing said).
static GAVE_UP: AtomicBool = AtomicBool::new(false);

/// The threads when the last suspension began (blocked.rs); a forked
/// child has none of them.
static BASELINE: Lock<Option<Baseline>> = Lock::new(None, |b| *b = None);
/// This module's lock, for the fork handlers (`fork.rs`).
pub(super) fn locks() -> [Listed; 1] {
    [(Name::of("oversub.baseline"), &BASELINE)]
}

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
        h.entry().set_last_active_ns(now);
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
            super::line::advertise(h);
            maybe_suspend(attach, h, now)
        }
        SUSPENDED if RESTORE_WANTED.load(Ordering::Acquire) => {
            restore_now(Some(attach), h);
            true
        }
        SUSPENDED => {
            let waiting = BASELINE
                .lock()
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
        last_active_ns: e.last_active_ns(),
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
    // Someone wants room on a card this process holds: its suspension may
    // be near, so its VMM blocks' host arena is pinned ahead of it.
    let wanted_here = others.iter().any(|o| {
        o.wants
            .is_some_and(|(c, b)| b > 0 && me.cards.iter().any(|&(m, n)| m == c && n > 0))
    });
    if wanted_here && super::backing::any() {
        super::mover::prepare(super::mover::arena_cap(h));
    } else {
        super::mover::trim(now);
    }
    // The idlest goes first; with nobody idle, a busy one whose turn is
    // over (turns.rs).
    let (card, busy) = match card_to_free(&me, &others, now, s.idle_ns) {
        Some(card) => (card, false),
        None => match super::line::card_to_yield(h, now) {
            // Its arena is still being pinned: the turn runs on until it
            // is (within a bound), the card busy meanwhile, and the switch
            // then copies at the bus's speed.
            Some(_) if super::line::hold_for_arena(now, super::mover::arena_short()) => {
                crate::warn_once!(
                    "CUDA_OVERSUBSCRIBE: this process's turn is over, but its host arena is still being pinned: it keeps the card until the arena is ready (at most {} s more)",
                    super::line::ARENA_GRACE.as_secs()
                );
                return true;
            }
            Some(card) => (card, true),
            None => return true,
        },
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
    // A process that shares VMM memory with another (shared.rs) moves
    // only its unshared VMM blocks, never through the checkpoint API: it
    // is suspended only where those make the room wanted.
    let shares = super::shared::any();
    if shares && super::backing::mapped_bytes() < wanted - free {
        crate::warn_once!(
            "CUDA_OVERSUBSCRIBE: this process shares VMM-backed memory with another through legacy IPC, and its other VMM-backed blocks would not make the room wanted: it is not suspended"
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
    // Its restore needs a figure of its own from a child process when it
    // checkpoints: no suspension where that cannot be had. An idle
    // process whose VMM copies leave less than the checkpoint's floor
    // beside its context does not checkpoint (suspend): no child for it
    // (suspend asks after all if that changed meanwhile).
    let rest = bytes
        .saturating_sub(super::backing::mapped_bytes())
        .saturating_sub(super::mover::context_bytes(attach));
    let may_checkpoint =
        !shares && (busy || !super::backing::any() || rest >= super::mover::CHECKPOINT_FLOOR);
    // (Only where the checkpoint is certain: one with VMM-backed blocks
    // may make its room by moving them alone, and `suspend` asks again.)
    if may_checkpoint
        && !super::backing::any()
        && let Err(why) = not_failed_lately()
    {
        log::debug!("CUDA_OVERSUBSCRIBE: not suspended: {why}");
        return true;
    }
    if may_checkpoint && !a_child_reads_nvml(attach, &card) {
        return true;
    }
    if !h.board.reserve_host(h.entry, bytes, s.host_limit) {
        log::debug!(
            "CUDA_OVERSUBSCRIBE: not suspended: the board's host memory bound is taken by others' reservations"
        );
        return true;
    }
    suspend(attach, h, card, bytes, &me.cards, busy, wanted);
    !(s.test_watcher_stop && STATE.load(Ordering::Acquire) == SUSPENDED)
}

/// Suspends this process to make room on `card`; `busy`: at its turn's
/// end, not idle; `wanted`: what the waiters there want.
fn suspend(
    attach: &Attach,
    h: &Here,
    card: [u8; 16],
    bytes: u64,
    cards: &[([u8; 16], u64)],
    busy: bool,
    wanted: u64,
) {
    let e = h.entry();
    let t0 = Instant::now();
    e.set_state(ProcState::Suspending, clock::monotonic_ns());
    let before = ACTIVITY.load(Ordering::Relaxed);
    // With VMM-backed blocks (backing.rs) the process moves them itself
    // (mover.rs), first, and uses the checkpoint API only for the rest.
    let vmm = super::backing::any();
    let undo = |why: String| {
        if busy || vmm {
            // Its calls held at the gate go on as it runs again: none
            // waits for a restore.
            RESTORE_WANTED.store(false, Ordering::Release);
        }
        STATE.store(RUNNING, Ordering::Release);
        e.release_host_bytes(bytes);
        e.set_state(ProcState::Running, clock::monotonic_ns());
        if GAVE_UP.swap(true, Ordering::Relaxed) {
            log::info!("CUDA_OVERSUBSCRIBE: not suspended: {why}");
        } else {
            log::warn!(
                "CUDA_OVERSUBSCRIBE: not suspended: {why} (said once; later tries at info level)"
            );
        }
    };
    // A busy process goes between its driver calls: from now on its
    // calls wait at the gate (`resume`, while SUSPENDING), those in
    // flight end, and the driver's lock below finishes the work they
    // submitted before anything moves.
    if busy {
        STATE.store(SUSPENDING, Ordering::Release);
        if !beating(Some(attach), super::line::drained) {
            return undo(format!(
                "its synchronisations and copies in flight did not end within {} ms",
                super::line::DRAIN_BOUND.as_millis()
            ));
        }
    }
    // What the copies took off each card.
    let mut moved_from: Vec<([u8; 16], u64)> = Vec::new();
    if vmm {
        // The gate closes first; then the threads inside hooks leave and
        // the contexts synchronise: an unmap does not wait for kernels
        // (docs/vmm-facts.md fact 6).
        STATE.store(SUSPENDING, Ordering::SeqCst);
        if !beating(Some(attach), super::mover::quiet) {
            return undo(format!(
                "a thread stayed inside a CUDA call for {} ms",
                super::mover::QUIET_BOUND.as_millis()
            ));
        }
        match beating(Some(attach), || super::mover::move_out(card)) {
            Ok(m) => moved_from = m,
            Err(why) => return undo(why),
        }
        // (A block shared meanwhile stays: with nothing moved, a process
        // that shares is not suspended.)
        if moved_from.is_empty() && super::shared::any() {
            return undo("all its VMM-backed memory is shared with another process".to_string());
        }
    }
    let moved: u64 = moved_from.iter().map(|&(_, b)| b).sum();
    // What VMM does not hold, if worth it, goes through the checkpoint.
    // (The context stays either way unless the checkpoint takes it.)
    let rest = bytes
        .saturating_sub(moved)
        .saturating_sub(super::mover::context_bytes(attach));
    // At a busy turn's end the context goes too unless the waiters (and
    // a restore's margin) fit beside it with room to spare, as NVML says
    // once the blocks left (no checkpoint holds the driver's lock yet, so
    // this process's own NVML answers): a context left on the card (~0.5
    // GiB) once kept a busy job of 14 GiB in 20 from its workspace (run
    // 98). Not taken back later: a holder that outgrows the spare room
    // waits, and gets out of memory after its wait.
    let context_goes = busy && {
        let need = wanted.saturating_add(super::claim::margin(wanted));
        !crate::nvml::client::memory(&card)
            .is_some_and(|(free, _)| super::policy::context_may_stay(free, need))
    };
    // (Never where memory is shared with another process: the
    // checkpoint would take memory a peer maps, shared.rs.)
    let ckpt =
        !super::shared::any() && (!vmm || context_goes || rest >= super::mover::CHECKPOINT_FLOOR);
    super::mover::CHECKPOINTED.store(ckpt, Ordering::Release);
    if ckpt {
        // Asked before unless the VMM blocks shrank since (an answer
        // stands for 60 s).
        let child = || {
            if a_child_reads_nvml(attach, &card) {
                Ok(())
            } else {
                Err(
                    "no child process could read NVML's free memory, which its restore needs"
                        .to_string(),
                )
            }
        };
        if let Err(why) = not_failed_lately()
            .and_then(|()| child())
            .and_then(|()| checkpointed(attach, h))
        {
            if why.is_empty() {
                return;
            }
            if moved > 0 && super::mover::move_back().is_err() {
                return fail(
                    h,
                    format!("{why}, and the VMM-backed memory could not come back"),
                );
            }
            return undo(why);
        }
        *SAVED.lock() = cards.to_vec();
    } else {
        // Only the VMM blocks left the cards; the contexts and the small
        // blocks stay (docs/oversubscription.md, 2b). Each card must have
        // room for its own blocks again.
        *BASELINE.lock() = None;
        e.release_host_bytes(bytes.saturating_sub(moved));
        *SAVED.lock() = moved_from;
    }
    if busy {
        super::line::gave_turn(h);
    }
    BEAT.store(clock::monotonic_ns(), Ordering::Release);
    FIRST_TRY_NS.store(0, Ordering::Release);
    STATE.store(SUSPENDED, Ordering::Release);
    for &(c, _) in cards {
        // Nothing while suspended, even where a context stays (NVML's
        // free figure, which judges room, counts it): a restoring entry
        // with bytes on a card is one moving back, and allocations there
        // wait for it (`restore::restore_moving_on`), so a context left
        // on the card held a waiting allocation back until the restore
        // found room without it (its turn, busy, on the simulator).
        e.set_bytes_on(&c, 0);
    }
    let bytes = if ckpt { bytes } else { moved };
    e.count_suspension();
    e.set_state(ProcState::Suspended, clock::monotonic_ns());
    log::warn!(
        "CUDA_OVERSUBSCRIBE: suspended this process: {} of device memory moved to the host in {} ms{}, to make room on {}{}",
        fmt_bytes(bytes),
        t0.elapsed().as_millis(),
        match (vmm, ckpt) {
            (false, _) => String::new(),
            (true, false) => " (VMM copies alone)".to_string(),
            (true, true) => format!(" ({} of it by VMM copies)", fmt_bytes(moved)),
        },
        vgpu_shm::format_uuid(&card),
        if busy {
            " (its turn was over: it waits for the next one)"
        } else {
            ""
        }
    );
    // A call that came in meanwhile may be blocked inside the driver.
    // (With `VGPU_TEST_WATCHER_STOP`, only one inside a hook: the watcher
    // ends now, and the calls waiting in `restore::resume` restore the
    // process themselves, the path that knob tests, however long the
    // suspension took.)
    if ACTIVITY.load(Ordering::Relaxed) != before
        && (!settings().test_watcher_stop || super::mover::INSIDE.load(Ordering::SeqCst) != 0)
    {
        RESTORE_UNTIL.fetch_max(deadline_from_now(), Ordering::AcqRel);
        RESTORE_WANTED.store(true, Ordering::Release);
        restore_now(Some(attach), h);
    }
}

/// Locks and checkpoints this process, the threads as they are while
/// idle noted first: one that moves into the driver from now on waits on
/// the lock (blocked.rs). Err: why not (empty: the process failed,
/// already said).
fn checkpointed(attach: &Attach, h: &Here) -> Result<(), String> {
    let driver = crate::cuda::real::slot::cuInit
        .get()
        .map(|f| f.as_ptr() as u64);
    *BASELINE.lock() = Some(Baseline::take(driver));
    checkpointing::lock_and_checkpoint(attach, h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oversub::restore_room;
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
        std::thread::sleep(std::time::Duration::from_secs(60));
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
        assert_eq!(restore_room::wanted_on(&h, &CARD), 1 << 30);
        assert_eq!(restore_room::wanted_on(&h, &[1; 16]), 0);
        for c in &mut children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
