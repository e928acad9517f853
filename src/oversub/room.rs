//! Whether a card has room to restore this process: the arithmetic
//! (pure; `restore_room.rs` gathers the figures). A restore the driver
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
//!   taken off the figure for the first [`CLAIM_BOUND`](super::state::CLAIM_BOUND) of this process's
//!   restore wait (counted from its first try since the suspension, so
//!   an entry that changes its pid or comes and goes cannot restart it);
//! - running processes' waiting allocations are taken off too, for the
//!   first [`WANTS_BOUND`] of that wait (their room first);
//! - the node's restore lock (one claim at a time) is waited for at most
//!   [`LOCK_BOUND`] in all; then the restore claims without it.
#![forbid(unsafe_code)]

use std::time::Duration;

/// Running processes' waits count this long into a restore's wait.
pub const WANTS_BOUND: Duration = Duration::from_secs(10);
/// The node's restore lock is waited for this long in all: longer than
/// a claim may hold it waiting for its figures, one card after another
/// (claim.rs), so that a claim that waits for slow NVML children does
/// not let others skip it.
pub const LOCK_BOUND: Duration = Duration::from_secs(12);
/// This process's own figure is used for this long after it arrived (a
/// claim's; a waiting restore's look stands longer, `restore_room.rs`).
pub(super) const FRESH_NS: u64 = 500_000_000;
/// The longest a figure stands for a waiting restore's look (a round of
/// questions over its cards, `restore_room::room_on`).
pub(super) const MOST_STANDS_NS: u64 = 30_000_000_000;
/// A figure that arrived later than this after its question is not used:
/// longer than its children may take to answer (`nvml::fresh::ANSWER_WAIT`,
/// 5 s) and to be reaped.
pub(super) const LATE_NS: u64 = 6_000_000_000;
/// A claim seen this long before the figure was read may have landed
/// after it: a waiting restore looks at the board about every 120 ms
/// (its 100 ms wait for a figure, then 20 ms).
const SLACK_NS: u64 = 250_000_000;

/// NVML's free bytes on a card, as this process asked: when the question
/// was sent, when NVML was asked (a child process asks once its NVML has
/// started) and when the answer arrived (`CLOCK_MONOTONIC` ns, the
/// board's clock).
/// What the board shows since the question is taken off it; its freshness
/// counts from its arrival, so that a loaded host, slow to carry an answer
/// from a child process, does not make every figure stale (CI, once: a
/// restore waited 13 s for room it had).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Figure {
    pub(super) free: u64,
    pub(super) sent: u64,
    pub(super) asked: u64,
    pub(super) arrived: u64,
}

impl Figure {
    /// Whether it may be used at `now`, where a figure stands for
    /// `stands_ns` after its arrival: not from the future, and not
    /// [`LATE_NS`] late.
    pub(super) fn fresh_at(&self, now: u64, stands_ns: u64) -> bool {
        self.asked <= self.arrived
            && self.arrived <= now
            && now - self.arrived <= stands_ns
            && self.arrived - self.asked <= LATE_NS
    }
}

/// A restore of another process seen moving onto a card.
pub(super) struct Claim {
    entry: usize,
    pid: u32,
    card: [u8; 16],
    bytes: u64,
    last_ns: u64,
}

/// Notes restores seen in flight on `card` at `now` (entry, pid, bytes
/// there; none for 0 bytes), and forgets those gone for longer than any
/// figure is kept (asked, carried and used).
pub(super) fn note_claims(
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
    claims.retain(|c| now.saturating_sub(c.last_ns) <= KEPT_NS);
}

/// How long a claim is remembered after it was last seen.
const KEPT_NS: u64 = LATE_NS + MOST_STANDS_NS + SLACK_NS;

/// Bytes of restores on `card` that a figure read at `at` may not hold:
/// those seen in flight since shortly before it.
fn claimed_after(claims: &[Claim], card: &[u8; 16], at: u64) -> u64 {
    claims
        .iter()
        .filter(|c| &c.card == card && c.last_ns.saturating_add(SLACK_NS) >= at)
        .map(|c| c.bytes)
        .fold(0u64, u64::saturating_add)
}

/// Bytes of restores on `card` that a figure asked at `asked` may not
/// hold, where the board was last looked at `looked` before the question
/// was sent: those seen since shortly before the earlier of the two. A
/// claim's child asks a second or so after that look, while the restore
/// seen there may still be moving and gone from the board by the answer.
pub(super) fn claimed_since(claims: &[Claim], card: &[u8; 16], asked: u64, looked: u64) -> u64 {
    claimed_after(claims, card, asked.min(looked))
}

