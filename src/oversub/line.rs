//! Turns, the driver's part: the board read into `turns::Party`s, this
//! process's turn (when it began, whether it gave one), the line's
//! bounds, and the counters `vgpuctl oversub` shows. `turns.rs` decides.
//!
//! What the board says can hold this process back only within bounds:
//! a waiter lets those ahead of it in line take room it could take for
//! [`DEFER_BOUND`] in all per wait; a wait for a turn lasts at most
//! [`MAX_PARTIES`] turns of its own quantum plus [`ARENA_GRACE`] and
//! [`SWITCH_ALLOWANCE`] each, beyond its own `VGPU_OVERSUBSCRIBE_WAIT_MS` (or
//! `_RESTORE_WAIT_MS`).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vgpu_shm::board::ProcState;

use super::state::{Here, IN_CALL, settings};
use super::turns::{self, Party, Times};
use crate::clock;

/// How long a waiter lets those ahead of it take room it could take, in
/// all, per wait (they take it within tens of milliseconds; a neighbour
/// that only says it waits ahead must not hold this process for ever).
pub const DEFER_BOUND: Duration = Duration::from_secs(5);
/// Turns a wait for a turn may last at most.
pub const MAX_PARTIES: u64 = 4;
/// What a switch may take, beyond a quantum, per turn waited for: a
/// 46 GiB job moved out in up to 45 s and back in up to 60 s on the H200.
pub const SWITCH_ALLOWANCE: Duration = Duration::from_secs(120);
/// How long a busy process whose turn is over may keep the card while
/// its host arena is pinned ([`hold_for_arena`]): populated and
/// registered, the arena pins at 3-7 GB/s (docs/vmm-facts.md fact 2;
/// 11 s for 33 GiB in run 111). A wait for a turn allows it beside
/// [`SWITCH_ALLOWANCE`] ([`turns_of`]).
pub const ARENA_GRACE: Duration = Duration::from_secs(60);
/// How long a turn's end waits for the synchronisations and copies in
/// flight to end (the gate holds new calls back meanwhile).
pub const DRAIN_BOUND: Duration = Duration::from_secs(10);

/// When this process's turn on the card began (monotonic ns).
static TURN_SINCE: AtomicU64 = AtomicU64::new(0);
/// It was suspended at a quantum's end: its restore waits for its turn.
pub(super) static GAVE_TURN: AtomicBool = AtomicBool::new(false);
/// When this process, its turn over, began to keep the card for its
/// arena (0: it does not).
static HELD_FOR_ARENA: AtomicU64 = AtomicU64::new(0);

/// This process's quantum: the one set, else the default for how its
/// switches move what it holds: by VMM copies where those hold at least
/// half of it, else by the checkpoint API (a process of small blocks or
/// of its own VMM pools moves at that speed).
fn quantum_ms() -> u64 {
    let s = settings();
    s.quantum_ms.unwrap_or_else(|| {
        let by_copies = s.vmm() && !super::backing::legacy() && {
            let backed = super::backing::backed_bytes();
            let held: u64 =
                super::state::here().map_or(0, |h| h.entry().cards().iter().map(|&(_, b)| b).sum());
            backed.saturating_mul(2) >= held
        };
        crate::config::default_quantum_ms(by_copies)
    })
}

fn quantum_ns() -> u64 {
    quantum_ms().saturating_mul(1_000_000)
}

/// Publishes this process's priority; its turn begins now.
pub(super) fn start(h: &Here, priority: i32) {
    h.entry().set_priority(u32::from(priority != 0));
    advertise(h);
    turn_began(h);
}

/// Publishes its quantum while it can give a turn, 0 while it cannot
/// (none set, the host memory bound would refuse its suspension, or it
/// has nothing to move):
/// waiters on its card wait for a turn only where one can come (each
/// tick).
pub(super) fn advertise(h: &Here) {
    let s = settings();
    let mine: u64 = h.entry().cards().iter().map(|&(_, b)| b).sum();
    let fits = h.board.host_bytes(Some(h.entry)).saturating_add(mine) <= s.host_limit;
    // (A process whose VMM memory is all shared with another has nothing
    // a suspension may move: shared.rs.)
    let movable = !super::shared::any() || super::backing::mapped_bytes() > 0;
    let q = if fits && movable { quantum_ms() } else { 0 };
    h.entry()
        .set_quantum_ms(u32::try_from(q).unwrap_or(u32::MAX));
}

/// A new turn on the card begins now (a restore, or an allocation
/// granted after waiting).
pub(super) fn turn_began(h: &Here) {
    let now = clock::monotonic_ns();
    TURN_SINCE.store(now, Ordering::Release);
    HELD_FOR_ARENA.store(0, Ordering::Release);
    h.entry().set_turn_since(now);
}

/// Whether this process, its turn over, keeps the card a while longer
/// because its host arena is `short` of its blocks (being pinned): for
/// [`ARENA_GRACE`] at most per turn, however the arena fares.
pub(super) fn hold_for_arena(now: u64, short: bool) -> bool {
    if !short {
        return false;
    }
    let since = match HELD_FOR_ARENA.compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => now,
        Err(since) => since,
    };
    now.saturating_sub(since) < u64::try_from(ARENA_GRACE.as_nanos()).unwrap_or(u64::MAX)
}

/// The card back after waiting for a turn.
pub(super) fn took_turn(h: &Here) {
    h.entry().count_turn_taken();
    turn_began(h);
}

/// Suspended at a quantum's end.
pub(super) fn gave_turn(h: &Here) {
    GAVE_TURN.store(true, Ordering::Release);
    h.entry().count_turn_given();
}

