//! Whether a card has room to restore this process. A restore the driver
//! refuses loses the process (driver 580, run 28), so it is judged on this
//! process's own knowledge only: NVML's free bytes as a short-lived child
//! process reads them (`nvml::fresh`: the process's own NVML waits while it
//! is checkpointed), or as its own NVML does where no checkpoint was taken. A figure another process publishes on the board is
//! another container's word and drives nothing (issue 26: a hostile
//! `free_seen` of 100 GiB made a process restore onto a full card).
//!
//! What the board says can only make a restore wait, never hurry it, and
//! only for a bounded time:
//! - restores of other processes in flight on the card (their claims) are
//!   taken off the figure for the first [`CLAIM_BOUND`] of this process's
//!   restore wait (counted from its first try since the suspension, so
//!   an entry that changes its pid or comes and goes cannot restart it);
//! - running processes' waiting allocations are taken off too, for the
//!   first [`WANTS_BOUND`] of that wait (their room first);
//! - the node's restore lock (one claim at a time) is waited for at most
//!   [`LOCK_BOUND`] in all; then the restore claims without it.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use vgpu_shm::board::ProcState;

use super::free_probe;
use super::state::Here;
use crate::clock;
use crate::lock::{Listed, Lock, Name};

/// A claim of another process counts this long at most.
pub const CLAIM_BOUND: Duration = Duration::from_secs(120);
/// Running processes' waits count this long into a restore's wait.
pub const WANTS_BOUND: Duration = Duration::from_secs(10);
/// The node's restore lock is waited for this long in all.
pub const LOCK_BOUND: Duration = Duration::from_secs(2);
/// This process's own figure is used while it is this fresh.
const FRESH_NS: u64 = 500_000_000;
/// A claim seen this long before the figure was read may have landed
/// after it (observations are 20 ms apart while a restore waits).
const SLACK_NS: u64 = 100_000_000;

/// A restore of another process seen moving onto a card.
struct Claim {
    entry: usize,
    pid: u32,
    card: [u8; 16],
    bytes: u64,
    last_ns: u64,
}

/// A forked child sees none of them (it never restores: its board entry
/// is its parent's).
static CLAIMS: Lock<Vec<Claim>> = Lock::new(Vec::new(), |c| c.clear());
/// Since when this restore has not had the node's restore lock.
static LOCK_MISSED: Lock<Option<Instant>> = Lock::new(None, |m| *m = None);

/// This module's locks, for the fork handlers (`fork.rs`).
pub(super) fn locks() -> [Listed; 2] {
    [
        (Name::of("oversub.claims"), &CLAIMS),
        (Name::of("oversub.lock_missed"), &LOCK_MISSED),
    ]
}

/// Notes the restores other processes have in flight on `card` now.
fn observe(h: &Here, card: &[u8; 16], now: u64) {
    let seen = h
        .board
        .others(Some(h.entry))
        .filter(|(_, e)| e.state() == ProcState::Restoring)
        .map(|(i, e)| (i, e.pid(), e.bytes_on(card)));
    note_claims(&mut CLAIMS.lock(), seen, card, now);
}

/// Notes restores seen in flight on `card` at `now` (entry, pid, bytes
/// there; none for 0 bytes), and forgets those gone for longer than any
/// figure is kept.
fn note_claims(
    claims: &mut Vec<Claim>,
    seen: impl Iterator<Item = (usize, u32, u64)>,
    card: &[u8; 16],
    now: u64,
) {
    for (entry, pid, bytes) in seen.filter(|&(_, _, b)| b != 0) {
        match claims
            .iter_mut()
            .find(|c| c.entry == entry && c.pid == pid && &c.card == card)
        {
            Some(c) => {
                c.bytes = c.bytes.max(bytes);
                c.last_ns = now;
            }
            None => claims.push(Claim {
                entry,
                pid,
                card: *card,
                bytes,
                last_ns: now,
            }),
        }
    }
    claims.retain(|c| now.saturating_sub(c.last_ns) <= 2 * FRESH_NS + SLACK_NS);
}

/// Bytes of restores on `card` that a figure read at `at` may not hold:
/// those seen in flight since shortly before it.
fn claimed_after(claims: &[Claim], card: &[u8; 16], at: u64) -> u64 {
    claims
        .iter()
        .filter(|c| &c.card == card && c.last_ns.saturating_add(SLACK_NS) >= at)
        .map(|c| c.bytes)
        .fold(0u64, u64::saturating_add)
}

/// Room from this process's own figure (`free` bytes read at `at`) at
/// `now`, less what the board may hold it to while the wait is young:
/// `claimed` bytes for the first `claim_bound` of the wait, `wanted` for
/// the first [`WANTS_BOUND`]. 0 for a figure stale or from the future.
fn judged(
    (free, at): (u64, u64),
    now: u64,
    waited: Duration,
    claim_bound: Duration,
    (claimed, wanted): (u64, u64),
) -> u64 {
    if at > now || now - at > FRESH_NS {
        return 0;
    }
    let claimed = if waited < claim_bound { claimed } else { 0 };
    let wanted = if waited < WANTS_BOUND { wanted } else { 0 };
    free.saturating_sub(claimed).saturating_sub(wanted)
}

/// A new restore: the node's restore lock is waited for anew (a miss of
/// an earlier restore does not let this one skip it).
pub(super) fn new_restore() {
    *LOCK_MISSED.lock() = None;
}

