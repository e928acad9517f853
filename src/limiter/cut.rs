//! What a container in turns leaves unspent of each period's share
//! (pure): where its windows run into the next one's, where something
//! covers them, and a guard while it shares the GPU. The bucket holds the
//! schedule to the share less the cut (`bucket.rs`); `judge.rs` sets it
//! after each window.
#![forbid(unsafe_code)]

use super::turns::{
    MIN_MOVE_NS, Probe, covered, covered_streak, nearly_covered, ran_on_from_a_clear_start, scaled,
    trailing_lost_ns,
};

/// The most a container leaves unspent of each period's share while its
/// windows run into the next one's: a quarter.
pub const MAX_CUT_PCT: u64 = 25;

/// What a container leaves unspent of each period's share after a window
/// was judged (`streak`: [`next_streak`](super::turns::next_streak) after this window).
/// Two containers that always have work never find their turns, as
/// neither window ever opens on an idle GPU; so:
/// - a window that ran on into another's (its trailing probes lost time,
///   [`trailing_lost_ns`]) adds half what they lost (the other one
///   leaves some too), unless it opened on an idle GPU: it moves earlier
///   instead ([`verdict`](super::turns::verdict));
/// - a covered window adds an eighth of the share, until the streak
///   says nothing that takes turns covers it: then nothing is cut;
/// - a window that ended clear halves the cut, down to the guard while
///   `shared` (another context was met in the last 10 s,
///   `layout::TURN_SHARED_NS`).
///
/// Where the window is placed from the board (`tiling.rs`), it never
/// moves earlier: one that ran on from a clear start adds half what its
/// tail lost too; and where its `period` is also longer than the
/// configured one (`period.rs`), a clear end halves the cut only down
/// to twice [`lengthened_floor_ns`], takes a sixteenth off below that,
/// and never leaves less than the floor (but after a covered streak).
/// Where the board leaves room after the window for its end
/// ([`Placed::WithRoom`]), no floor: a clear end halves the cut to nothing.
///
/// At most [`MAX_CUT_PCT`] of `share_ns` (of a `period`).
pub fn next_cut(
    cut: u64,
    (share_ns, period): (u64, u64),
    probes: &[Probe],
    streak: u32,
    shared: bool,
    placed: Placed,
) -> u64 {
    if (covered(probes) || nearly_covered(probes, share_ns, period)) && streak > covered_streak() {
        return 0;
    }
    let most = share_ns / 100 * MAX_CUT_PCT;
    let tiled = placed != Placed::ByProbes;
    let lengthened = tiled && period > super::turns::period_ns();
    let floor = match (shared && placed != Placed::WithRoom, lengthened) {
        (false, _) => 0,
        (true, false) => guard_ns(),
        (true, true) => lengthened_floor_ns(share_ns),
    };
    let cut = cut.min(most);
    let cut = if covered(probes) {
        cut + share_ns / 8
    } else if !tiled && ran_on_from_a_clear_start(probes) {
        cut // it moves earlier instead (`turns::verdict`)
    } else {
        match trailing_lost_ns(probes) {
            // (Halved near its floor, the cut of a window whose tail
            // needs more than the floor would run on every other period,
            // as 1 ms steps at 90 % did at 2.4 / 1.2 ms: a step waited a
            // time slice each time, p99 3.40 ms; H200, run 197.)
            0 if lengthened => {
                let knee = floor.saturating_mul(2);
                if cut <= knee {
                    cut - cut / 16
                } else {
                    (cut / 2).max(knee)
                }
            }
            0 => cut / 2,
            lost => cut.saturating_add(lost / 2),
        }
    };
    cut.max(floor).min(most)
}

/// Where a container's windows lie in each period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// Where its probes lead them (`turns::verdict`).
    ByProbes,
    /// From the board, end to end with the others' (`tiling.rs`).
    Tiled,
    /// From the board, with room after each for what its end runs past
    /// its share (`tiling::roomy`).
    WithRoom,
}

impl Placed {
    /// From the region's flags ([`TURNS_TILED`](vgpu_shm::layout::TURNS_TILED),
    /// [`TURNS_ROOMY`](vgpu_shm::layout::TURNS_ROOMY)).
    pub fn of(tiled: bool, roomy: bool) -> Placed {
        match (tiled, roomy) {
            (false, _) => Placed::ByProbes,
            (true, false) => Placed::Tiled,
            (true, true) => Placed::WithRoom,
        }
    }
}

/// The least a placed window leaves unspent in turns lengthened for
/// short steps, where the board leaves no room after it
/// ([`Placed::WithRoom`]): the guard and two of the steps that lengthened them (a
/// window holds about [`WINDOW_STEPS`](super::period::WINDOW_STEPS)
/// there; for a neighbour that did not ask, a share-sized stand-in). Its
/// last launch runs past its share, and where a rest's deep queue
/// follows, no probe sees it: 1 ms steps at 90 % beside one, their cut
/// coming down from 2.6 ms by sixteenths, ran into its window from 1.3 s
/// on (a time slice each period, p99 3.40 ms; H200, run 214), and kept
/// clear with cuts of 5.0-7.6 ms after their placement, 1-2 ms at the
/// end (run 215). Halved to twice this, a cut grown by a placement's
/// first windows is gone within a few periods, where taken off by
/// sixteenths the 60 % window of 0.05 ms kernels left 13.0, then 16.6 ms
/// unspent and took 5 s to come down (0.541 of its solo rate; run 212).
pub fn lengthened_floor_ns(share_ns: u64) -> u64 {
    guard_ns().saturating_add(share_ns / super::period::WINDOW_STEPS * 2)
}

/// What a container leaves unspent of each share while it shares the
/// GPU with others that take turns. Shares that sum to the whole period
/// leave no room between windows, so a window that opens a little late (a
/// host waking up, a launch's latency) runs into the next, both lose
/// time, and the next runs into the one after: four containers at 25 %
/// chased each other round the period for 20 s on an H100 and got 0.225
/// each (run 41). That guard was 2 % of the share and 0.5 ms, against
/// windows whose last lease ran up to 2 ms past their share; now that a
/// window ends within one launch of its share (`bucket::admit`), 0.5 ms
/// is left
/// (docs/benchmarks.md, run 68).
pub const GUARD_NS: u64 = MIN_MOVE_NS;

/// [`GUARD_NS`] at this process's period.
pub fn guard_ns() -> u64 {
    scaled(GUARD_NS).max(MIN_GUARD_NS)
}

/// The least guard at any period: a window's last launch runs on past its
/// share, and each turn costs a switch (about 0.15 ms), whatever the
/// period.
pub const MIN_GUARD_NS: u64 = 300_000;
