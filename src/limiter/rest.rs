//! A container without an SM limit beside limited ones takes the rest:
//! what their limits leave of the GPU (issue 29).
//!
//! Run free, it keeps the GPU busy, and every step of a limited neighbour
//! waits out its context's time slice: on an H100, 0.1 ms steps at any
//! limit beside a busy unlimited process had a p99 of 2.5 ms and got 0.04
//! of the GPU, and 1 ms steps at 90 % 3.4 ms (docs/benchmarks.md, run
//! 140). A neighbour that takes no turns and leaves no room is the one
//! case the limits could not answer. So while the node's SM board
//! (`pacing.rs`) shows busy limited containers on its GPU, a container
//! without a limit holds itself to a share, as if it had that limit: what
//! leaves room for everyone to pace side by side (`room::ROOM_PERCENT`
//! less their limits: 60 % beside a 30 % container, as a 60 % neighbour
//! would), at least [`MIN_REST_PERCENT`]. Where a limited one asks for
//! turns (its loop went short of the GPU side by side) or no room is
//! left, the shares go in turns, as limited ones' do; the room left keeps
//! the windows apart (the whole rest, 70 % beside 30 %, left none, and
//! the windows ran into each other every few periods: p99 2.7 ms for 0.2
//! ms steps on the simulated GPU).
//!
//! A limited container whose short steps would fare badly in turns asks
//! for more room than its limit, for its switches (`room.rs`,
//! asked by `pacing.rs`): the rest leaves what the limited ones ask
//! (`Others::rooms`), their limits where they ask nothing.
//!
//! Containers without limits split it evenly. It publishes its rest on the
//! board, marked as one, so that the limited ones see the room it leaves,
//! and never asks them for turns (a rest was never promised). Once no
//! limited container is busy it runs free again: at once when they exit
//! (a slot goes with its process), 2-4 s after they go idle (busy for 2 s
//! after a launch, fresh for 2 s after). `VGPU_SM_YIELD=false` keeps a container
//! without a limit free whatever its neighbours.
//!
//! What a hostile writer of the board can do: claim a limit, or a rest to
//! split this one with, and hold a container without one down to
//! [`MIN_REST_PERCENT`] while the claim stays fresh; a neighbour that runs without vgpu takes as much by
//! time-slicing anyway. No limit of a limited container moves.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

use vgpu_shm::EntryIndex;
use vgpu_shm::layout::DeviceEntry;
use vgpu_shm::sm_board::Others;

use super::pacing::Pacing;
use super::room::ROOM_PERCENT;
use crate::clock;

/// The least rest: a container without a limit is never held to less
/// (and one at 10 % still closes its probes in its windows, `turns.rs`).
pub const MIN_REST_PERCENT: u32 = 10;

static YIELDS: AtomicBool = AtomicBool::new(true);

/// Sets whether a container without a limit takes the rest
/// (`VGPU_SM_YIELD`), once, from the configuration.
pub fn configure(yields: bool) {
    YIELDS.store(yields, Ordering::Relaxed);
}

/// Whether a container without a limit takes the rest beside limited
/// ones.
pub fn yields() -> bool {
    YIELDS.load(Ordering::Relaxed)
}

/// The rest (percent) a container without a limit takes beside `others`
/// (what the board shows besides its own slot); 0 while none of them has
/// a limit: it runs free.
pub fn rest_percent(others: &Others) -> u32 {
    if others.count <= others.resting {
        return 0;
    }
    // (Split evenly with the others that take the rest.)
    let takers = others.resting + 1;
    (ROOM_PERCENT.saturating_sub(others.rooms) / takers).max(MIN_REST_PERCENT)
}

/// One leader tick of a container without a limit on device `entry`
/// (`dev`): sets the rest it takes from the board (`pacing`'s) and
/// returns it; running free (0), it gives its slot on the board back.
pub fn take(pacing: &mut Pacing, entry: &DeviceEntry, dev: EntryIndex) -> u32 {
    let now = clock::monotonic_ns();
    let others = pacing.others(&entry.uuid(), now);
    let rest = others.as_ref().map_or(0, rest_percent);
    if rest != entry.rest_percent() {
        log::debug!(
            "dev {dev}: without an SM limit, beside limited containers: {} ({others:?})",
            match rest {
                0 => "runs free".to_string(),
                r => format!("takes the rest, {r} %"),
            }
        );
        entry.set_rest_percent(rest);
    }
    if rest == 0 {
        // (Nothing to give back unless it published.)
        pacing.withdraw();
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board(limits: &[u32], asking: u32, rests: &[u32]) -> Others {
        let mut o = Others {
            count: (limits.len() + rests.len()) as u32,
            limits: limits.iter().sum(),
            rooms: limits.iter().sum(),
            asking,
            resting: rests.len() as u32,
            ..Others::default()
        };
        o.percent = o.limits + rests.iter().sum::<u32>() + 100 * asking;
        o
    }

    #[test]
    fn beside_limited_containers_the_rest_leaves_room_to_pace() {
        // Alone, or beside others without limits only: free.
        assert_eq!(rest_percent(&Others::default()), 0);
        assert_eq!(rest_percent(&board(&[], 0, &[60])), 0);
        // Beside 30 %: 60, which paces beside it as 30 + 60 does.
        assert_eq!(rest_percent(&board(&[30], 0, &[])), 60);
        assert_eq!(rest_percent(&board(&[10], 0, &[])), 80);
        assert_eq!(rest_percent(&board(&[10, 20, 30], 0, &[])), 30);
        // Two without limits split it.
        assert_eq!(rest_percent(&board(&[30], 0, &[30])), 30);
    }

    #[test]
    fn the_rest_leaves_the_room_limited_containers_ask_for() {
        // 10 % whose steps' switches need 28 % more: 52, not 80.
        let mut o = board(&[10], 0, &[]);
        o.rooms = 38;
        assert_eq!(rest_percent(&o), 52);
        // 50 % whose windows span 62 % of the period: 28, not 40.
        let mut o = board(&[50], 1, &[]);
        o.rooms = 62;
        assert_eq!(rest_percent(&o), 28);
        // Rooms that leave nothing: the least rest.
        o.rooms = 100;
        assert_eq!(rest_percent(&o), MIN_REST_PERCENT);
    }

    #[test]
    fn where_no_room_is_left_the_least_rest() {
        // Asked for turns or not, the same room.
        assert_eq!(rest_percent(&board(&[30], 1, &[])), 60);
        // 90 % leaves no room to pace: 10, in turns.
        assert_eq!(rest_percent(&board(&[90], 0, &[])), 10);
        // Limits of the whole GPU or more (or forged): the least rest.
        assert_eq!(rest_percent(&board(&[100], 0, &[])), MIN_REST_PERCENT);
        assert_eq!(
            rest_percent(&board(&[100, 100, 100], 2, &[])),
            MIN_REST_PERCENT
        );
        assert_eq!(rest_percent(&board(&[60], 0, &[10, 10])), MIN_REST_PERCENT);
    }
}
