//! Turns for busy processes, decided from the board as each process sees
//! it (pure; `line.rs` gathers the inputs and carries the answers out).
//!
//! When processes wait for memory on a card and no holder there is idle
//! (idle ones go first, `policy.rs`), the busy holders give their turn:
//! a holder whose turn has lasted a quantum suspends itself, between its
//! driver calls, and the waiters take the room in line:
//! - **first come, first served**: a waiter's place is when its wait
//!   began (`want_since_ns`);
//! - **priority**: a normal waiter (`CUDA_TASK_PRIORITY=1`) stands as if
//!   it had come [`PRIORITY_QUANTA`] quanta later than it did, and a
//!   high-priority holder keeps the card that many quanta against normal
//!   waiters;
//! - **nobody starves**: both head starts are finite, so a waiter's age
//!   wins in the end, and a holder that others' entries hold back (one
//!   that says it goes first, or is idle, or suspends) goes anyway once
//!   its turn is a whole quantum overdue: a neighbour's entry can delay a
//!   turn, never stop it.
#![forbid(unsafe_code)]

use vgpu_shm::board::ProcState;

/// Quanta of head start a high priority is worth (in the line, and to a
/// holder against normal waiters).
pub const PRIORITY_QUANTA: u64 = 2;

/// A process as the board shows it, for turns.
#[derive(Clone, Debug)]
pub struct Party {
    pub index: usize,
    pub state: ProcState,
    /// 0 high, 1 normal.
    pub priority: u32,
    pub last_active_ns: u64,
    /// Its bytes on each card it uses.
    pub cards: Vec<([u8; 16], u64)>,
    /// What it waits for: (card, bytes).
    pub wants: Option<([u8; 16], u64)>,
    /// When its wait began (0: unknown).
    pub want_since_ns: u64,
    /// When its turn on the card began.
    pub turn_since_ns: u64,
}

/// The times a decision is made with.
#[derive(Clone, Copy, Debug)]
pub struct Times {
    pub now: u64,
    /// This process's quantum (0: it gives no turns).
    pub quantum_ns: u64,
    /// How long a holder must have made no call to count as idle.
    pub idle_ns: u64,
}

impl Party {
    fn bytes_on(&self, card: &[u8; 16]) -> u64 {
        self.cards
            .iter()
            .find(|(c, _)| c == card)
            .map_or(0, |&(_, b)| b)
    }

    /// Waits for room on `card` (an allocation, or its own restore).
    fn waits_on(&self, card: &[u8; 16]) -> bool {
        matches!(self.state, ProcState::Running | ProcState::Restoring)
            && self.wants.is_some_and(|(c, b)| &c == card && b > 0)
    }

    /// Holds memory on `card` and waits for nothing.
    fn holds(&self, card: &[u8; 16]) -> bool {
        self.state == ProcState::Running && self.wants.is_none() && self.bytes_on(card) > 0
    }

    fn idle(&self, t: &Times) -> bool {
        t.now.saturating_sub(self.last_active_ns) >= t.idle_ns
    }

    /// Its place in the line: when its wait began, later by the head
    /// start of a high priority if it is normal. A wait of unknown start
    /// is at the back.
    fn place(&self, t: &Times) -> (u64, usize) {
        let since = match self.want_since_ns {
            0 => t.now,
            s => s.min(t.now),
        };
        let later = if self.priority == 0 {
            0
        } else {
            PRIORITY_QUANTA.saturating_mul(t.quantum_ns)
        };
        (since.saturating_add(later), self.index)
    }
}

/// The waiters on `card` ahead of `me` in the line (all of them when
/// `me` does not wait there).
pub fn ahead<'a>(
    me: &Party,
    others: &'a [Party],
    card: &[u8; 16],
    t: &Times,
) -> impl Iterator<Item = &'a Party> {
    let mine = me.waits_on(card).then(|| me.place(t));
    let t = *t;
    let card = *card;
    others
        .iter()
        .filter(move |o| o.waits_on(&card) && mine.is_none_or(|m| o.place(&t) < m))
}

