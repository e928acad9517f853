//! Who is suspended, decided from the board as each process sees it. Pure,
//! so that every process reaches the same answer from the same board.
#![forbid(unsafe_code)]

use vgpu_shm::board::ProcState;

/// A process as the board shows it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub index: usize,
    pub state: ProcState,
    pub last_active_ns: u64,
    /// Its bytes on each card it uses.
    pub cards: Vec<([u8; 16], u64)>,
    /// What it waits for: (card, bytes).
    pub wants: Option<([u8; 16], u64)>,
}

impl Seen {
    fn bytes_on(&self, card: &[u8; 16]) -> u64 {
        self.cards
            .iter()
            .find(|(c, _)| c == card)
            .map_or(0, |&(_, b)| b)
    }

    /// Running with memory on `card`, waiting for nothing, idle for `idle_ns`.
    fn may_go(&self, card: &[u8; 16], now: u64, idle_ns: u64) -> bool {
        self.state == ProcState::Running
            && self.wants.is_none()
            && self.bytes_on(card) > 0
            && now.saturating_sub(self.last_active_ns) >= idle_ns
    }
}

/// The card on which `me` should make room now, if any: someone else waits
/// there, nobody is suspending there already (one at a time, so that no
/// more leaves than is needed), and of the idle processes on that card
/// `me` has been idle longest (ties: the lower board index).
pub fn card_to_free(me: &Seen, others: &[Seen], now: u64, idle_ns: u64) -> Option<[u8; 16]> {
    others.iter().filter_map(|o| o.wants).find_map(|(card, _)| {
        if !me.may_go(&card, now, idle_ns) {
            return None;
        }
        let busy = others
            .iter()
            .any(|o| o.state == ProcState::Suspending && o.bytes_on(&card) > 0);
        let first = others
            .iter()
            .filter(|o| o.may_go(&card, now, idle_ns))
            .all(|o| (me.last_active_ns, me.index) < (o.last_active_ns, o.index));
        (!busy && first).then_some(card)
    })
}

/// Room the next holder must find beyond what it asked for before a
/// context may stay on the card at a turn's end: a job's first steps
/// allocate more than its first request (cuBLAS's workspace, the caching
/// allocator's next segment).
pub const CONTEXT_HEADROOM: u64 = 2 << 30;

/// Whether a busy process's turn may end with only its VMM blocks moved
/// and its context (with its small blocks) left on the card: the card's
/// `free` bytes once they left hold what the waiters `need` (their wants,
/// and a restore's margin), with [`CONTEXT_HEADROOM`] to spare. The
/// context's checkpoint and restore took about 3 s of a 4 s switch (run
/// 102).
pub fn context_may_stay(free: u64, need: u64) -> bool {
    free >= need.saturating_add(CONTEXT_HEADROOM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_stays_only_where_the_waiters_fit_beside_it_with_headroom() {
        const GIB: u64 = 1 << 30;
        // 20 GiB of room, a 15 GiB job moved out (19.4 GiB free beside its
        // context), 15 GiB needed: stays.
        assert!(context_may_stay(19 * GIB, 15 * GIB));
        // The same need with less than the headroom to spare: goes.
        assert!(!context_may_stay(16 * GIB, 15 * GIB));
        // A need of the whole card never lets it stay; no overflow.
        assert!(!context_may_stay(19 * GIB, 80 * GIB));
        assert!(!context_may_stay(0, u64::MAX));
        assert!(context_may_stay(u64::MAX, u64::MAX - 2 * GIB));
    }

    const CARD: [u8; 16] = [1; 16];
    const OTHER: [u8; 16] = [2; 16];
    const S: u64 = 1_000_000_000;

    fn running(index: usize, last_active_ns: u64, bytes: u64) -> Seen {
        Seen {
            index,
            state: ProcState::Running,
            last_active_ns,
            cards: vec![(CARD, bytes)],
            wants: None,
        }
    }

    fn waiter(index: usize) -> Seen {
        Seen {
            wants: Some((CARD, 1 << 30)),
            ..running(index, 100 * S, 1 << 30)
        }
    }

    #[test]
    fn nobody_goes_while_nobody_waits() {
        let me = running(0, 0, 1 << 30);
        assert_eq!(card_to_free(&me, &[running(1, 0, 1)], 10 * S, 2 * S), None);
    }

    #[test]
    fn the_idlest_process_on_the_card_goes_first() {
        let older = running(0, S, 1 << 30);
        let newer = running(1, 3 * S, 1 << 30);
        let w = waiter(2);
        let now = 10 * S;
        assert_eq!(
            card_to_free(&older, &[newer.clone(), w.clone()], now, 2 * S),
            Some(CARD)
        );
        assert_eq!(card_to_free(&newer, &[older, w], now, 2 * S), None);
    }

    #[test]
    fn a_busy_process_stays() {
        let me = running(0, 9 * S, 1 << 30);
        assert_eq!(card_to_free(&me, &[waiter(1)], 10 * S, 2 * S), None);
    }

    #[test]
    fn a_process_on_another_card_stays() {
        let mut me = running(0, 0, 1 << 30);
        me.cards = vec![(OTHER, 1 << 30)];
        assert_eq!(card_to_free(&me, &[waiter(1)], 10 * S, 2 * S), None);
    }

    #[test]
    fn one_suspends_at_a_time() {
        let me = running(0, 0, 1 << 30);
        let mut going = running(1, 0, 1 << 30);
        going.state = ProcState::Suspending;
        assert_eq!(card_to_free(&me, &[going, waiter(2)], 10 * S, 2 * S), None);
    }

    #[test]
    fn a_waiting_process_is_never_the_one_to_go() {
        let me = Seen {
            last_active_ns: 0,
            ..waiter(0)
        };
        assert_eq!(card_to_free(&me, &[waiter(1)], 10 * S, 2 * S), None);
    }
}