fn party(h: &Here, i: usize) -> Party {
    let e = h.board.entry(i);
    Party {
        index: i,
        state: e.state(),
        priority: e.priority(),
        last_active_ns: e.last_active_ns(),
        cards: e.cards(),
        wants: e.wants(),
        want_since_ns: e.want_since_ns(),
        turn_since_ns: e.turn_since_ns(),
    }
}

fn times(now: u64) -> Times {
    Times {
        now,
        quantum_ns: quantum_ns(),
        idle_ns: settings().idle_ns,
    }
}

/// This process (its turn as it knows it) and the others on the board.
fn parties(h: &Here) -> (Party, Vec<Party>) {
    let mut me = party(h, h.entry);
    me.turn_since_ns = TURN_SINCE.load(Ordering::Acquire);
    let others = h
        .board
        .others(Some(h.entry))
        .map(|(i, _)| party(h, i))
        .collect();
    (me, others)
}

/// The card on which this busy process gives its turn now (turns.rs).
pub(super) fn card_to_yield(h: &Here, now: u64) -> Option<[u8; 16]> {
    let (me, others) = parties(h);
    turns::card_to_yield(&me, &others, &times(now))
}

/// Waiters on `card` ahead of this process in line.
fn ahead(h: &Here, card: &[u8; 16]) -> u64 {
    let (me, others) = parties(h);
    turns::ahead(&me, &others, card, &times(clock::monotonic_ns())).count() as u64
}

/// Whether turns are taken on `card` and could make room there for
/// `bytes`: another process holds memory there and gives turns (its
/// quantum is not 0), or one is already moving out or back (a restore
/// once its claim is made), and what such
/// processes hold there with what is free (`free`, asked only then)
/// covers `bytes` (`turns::could_make_room`). Memory of processes outside
/// oversubscription never comes free by turns: two waiters beside such a
/// holder, each with only its context on the card, otherwise waited out
/// each other's turns instead of their own bound (run 120, an H100).
pub(super) fn turns_on(
    h: &Here,
    card: &[u8; 16],
    bytes: u64,
    free: impl FnOnce() -> Option<u64>,
) -> bool {
    let giving = h
        .board
        .others(Some(h.entry))
        .filter(|(_, e)| match e.state() {
            ProcState::Running => e.quantum_ms() != 0,
            ProcState::Suspending | ProcState::Restoring => true,
            _ => false,
        })
        .map(|(_, e)| e.held_on(card))
        .filter(|&held| held > 0)
        .reduce(u64::saturating_add);
    giving.is_some_and(|held| turns::could_make_room(free(), held, bytes))
}

/// How much longer than its own bound a wait on `card` may last for its
/// turn: one turn per waiter ahead of it, and the holder's.
pub(super) fn turn_wait(h: &Here, card: &[u8; 16]) -> Duration {
    turns_of(ahead(h, card).saturating_add(1))
}

/// `parties` turns (at most [`MAX_PARTIES`]) of this process's quantum,
/// the holder's grace for its arena and a switch each.
pub(super) fn turns_of(parties: u64) -> Duration {
    let one = Duration::from_millis(quantum_ms())
        .saturating_add(ARENA_GRACE)
        .saturating_add(SWITCH_ALLOWANCE);
    one.saturating_mul(parties.min(MAX_PARTIES) as u32)
}

/// What a restore of a process that gave its turn may wait beyond
/// `VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS`: the turns of the others.
pub(super) fn restore_extra_ns() -> u64 {
    if GAVE_TURN.load(Ordering::Acquire) {
        turns_of(MAX_PARTIES).as_nanos() as u64
    } else {
        0
    }
}

/// Waits, up to [`DRAIN_BOUND`], for the synchronisations and copies in
/// flight to end (new calls wait at the gate meanwhile); false if they
/// did not.
pub(super) fn drained() -> bool {
    let until = Instant::now() + DRAIN_BOUND;
    while IN_CALL.load(Ordering::Acquire) != 0 {
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// A waiter's patience with those ahead of it in line, for one wait.
#[derive(Default)]
pub(super) struct Defer {
    used: Duration,
    last: Option<Instant>,
}

impl Defer {
    /// Whether to leave room this process could take on `card` to a
    /// waiter ahead of it in line: while one is there and `room` says
    /// there is room (asked only then), within [`DEFER_BOUND`] in all for
    /// this wait.
    pub(super) fn let_first(
        &mut self,
        h: &Here,
        card: &[u8; 16],
        room: impl FnOnce() -> bool,
    ) -> bool {
        let now = Instant::now();
        if self.used >= DEFER_BOUND || ahead(h, card) == 0 || !room() {
            self.last = None;
            return false;
        }
        if let Some(last) = self.last {
            self.used += now.duration_since(last);
        }
        self.last = Some(now);
        true
    }

    /// Not deferring now (the next deferral's time counts from then).
    pub(super) fn pause(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_is_held_for_the_arena_only_while_it_is_short_and_within_the_grace() {
        HELD_FOR_ARENA.store(0, Ordering::Release);
        let grace = u64::try_from(ARENA_GRACE.as_nanos()).unwrap();
        let t = 5_000_000_000;
        assert!(!hold_for_arena(t, false));
        assert!(hold_for_arena(t, true));
        assert!(hold_for_arena(t + grace - 1, true));
        // Past the grace, however short the arena still is.
        assert!(!hold_for_arena(t + grace, true));
        assert!(!hold_for_arena(t + 2 * grace, true));
        // A new turn starts a new grace.
        HELD_FOR_ARENA.store(0, Ordering::Release);
        assert!(hold_for_arena(t + 3 * grace, true));
    }
}
