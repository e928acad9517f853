//! Turns placed from the node's SM board: where three or more containers
//! take turns on a GPU, each one's window opens at a place every one of
//! them works out alike from the board, instead of where its probes lead
//! it (pure, but for [`place`] and the [`Placer`] that calls it).
//!
//! Two containers in turns find each other from their probes: there is
//! one gap, and the one that opened late moves to its end
//! (`turns::verdict`). Four whose limits fill the GPU (10 + 20 + 30 + 40)
//! never quite settle that way: each moves by what its own probes lost,
//! without knowing where the others' windows lie. In 10 s each one's
//! window moved later 22-43 times and left up to a quarter of its share
//! unspent (H200, runs 173 and 176), and the two larger ones sat at their
//! bounds. The board shows each busy container's share and slot: laid
//! end to end in the order of their slots, on the clock all of them read,
//! with what the shares leave of the period spread evenly between them,
//! the windows tile the period, and each container finds its own place.
//!
//! While its turns are placed so (`layout::TURNS_TILED`), a container's
//! windows do not move on their probes' word (`judge.rs`); what they
//! lose at their ends is still mended by leaving part of the share
//! unspent (`cut::next_cut`). With fewer than three busy containers on
//! the board, shares over the whole period, or this container paced, the
//! probes lead as before. A container that takes turns but is not on the
//! board (no board mounted, every slot held, a library from before it)
//! is not counted: it finds its way into the gaps by its probes, and the
//! placed windows do not move for it.
//!
//! A place is taken once two board reads in a row agree on it, so that a
//! container that arrives or leaves, which the leaders see up to a tick
//! apart, moves the others' windows once. A writer of the board can move
//! where a container's windows open, at most every other tick, and send
//! it time-slicing with its neighbours, as a forged limit could before;
//! its limit and every quota stay as they are.
#![forbid(unsafe_code)]

use vgpu_shm::layout::{DeviceEntry, TURNS_ROOMY, TURNS_TILED};
use vgpu_shm::sm_board::Others;

use super::{cut, period, turns};

/// The fewest busy containers on a GPU, this one among them, whose turns
/// are placed from the board.
pub const MIN_CONTAINERS: u32 = 3;
/// The same where the turns run longer than the configured period for
/// some container's short steps (`period.rs`): by their probes, the 10 %
/// window nested in a 90 % one of 1 ms steps and three steps a period
/// waited a time slice (p99 3.40 ms at 130-150 ms); placed, one step a
/// period waits the other's window, and p99 was 1.29-1.30 ms (H200, runs
/// 194-195). At the configured period two stay with their probes: placed
/// at 100 ms, one step in 88 waited a whole window (7.35 ms, run 184).
pub const MIN_CONTAINERS_LENGTHENED: u32 = 2;

/// Where in each period (ns past a whole number of periods of
/// `CLOCK_MONOTONIC`) the window opens of a container whose share is
/// `mine` percent, beside `others` as its board shows them: after the
/// shares of the slots below its own and an even part of the spare time
/// after each. None where the turns are not placed: fewer than `fewest`
/// containers, or shares over the period.
pub fn phase_ns(mine: u32, others: &Others, period: u64, fewest: u32) -> Option<u64> {
    let n = u128::from(others.count) + 1;
    let total = u64::from(mine) + u64::from(others.shares);
    if n < u128::from(fewest) || total > 100 {
        return None;
    }
    let spare = u128::from(100 - total);
    // (In percent times n: each container below brings its share and an
    // n-th of the spare. `Others` counts the ones below among the others,
    // so the sum stays under 100 n.)
    let at = u128::from(others.shares_below) * n + u128::from(others.below) * spare;
    u64::try_from(u128::from(period) * at / (100 * n)).ok()
}

/// The spare time after each placed window ([`phase_ns`] spreads what
/// the shares leave of the period evenly between them), ns.
pub fn room_after_ns(mine: u32, others: &Others, period: u64) -> u64 {
    let n = u64::from(others.count) + 1;
    let spare = 100u64.saturating_sub(u64::from(mine) + u64::from(others.shares));
    period / 100 * spare / n
}

/// Whether the room after a window of `percent` placed beside `others`
/// takes what its end runs past its share, so that it needs keep nothing
/// back: twice the largest floor a placed window keeps
/// ([`cut::lengthened_floor_ns`]; a window whose end ran past a room
/// just over it would grow its cut and halve it back by turns, as run
/// 197's did). 30 + 60 of 0.05 ms kernels at 130 ms left 6.5 ms after
/// each window, yet the 60 % one kept 1.5 ms of its 78 back and got
/// 0.565-0.579 of its solo rate (H200, runs 220-223).
pub fn roomy(percent: u32, others: &Others, period: u64) -> bool {
    let floor = cut::lengthened_floor_ns(period / 100 * u64::from(percent.min(100)));
    room_after_ns(percent, others, period) >= floor.saturating_mul(2)
}