/// The card on which `me`, a busy holder, gives its turn now, if any:
/// someone waits there, its turn has lasted a quantum (more against
/// normal waiters if it is high priority), and nobody there goes before
/// it: an idle holder (`policy.rs` suspends those), a suspension under
/// way, or a busy holder whose turn began earlier and is over too. Past
/// a quantum more than its due, it goes whatever the others say.
pub fn card_to_yield(me: &Party, others: &[Party], t: &Times) -> Option<[u8; 16]> {
    if t.quantum_ns == 0 || me.state != ProcState::Running || me.wants.is_some() {
        return None;
    }
    let age = t.now.saturating_sub(me.turn_since_ns);
    others.iter().filter_map(|o| o.wants).find_map(|(card, _)| {
        let waiters: Vec<&Party> = others.iter().filter(|o| o.waits_on(&card)).collect();
        if waiters.is_empty() || me.bytes_on(&card) == 0 {
            return None;
        }
        let all_normal = waiters.iter().all(|w| w.priority != 0);
        let quanta = if me.priority == 0 && all_normal {
            PRIORITY_QUANTA
        } else {
            1
        };
        let due = t.quantum_ns.saturating_mul(quanta);
        if age < due {
            return None;
        }
        let suspending = others
            .iter()
            .any(|o| o.state == ProcState::Suspending && o.bytes_on(&card) > 0);
        let idle_there = others.iter().any(|o| o.holds(&card) && o.idle(t));
        let earlier = others.iter().any(|o| {
            o.holds(&card)
                && t.now.saturating_sub(o.turn_since_ns) >= t.quantum_ns
                && (o.turn_since_ns, o.index) < (me.turn_since_ns, me.index)
        });
        let overdue = age >= due.saturating_add(t.quantum_ns);
        (overdue || !(suspending || idle_there || earlier)).then_some(card)
    })
}