/// Room from this process's own figure at `now` (standing for
/// `stands_ns` after its arrival), less what the board may hold it to
/// while the wait is young: `claimed` bytes for the first `claim_bound`
/// of the wait, `wanted` for the first [`WANTS_BOUND`]. 0 for a figure
/// that is not fresh ([`Figure::fresh_at`]).
pub(super) fn judged(
    (figure, stands_ns): (Figure, u64),
    now: u64,
    waited: Duration,
    claim_bound: Duration,
    (claimed, wanted): (u64, u64),
) -> u64 {
    if !figure.fresh_at(now, stands_ns) {
        return 0;
    }
    let claimed = if waited < claim_bound { claimed } else { 0 };
    let wanted = if waited < WANTS_BOUND { wanted } else { 0 };
    figure.free.saturating_sub(claimed).saturating_sub(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oversub::state::CLAIM_BOUND;

    const CARD: [u8; 16] = [7; 16];
    const MS: u64 = 1_000_000;

    /// `free` bytes, asked and arrived at `at`.
    fn at(free: u64, at: u64) -> Figure {
        Figure {
            free,
            sent: at,
            asked: at,
            arrived: at,
        }
    }

    #[test]
    fn a_fresh_figure_less_claims_and_wants_while_the_wait_is_young() {
        let bound = CLAIM_BOUND;
        let now = 10_000 * MS;
        let young = Duration::from_secs(1);
        assert_eq!(
            judged((at(100, now - MS), FRESH_NS), now, young, bound, (30, 20)),
            50
        );
        // Wants count for WANTS_BOUND, claims for the claim bound.
        assert_eq!(
            judged(
                (at(100, now - MS), FRESH_NS),
                now,
                WANTS_BOUND,
                bound,
                (30, 20)
            ),
            70
        );
        assert_eq!(
            judged((at(100, now - MS), FRESH_NS), now, bound, bound, (30, 20)),
            100
        );
        // More claimed than free: no room, not a wrap.
        assert_eq!(
            judged((at(100, now), FRESH_NS), now, young, bound, (300, 0)),
            0
        );
    }

    #[test]
    fn a_stale_or_future_figure_is_no_room() {
        let now = 10_000 * MS;
        let w = Duration::ZERO;
        assert_eq!(
            judged(
                (at(100, now - FRESH_NS - 1), FRESH_NS),
                now,
                w,
                CLAIM_BOUND,
                (0, 0)
            ),
            0
        );
        assert_eq!(
            judged((at(100, now + 1), FRESH_NS), now, w, CLAIM_BOUND, (0, 0)),
            0
        );
        assert_eq!(
            judged(
                (at(100, now - FRESH_NS), FRESH_NS),
                now,
                w,
                CLAIM_BOUND,
                (0, 0)
            ),
            100
        );
    }

    #[test]
    fn a_figure_slow_to_arrive_is_fresh_from_its_arrival_unless_too_late() {
        let now = 10_000 * MS;
        let w = Duration::ZERO;
        let carried = |asked: u64, arrived: u64| Figure {
            free: 100,
            sent: asked,
            asked,
            arrived,
        };
        // Asked 2 s ago, carried for 1.9 s by a loaded host: fresh.
        let late = carried(now - 2_000 * MS, now - 100 * MS);
        assert_eq!(judged((late, FRESH_NS), now, w, CLAIM_BOUND, (0, 0)), 100);
        // But not half a second after it arrived.
        assert_eq!(
            judged((late, FRESH_NS), now + FRESH_NS, w, CLAIM_BOUND, (0, 0)),
            0
        );
        // Nor where it came later than any child may take.
        let too_late = carried(now - LATE_NS - 2 * MS, now - MS);
        assert_eq!(judged((too_late, FRESH_NS), now, w, CLAIM_BOUND, (0, 0)), 0);
        // A waiting restore's look may take it for longer.
        let stands = 2 * FRESH_NS;
        assert_eq!(
            judged((late, stands), now + FRESH_NS, w, CLAIM_BOUND, (0, 0)),
            100
        );
        assert_eq!(
            judged((late, stands), now + stands, w, CLAIM_BOUND, (0, 0)),
            0
        );
        // Nor one that says it arrived before it was asked.
        assert_eq!(
            judged(
                (carried(now, now - MS), FRESH_NS),
                now,
                w,
                CLAIM_BOUND,
                (0, 0)
            ),
            0
        );
    }

    #[test]
    fn a_restore_seen_before_the_earlier_of_question_and_look_is_held_against_its_figure() {
        let mut claims = Vec::new();
        let looked = 1_000 * MS;
        // Another restore moving 6 bytes onto the card, seen at the look;
        // this one's question goes a second later, by when it is gone.
        note_claims(&mut claims, [(4, 40, 6)].into_iter(), &CARD, looked);
        let asked = looked + 1_000 * MS;
        assert_eq!(claimed_since(&claims, &CARD, asked, looked), 6);
        // (Judged from the question alone, it would be dropped.)
        assert_eq!(claimed_after(&claims, &CARD, asked), 0);
        // A question sent before the look (a figure already in hand):
        // from the question, so the restore seen just before it counts
        // though the look came long after.
        let late_look = looked + 2 * SLACK_NS;
        assert_eq!(claimed_since(&claims, &CARD, looked + MS, late_look), 6);
        assert_eq!(claimed_after(&claims, &CARD, late_look), 0);
        // A restore last seen well before both holds nothing.
        let much_later = looked + 10 * SLACK_NS;
        assert_eq!(
            claimed_since(&claims, &CARD, much_later + MS, much_later),
            0
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
        // Seen before a figure's question that was carried late, and still
        // fresh: kept.
        let later = t0 + MS + LATE_NS + 2 * FRESH_NS;
        note_claims(&mut claims, std::iter::empty(), &CARD, later);
        assert_eq!(claimed_after(&claims, &CARD, t0), 9);
        // Gone from the board for longer than any figure is kept: forgotten.
        let later = t0 + MS + KEPT_NS + 1;
        note_claims(&mut claims, std::iter::empty(), &CARD, later);
        assert!(claims.is_empty());
    }
}