/// One device's placing, kept by its leader: the place the last board
/// read gave.
#[derive(Debug, Default)]
pub struct Placer {
    /// The last read's place, and whether it leaves room (`roomy`).
    last: Option<(u64, bool)>,
}

impl Placer {
    /// At each of the leader's ticks: `others` as the board showed them,
    /// where the container published its claim of `percent` there, and
    /// whether it takes turns now (`in_turns`: not paced). Places the
    /// turns once two reads in a row agree; leaves them to the probes at
    /// once.
    pub fn tick(
        &mut self,
        entry: &DeviceEntry,
        others: Option<Others>,
        percent: u32,
        in_turns: bool,
        now: u64,
    ) {
        let fewest = if period::lengthened(entry) {
            MIN_CONTAINERS_LENGTHENED
        } else {
            MIN_CONTAINERS
        };
        let period = period::of(entry);
        let placing = others.filter(|_| in_turns).and_then(|o| {
            phase_ns(percent, &o, period, fewest).map(|p| (p, roomy(percent, &o, period)))
        });
        let last = std::mem::replace(&mut self.last, placing);
        match placing {
            None => place(entry, None, now),
            Some((p, roomy)) if last == placing => {
                // (Read only with the tiled flag, which `place` sets.)
                entry.set_turn_flag(TURNS_ROOMY, roomy);
                place(entry, Some(p), now);
            }
            Some(_) => {} // (as it was, until the next read agrees)
        }
    }
}

/// Leaves the container's turns on `entry` to the probes: neither placed
/// nor with room after its windows.
pub fn unplace(entry: &DeviceEntry) {
    entry.set_turn_flag(TURNS_TILED, false);
    entry.set_turn_flag(TURNS_ROOMY, false);
}

