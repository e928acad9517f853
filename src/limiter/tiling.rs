//! Turns placed from the node's SM board: where three or more containers
//! take turns on a GPU, each one's window opens at a place every one of
//! them works out alike from the board, instead of where its probes lead
//! it (pure, but for [`place`]).
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
//! unspent (`turns::next_cut`). With fewer than three on the board,
//! shares over the whole period, or the container paced, the probes lead
//! as before. A writer of the board can only move where this container's
//! windows open, as a neighbour that takes no turns does; its share, and
//! every quota, stay as they are.

use vgpu_shm::layout::{DeviceEntry, TURNS_TILED};
use vgpu_shm::sm_board::Others;

use super::turns;

/// The fewest busy containers on a GPU, this one among them, whose turns
/// are placed from the board.
pub const MIN_CONTAINERS: u32 = 3;

/// Where in each period (ns past a whole number of periods of
/// `CLOCK_MONOTONIC`) the window opens of a container whose share is
/// `mine` percent, beside `others` as its board shows them: after the
/// shares of the slots below its own and an even part of the spare time
/// after each. None where the turns are not placed.
pub fn phase_ns(mine: u32, others: &Others, period: u64) -> Option<u64> {
    let n = u128::from(others.count) + 1;
    let total = u64::from(mine) + u64::from(others.shares);
    if n < u128::from(MIN_CONTAINERS) || total > 100 || others.below > others.count {
        return None;
    }
    let spare = u128::from(100 - total);
    // (In percent times n: each container below brings its share and an
    // n-th of the spare.)
    let at = u128::from(others.shares_below) * n + u128::from(others.below) * spare;
    u64::try_from(u128::from(period) * at / (100 * n)).ok()
}

/// Places the container's turns on `entry` at `phase` ([`phase_ns`]), or
/// leaves them to the probes (None): notes which in the region, and moves
/// the anchor where it is off by more than a least move.
pub fn place(entry: &DeviceEntry, phase: Option<u64>, now: u64) {
    entry.set_turn_flag(TURNS_TILED, phase.is_some());
    let Some(phase) = phase else {
        return;
    };
    let period = turns::period_ns();
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
    let to = match anchor - at + phase {
        0 => period,
        to => to,
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

    const P: u64 = 100_000_000;
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
                phase_ns(mine, &beside(&rest, i), P)
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
        let third = |below| phase_ns(30, &beside(&[30, 30], below), P);
        assert_eq!(third(0), Some(0));
        assert_eq!(third(1), Some(P * 100 / 300));
        assert_eq!(third(2), Some(P * 200 / 300));
    }

    #[test]
    fn two_containers_shares_over_the_period_or_a_torn_read_place_nothing() {
        // Two: the probes find the one gap.
        assert_eq!(phase_ns(90, &beside(&[10], 1), P), None);
        // Over the period: windows would overlap wherever they lay.
        assert_eq!(phase_ns(50, &beside(&[30, 40], 1), P), None);
        // More below than there are (read between two writes).
        let torn = Others {
            below: 3,
            ..beside(&[10, 20], 2)
        };
        assert_eq!(phase_ns(10, &torn, P), None);
    }
}
