//! What a restore finds on a card now: this process's own NVML figure
//! (`free_probe`), the restores of others the board shows in flight there
//! (claims), what running processes wait for, and the node's restore lock
//! (one claim at a time), judged by `room.rs`.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use vgpu_shm::board::ProcState;

use super::free_probe;
use super::room::{
    Claim, FRESH_NS, LOCK_BOUND, MOST_STANDS_NS, claimed_since, judged, note_claims,
};
use super::state::Here;
use crate::clock;
use crate::lock::{Listed, Lock, Name};

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
/// less restores in flight there since its question for the first [`CLAIM_BOUND`](super::state::CLAIM_BOUND) of the
/// wait (`waited`: since the first try after the suspension) and running
/// processes' waiting allocations for its first [`WANTS_BOUND`]. None
/// without a figure of its own.
///
/// A claim's figure (`after` set) stands for [`FRESH_NS`] after its
/// arrival. A waiting restore's look (`after` 0) only decides whether to
/// claim, where the room is judged anew: its figure stands for a round of
/// questions over its `cards`, so that a restore of several cards, asked
/// one at a time, sees each fresh at once where a child process takes
/// longer than half a second (NVML starting slowly).
pub(super) fn room_on(
    h: &Here,
    (card, cards): (&[u8; 16], usize),
    (wait, waited): (Duration, Duration),
    after: u64,
    checkpointed: bool,
) -> Option<u64> {
    let looked = clock::monotonic_ns();
    observe(h, card, looked);
    let stands = if after == 0 {
        look_stands_ns(cards)
    } else {
        FRESH_NS
    };
    let figure = free_probe::free_asked_after(*card, (after, stands), wait, checkpointed)?;
    // Restores in flight since its question count, and so does any seen
    // at the look before it (`claimed_since`).
    observe(h, card, clock::monotonic_ns());
    let claimed = claimed_since(&CLAIMS.lock(), card, figure.asked, looked);
    Some(judged(
        (figure, stands),
        clock::monotonic_ns(),
        waited,
        super::state::settings().claim_bound,
        (claimed, wanted_on(h, card)),
    ))
}

/// How long a waiting restore's look takes a figure for, where it judges
/// `cards` one question at a time: what the last question took, once
/// for each card and once more, at least [`FRESH_NS`], at most
/// [`MOST_STANDS_NS`].
fn look_stands_ns(cards: usize) -> u64 {
    let took = u64::try_from(free_probe::last_took().as_nanos()).unwrap_or(u64::MAX);
    let rounds = u64::try_from(cards).unwrap_or(u64::MAX).saturating_add(1);
    took.saturating_mul(rounds).clamp(FRESH_NS, MOST_STANDS_NS)
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