/// Places the container's turns on `entry` at `phase` ([`phase_ns`]), or
/// leaves them to the probes (None): notes which in the region, and moves
/// the anchor where it is a least move or more off.
pub fn place(entry: &DeviceEntry, phase: Option<u64>, now: u64) {
    let Some(phase) = phase else {
        unplace(entry);
        return;
    };
    entry.set_turn_flag(TURNS_TILED, true);
    let period = period::of(entry);
    let phase = phase % period;
    let anchor = entry.turn_anchor();
    if anchor == 0 {
        entry.choose_turn_anchor(period + phase);
        return;
    }
    let at = anchor % period;
    let off = at.abs_diff(phase).min(period - at.abs_diff(phase));
    if off < turns::min_move_ns() {
        return;
    }
    // (Anyone who maps the region can write the anchor: near the top of
    // the clock, a period lower.)
    let to = match (anchor - at).checked_add(phase) {
        Some(0) => period,
        Some(to) => to,
        None => anchor - at - period + phase,
    };
    if entry.move_turn(anchor, to, now) {
        log::debug!(
            "turns: placed from the SM board at {:.1} ms of each period (was {:.1})",
            phase as f64 / 1e6,
            at as f64 / 1e6
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::bucket::tests::entry;

    // (No test in this binary sets another period.)
    const P: u64 = turns::PERIOD_NS;
    const MS: u64 = 1_000_000;

    /// What a container sees beside `shares`, its slot above the first
    /// `below` of them.
    fn beside(shares: &[u32], below: usize) -> Others {
        Others {
            count: shares.len() as u32,
            shares: shares.iter().sum(),
            below: below as u32,
            shares_below: shares[..below].iter().sum(),
            ..Others::default()
        }
    }

    #[test]
    fn shares_that_fill_the_period_lie_end_to_end_in_slot_order() {
        // 10 + 20 + 30 + 40, in slots 0-3: each works its place out alone.
        let places: Vec<Option<u64>> = [10u32, 20, 30, 40]
            .iter()
            .enumerate()
            .map(|(i, &mine)| {
                let mut rest = vec![10u32, 20, 30, 40];
                rest.remove(i);
                phase_ns(mine, &beside(&rest, i), P, MIN_CONTAINERS)
            })
            .collect();
        assert_eq!(
            places,
            [Some(0), Some(10 * MS), Some(30 * MS), Some(60 * MS)]
        );
    }

    #[test]
    fn what_the_shares_leave_is_spread_between_the_windows() {
        // 30 + 30 + 30: 10 % spare, a third of it after each window.
        let third = |below| phase_ns(30, &beside(&[30, 30], below), P, MIN_CONTAINERS);
        assert_eq!(third(0), Some(0));
        assert_eq!(third(1), Some(P * 100 / 300));
        assert_eq!(third(2), Some(P * 200 / 300));
    }

    #[test]
    fn the_room_after_a_window_takes_its_end_where_the_shares_leave_enough() {
        let long = 130 * MS;
        // 30 + 60 at 130 ms: 6.5 ms after each window.
        assert_eq!(room_after_ns(60, &beside(&[30], 0), long), 6_500_000);
        assert!(roomy(60, &beside(&[30], 0), long));
        assert!(roomy(30, &beside(&[60], 1), long));
        // 10 + 90, or 90 beside a rest's least 10 %: none.
        assert_eq!(room_after_ns(90, &beside(&[10], 1), long), 0);
        assert!(!roomy(90, &beside(&[10], 1), long));
        // 47 + 50: 1.95 ms after each, less than twice what a 50 %
        // window of short steps keeps back (the guard and two steps, 1.46
        // ms); 40 + 50, 6.5 ms: room.
        assert!(!roomy(50, &beside(&[47], 0), long));
        assert!(roomy(50, &beside(&[40], 0), long));
        // What a writer of the board makes it read: nothing panics.
        for count in [0, 1, u32::MAX] {
            for shares in [0, 99, 100, u32::MAX] {
                let o = Others {
                    count,
                    shares,
                    ..Others::default()
                };
                assert!(room_after_ns(100, &o, long) <= long);
                let _ = roomy(u32::MAX, &o, long);
            }
        }
    }

    #[test]
    fn two_containers_or_shares_over_the_period_place_nothing() {
        // Two: the probes find the one gap.
        assert_eq!(phase_ns(90, &beside(&[10], 1), P, MIN_CONTAINERS), None);
        // Over the period: windows would overlap wherever they lay.
        assert_eq!(phase_ns(50, &beside(&[30, 40], 1), P, MIN_CONTAINERS), None);
    }

    #[test]
    fn whatever_a_board_shows_a_place_lies_in_the_period_and_nothing_panics() {
        // What a writer of the board could make `Others` read, and more
        // (more below than there are, sums no reader would add up).
        let (r, i) = entry(50);
        let e = r.device(i);
        let odd = [0, 1, 2, 3, 50, 99, 100, 3200, u32::MAX];
        for count in odd {
            for shares in odd {
                for below in odd {
                    for shares_below in odd {
                        let o = Others {
                            count,
                            shares,
                            below,
                            shares_below,
                            ..Others::default()
                        };
                        let phase = phase_ns(10, &o, P, MIN_CONTAINERS);
                        if let Some(p) = phase {
                            assert!(count >= 2 && shares <= 90, "{o:?}");
                            place(e, Some(p), 1);
                            assert_eq!(e.turn_anchor() % P, p % P, "{o:?}");
                        }
                    }
                }
            }
        }
        // Placed at most one period on from where it was: the limit and
        // the share are not the board's to change.
        assert!(e.turn_anchor() < 3 * P);
        assert_eq!(e.sm_limit(), 50);
    }

    #[test]
    fn a_place_moves_the_anchor_by_whole_periods_and_a_little_off_stays() {
        let (r, i) = entry(50);
        let e = r.device(i);
        // No anchor yet: chosen at the place, never 0.
        place(e, Some(0), 1);
        assert_eq!(e.turn_anchor(), P);
        assert!(e.turn_flag(TURNS_TILED));
        // Off by a move or more: within the same period of the clock.
        e.move_turn(P, 7 * P + 99 * MS, 2);
        place(e, Some(30 * MS), 3);
        assert_eq!(e.turn_anchor(), 7 * P + 30 * MS);
        // Off by less than a move, across the period's end: it stays.
        e.move_turn(7 * P + 30 * MS, 7 * P + 99_800_000, 4);
        place(e, Some(0), 5);
        assert_eq!(e.turn_anchor(), 7 * P + 99_800_000);
        // Phase 0 off by more, with the anchor in the first period: a
        // period on (0 is no anchor).
        e.move_turn(7 * P + 99_800_000, 40 * MS, 6);
        place(e, Some(0), 7);
        assert_eq!(e.turn_anchor(), P);
        // An anchor near the top of the clock: a period lower, no wrap.
        e.move_turn(P, u64::MAX - 1, 8);
        place(e, Some(99 * MS), 9);
        let a = e.turn_anchor();
        assert_eq!(a % P, 99 * MS);
        assert!(u64::MAX - a < 2 * P, "{a}");
        // Left to the probes: the flag goes, the anchor stays.
        place(e, None, 10);
        assert!(!e.turn_flag(TURNS_TILED));
        assert_eq!(e.turn_anchor(), a);
    }

    #[test]
    fn a_place_is_taken_once_two_reads_agree_and_dropped_at_once() {
        let (r, i) = entry(50);
        let e = r.device(i);
        e.choose_turn_anchor(P + 5 * MS);
        let three = Some(beside(&[20, 30], 1));
        let mut placer = Placer::default();
        placer.tick(e, three, 50, true, 1);
        assert_eq!(e.turn_anchor(), P + 5 * MS);
        assert!(!e.turn_flag(TURNS_TILED));
        placer.tick(e, three, 50, true, 2);
        assert_eq!(e.turn_anchor(), P + 20 * MS);
        assert!(e.turn_flag(TURNS_TILED));
        // The board changes: the place waits for a second read.
        let four = Some(beside(&[10, 20, 20], 2));
        placer.tick(e, four, 50, true, 3);
        assert_eq!(e.turn_anchor(), P + 20 * MS);
        assert!(e.turn_flag(TURNS_TILED));
        placer.tick(e, four, 50, true, 4);
        assert_eq!(e.turn_anchor(), P + 30 * MS);
        // Paced, or no board read: the probes lead at once.
        placer.tick(e, four, 50, false, 5);
        assert!(!e.turn_flag(TURNS_TILED));
        placer.tick(e, four, 50, true, 6);
        placer.tick(e, None, 50, true, 7);
        assert!(!e.turn_flag(TURNS_TILED));
    }

    #[test]
    fn two_are_placed_where_the_turns_run_longer_for_short_steps() {
        let (r, i) = entry(90);
        let e = r.device(i);
        e.choose_turn_anchor(P + 5 * MS);
        let one = Some(beside(&[10], 1));
        let mut placer = Placer::default();
        // At the configured period: the probes lead.
        placer.tick(e, one, 90, true, 1);
        placer.tick(e, one, 90, true, 2);
        assert!(!e.turn_flag(TURNS_TILED));
        // At 139 ms: after the 10 % one's window, on the longer period.
        let long = 139 * MS;
        e.set_turn_period_ns(long);
        placer.tick(e, one, 90, true, 3);
        placer.tick(e, one, 90, true, 4);
        assert!(e.turn_flag(TURNS_TILED));
        // End to end with nothing between: no room for its end.
        assert!(!e.turn_flag(TURNS_ROOMY));
        assert_eq!(e.turn_anchor() % long, long / 10);
        // And the 10 % one, its slot below, at the period's start.
        assert_eq!(phase_ns(10, &beside(&[90], 0), long, 2), Some(0));
        // Beside 2 %: 5.6 ms after each window, twice the 90 % one's
        // floor and more: room, once two reads agree.
        let two = Some(beside(&[2], 1));
        placer.tick(e, two, 90, true, 5);
        assert!(!e.turn_flag(TURNS_ROOMY));
        placer.tick(e, two, 90, true, 6);
        assert!(e.turn_flag(TURNS_TILED) && e.turn_flag(TURNS_ROOMY));
        // Room gone at the same place (slot 0's is always 0): kept until
        // a second read agrees, then gone.
        let slot0 = Some(beside(&[2], 0));
        placer.tick(e, slot0, 90, true, 7);
        placer.tick(e, slot0, 90, true, 8);
        assert!(e.turn_flag(TURNS_ROOMY));
        let full = Some(beside(&[10], 0));
        placer.tick(e, full, 90, true, 9);
        assert!(e.turn_flag(TURNS_ROOMY));
        placer.tick(e, full, 90, true, 10);
        assert!(e.turn_flag(TURNS_TILED) && !e.turn_flag(TURNS_ROOMY));
        // Left to the probes: neither flag.
        placer.tick(e, two, 90, true, 11);
        placer.tick(e, two, 90, true, 12);
        assert!(e.turn_flag(TURNS_ROOMY));
        placer.tick(e, two, 90, false, 13);
        assert!(!e.turn_flag(TURNS_TILED) && !e.turn_flag(TURNS_ROOMY));
        e.set_turn_period_ns(0);
        placer.tick(e, one, 90, true, 14);
        assert!(!e.turn_flag(TURNS_TILED));
    }
}