/// What the board's running processes wait for on `card`.
pub(super) fn wanted_on(h: &Here, card: &[u8; 16]) -> u64 {
    // Running processes' waiting allocations only: two suspended processes
    // that each left room for the other's want would never restore.
    h.board
        .others(Some(h.entry))
        .filter(|(_, e)| e.state() == ProcState::Running)
        .filter_map(|(_, e)| e.wants())
        .filter(|(c, _)| c == card)
        .map(|(_, b)| b)
        .fold(0u64, u64::saturating_add)
}

/// Room on `card` for this suspended process now: its own fresh NVML
/// figure (asked for up to `wait`, at or after `after`, monotonic ns; by a
/// child process where it is `checkpointed`),
/// less restores in flight there for the first [`CLAIM_BOUND`] of the
/// wait (`waited`: since the first try after the suspension) and running
/// processes' waiting allocations for its first [`WANTS_BOUND`]. 0
/// without a figure of its own.
pub(super) fn room_on(
    h: &Here,
    card: &[u8; 16],
    (wait, waited): (Duration, Duration),
    after: u64,
    checkpointed: bool,
) -> u64 {
    observe(h, card, clock::monotonic_ns());
    let Some((free, at)) = free_probe::free_asked_after(*card, after, wait, checkpointed) else {
        return 0;
    };
    let claimed = claimed_after(&CLAIMS.lock(), card, at);
    judged(
        (free, at),
        clock::monotonic_ns(),
        waited,
        super::state::settings().claim_bound,
        (claimed, wanted_on(h, card)),
    )
}

/// The node's restore lock, or leave to claim without it: a process that
/// holds the lock for longer than [`LOCK_BOUND`] does not stop a restore.
/// Err: not yet (try again).
pub(super) fn restore_lock(h: &Here) -> Result<Option<vgpu_shm::board::RestoreLock<'_>>, ()> {
    let missed_since = *LOCK_MISSED.lock();
    // Past the bound, one try each time: the room was judged just now.
    let wait = match missed_since {
        Some(t) if t.elapsed() >= LOCK_BOUND => Duration::ZERO,
        _ => Duration::from_secs(1),
    };
    if let Some(l) = h.board.restore_lock_within(wait) {
        *LOCK_MISSED.lock() = None;
        return Ok(Some(l));
    }
    let mut missed = LOCK_MISSED.lock();
    let since = *missed.get_or_insert_with(Instant::now);
    if since.elapsed() < LOCK_BOUND {
        return Err(());
    }
    crate::warn_once!(
        "CUDA_OVERSUBSCRIBE: the node's restore lock on {} has been held by another process for over {} ms: this process restores on its own NVML figure without it",
        h.board.path().display(),
        LOCK_BOUND.as_millis()
    );
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARD: [u8; 16] = [7; 16];
    const MS: u64 = 1_000_000;

    #[test]
    fn a_fresh_figure_less_claims_and_wants_while_the_wait_is_young() {
        let bound = CLAIM_BOUND;
        let now = 10_000 * MS;
        let young = Duration::from_secs(1);
        assert_eq!(judged((100, now - MS), now, young, bound, (30, 20)), 50);
        // Wants count for WANTS_BOUND, claims for the claim bound.
        assert_eq!(
            judged((100, now - MS), now, WANTS_BOUND, bound, (30, 20)),
            70
        );
        assert_eq!(judged((100, now - MS), now, bound, bound, (30, 20)), 100);
        // More claimed than free: no room, not a wrap.
        assert_eq!(judged((100, now), now, young, bound, (300, 0)), 0);
    }

    #[test]
    fn a_stale_or_future_figure_is_no_room() {
        let now = 10_000 * MS;
        let w = Duration::ZERO;
        assert_eq!(
            judged((100, now - FRESH_NS - 1), now, w, CLAIM_BOUND, (0, 0)),
            0
        );
        assert_eq!(judged((100, now + 1), now, w, CLAIM_BOUND, (0, 0)), 0);
        assert_eq!(
            judged((100, now - FRESH_NS), now, w, CLAIM_BOUND, (0, 0)),
            100
        );
    }

    #[test]
    fn claims_are_kept_per_restore_at_their_largest_and_forgotten_when_gone() {
        let mut claims = Vec::new();
        let t0 = 1_000 * MS;
        note_claims(&mut claims, [(1, 10, 5), (2, 20, 0)].into_iter(), &CARD, t0);
        // A restore with nothing on the card is none.
        assert_eq!(claims.len(), 1);
        note_claims(
            &mut claims,
            [(1, 10, 3), (3, 30, 4)].into_iter(),
            &CARD,
            t0 + MS,
        );
        // The same restore keeps its largest size; a new pid in the same
        // entry would be another claim.
        assert_eq!(claimed_after(&claims, &CARD, t0), 9);
        // Another card's figure holds none of them.
        assert_eq!(claimed_after(&claims, &[8; 16], t0), 0);
        // A figure read well after a claim was last seen holds it.
        assert_eq!(claimed_after(&claims, &CARD, t0 + MS + SLACK_NS + 1), 0);
        // Gone from the board for longer than any figure is kept: forgotten.
        let later = t0 + MS + 2 * FRESH_NS + SLACK_NS + 1;
        note_claims(&mut claims, std::iter::empty(), &CARD, later);
        assert!(claims.is_empty());
    }
}