/// Whether turns could make room for `bytes` on a card where the
/// processes that give turns hold `held` and `free` is free (None: NVML
/// did not say, so they might): what others outside the turns hold never
/// comes free by them.
pub fn could_make_room(free: Option<u64>, held: u64, bytes: u64) -> bool {
    free.is_none_or(|f| f.saturating_add(held) >= bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARD: [u8; 16] = [1; 16];
    const OTHER: [u8; 16] = [2; 16];
    const S: u64 = 1_000_000_000;
    const Q: u64 = 10 * S;

    fn times(now: u64) -> Times {
        Times {
            now,
            quantum_ns: Q,
            idle_ns: 2 * S,
        }
    }

    /// A busy holder on CARD whose turn began at `turn`.
    fn holder(index: usize, turn: u64, now: u64) -> Party {
        Party {
            index,
            state: ProcState::Running,
            priority: 1,
            last_active_ns: now,
            cards: vec![(CARD, 1 << 30)],
            wants: None,
            want_since_ns: 0,
            turn_since_ns: turn,
        }
    }

    /// A waiter on CARD since `since` (a suspended process's restore).
    fn waiter(index: usize, since: u64, priority: u32) -> Party {
        Party {
            state: ProcState::Restoring,
            priority,
            cards: vec![(CARD, 0)],
            wants: Some((CARD, 1 << 30)),
            want_since_ns: since,
            ..holder(index, 0, 0)
        }
    }

    fn first(me: &Party, others: &[Party], now: u64) -> Option<usize> {
        ahead(me, others, &CARD, &times(now))
            .min_by_key(|o| o.place(&times(now)))
            .map(|o| o.index)
    }

    #[test]
    fn a_busy_holder_gives_its_turn_when_its_quantum_is_over_and_someone_waits() {
        let me = holder(0, 0, 30 * S);
        assert_eq!(card_to_yield(&me, &[], &times(30 * S)), None);
        let w = [waiter(1, 5 * S, 1)];
        assert_eq!(card_to_yield(&me, &w, &times(Q - 1)), None);
        assert_eq!(card_to_yield(&me, &w, &times(Q)), Some(CARD));
        // A waiter elsewhere, a holder that waits itself, no quantum: no.
        let mut elsewhere = waiter(1, 5 * S, 1);
        elsewhere.wants = Some((OTHER, 1));
        assert_eq!(card_to_yield(&me, &[elsewhere], &times(Q)), None);
        let mut waiting = me.clone();
        waiting.wants = Some((CARD, 1));
        assert_eq!(card_to_yield(&waiting, &w, &times(Q)), None);
        let mut t = times(Q);
        t.quantum_ns = 0;
        assert_eq!(card_to_yield(&me, &w, &t), None);
    }

    #[test]
    fn idle_holders_go_first_and_busy_ones_one_at_a_time_in_turn_order() {
        let now = Q + S;
        let me = holder(0, S / 2, now);
        let w = waiter(9, S, 1);
        let mut idle = holder(1, S, now);
        idle.last_active_ns = now - 3 * S;
        assert_eq!(card_to_yield(&me, &[idle, w.clone()], &times(now)), None);
        // An earlier turn, over too, goes first; a later one waits for me.
        let older = holder(2, 0, now);
        assert_eq!(
            card_to_yield(&me, &[older.clone(), w.clone()], &times(now)),
            None
        );
        assert_eq!(
            card_to_yield(&older, &[me.clone(), w.clone()], &times(now)),
            Some(CARD)
        );
        let mut going = holder(3, 0, now);
        going.state = ProcState::Suspending;
        assert_eq!(card_to_yield(&me, &[going, w], &times(now)), None);
    }

    #[test]
    fn what_others_say_delays_a_turn_by_one_quantum_at_most() {
        // A neighbour that claims to go first (or to be idle, or to be
        // suspending) for ever: the holder goes a quantum late.
        let me = holder(5, 0, 2 * Q);
        let liar = holder(1, 0, 0);
        let w = waiter(2, S, 1);
        assert_eq!(
            card_to_yield(&me, &[liar.clone(), w.clone()], &times(Q)),
            None
        );
        assert_eq!(card_to_yield(&me, &[liar, w], &times(2 * Q)), Some(CARD));
    }

    #[test]
    fn the_line_is_first_come_first_served() {
        let me = waiter(0, 20 * S, 1);
        let others = [waiter(1, 30 * S, 1), waiter(2, 10 * S, 1), holder(3, 0, 0)];
        assert_eq!(first(&me, &others, 40 * S), Some(2));
        let v: Vec<usize> = ahead(&me, &others, &CARD, &times(40 * S))
            .map(|o| o.index)
            .collect();
        assert_eq!(v, vec![2]);
        // The first in line has nobody ahead.
        assert_eq!(
            first(&others[0], std::slice::from_ref(&me), 40 * S),
            Some(0)
        );
        assert_eq!(first(&others[1], &[me], 40 * S), None);
    }

    #[test]
    fn a_high_priority_goes_ahead_by_its_head_start_and_no_further() {
        let normal = waiter(0, 10 * S, 1);
        // Came later, within two quanta: ahead.
        let high = waiter(1, 10 * S + 2 * Q - 1, 0);
        assert_eq!(
            first(&normal, std::slice::from_ref(&high), 100 * S),
            Some(1)
        );
        assert_eq!(first(&high, std::slice::from_ref(&normal), 100 * S), None);
        // Came two quanta later or more: the older normal waiter's age wins.
        let late = waiter(2, 10 * S + 2 * Q, 0);
        assert_eq!(first(&normal, &[late], 100 * S), None);
        // A wait of unknown start stands at the back.
        let unknown = waiter(3, 0, 1);
        assert_eq!(first(&normal, &[unknown], 100 * S), None);
    }

    #[test]
    fn a_high_priority_holder_keeps_the_card_longer_but_not_for_ever() {
        let mut me = holder(0, 0, 0);
        me.priority = 0;
        let normal = [waiter(1, S, 1)];
        assert_eq!(card_to_yield(&me, &normal, &times(Q)), None);
        assert_eq!(
            card_to_yield(&me, &normal, &times(PRIORITY_QUANTA * Q)),
            Some(CARD)
        );
        // Against another high-priority waiter: one quantum.
        let high = [waiter(1, S, 0)];
        assert_eq!(card_to_yield(&me, &high, &times(Q)), Some(CARD));
    }

    #[test]
    fn nobody_starves_two_holders_and_a_waiter_all_get_turns() {
        // Three processes, room for one: each turn lasts a quantum, the one
        // who gives its turn waits at the back, and everyone comes round.
        let mut ps: Vec<Party> = (0..3).map(|i| waiter(i, (i as u64 + 1) * S, 1)).collect();
        ps[0] = holder(0, 0, 0);
        let mut now = 0;
        let mut turns = [0u32; 3];
        for _ in 0..9 {
            now += Q;
            let h = ps
                .iter()
                .position(|p| p.state == ProcState::Running)
                .unwrap();
            let others: Vec<Party> = ps.iter().filter(|p| p.index != h).cloned().collect();
            assert_eq!(card_to_yield(&ps[h], &others, &times(now)), Some(CARD));
            ps[h] = waiter(h, now, 1);
            let others: Vec<Party> = ps.iter().filter(|p| p.index != h).cloned().collect();
            let next = first(&ps[h], &others, now).unwrap();
            let rest: Vec<Party> = ps.iter().filter(|p| p.index != next).cloned().collect();
            assert_eq!(first(&ps[next], &rest, now), None, "one first");
            ps[next] = holder(next, now, now);
            turns[next] += 1;
        }
        assert_eq!(turns, [3, 3, 3]);
    }

    #[test]
    fn turns_make_room_only_from_what_their_holders_hold_and_what_is_free() {
        const GIB: u64 = 1 << 30;
        // A 45 GiB job beside a holder with 45.5 GiB on the card.
        assert!(could_make_room(
            Some(19 * GIB),
            45 * GIB + GIB / 2,
            45 * GIB
        ));
        // Beside one with only its context there (its own 45 GiB still a
        // reservation) and a holder outside the turns: never.
        assert!(!could_make_room(Some(19 * GIB), GIB / 2, 45 * GIB));
        // Exactly enough is enough; NVML silent, the turns may.
        assert!(could_make_room(Some(GIB), GIB, 2 * GIB));
        assert!(could_make_room(None, 0, 45 * GIB));
    }
}
