//! Judging one window of the turns (pure): from what its probes measured
//! and what the region and this process knew before, the fill, the
//! covered streak, what the container leaves unspent and whether its
//! turns move. `probes.rs` gathers the inputs and carries the verdict out.
#![forbid(unsafe_code)]

use super::cut;
use super::fill;
use super::turns::{self, Move, Probe};

/// What a window's judging reads.
#[derive(Clone, Copy, Debug)]
pub struct Window<'a> {
    /// The anchor the window's probes ran under, and the period it began.
    pub anchor: u64,
    pub period: u64,
    /// The length of the device's period (`period::of`).
    pub period_ns: u64,
    /// Its probes, in the order they opened.
    pub probes: &'a [Probe],
    /// The turns' anchor now, and when they last moved (the region's).
    pub anchor_now: u64,
    pub moved_ns: u64,
    /// The container is alone on the device (its leader's word).
    pub alone: bool,
    /// A probe of the container ran beside another context lately
    /// (before this window).
    pub shared: bool,
    /// The container's fill, cut and limit; the controller's scale.
    pub fill_milli: u64,
    pub cut_ns: u64,
    pub percent: u32,
    pub rate_scale_milli: u32,
    /// This process's covered streak, and whether the last window it
    /// judged opened beside another.
    pub covered: u32,
    pub late: bool,
    /// The last window this process judged had another's inside it
    /// (`turns::nested_until_ns`).
    pub nested: bool,
    /// The last window this process judged ran on from a clear start
    /// (`turns::ran_on_from_a_clear_start`).
    pub ran_on: bool,
    /// Every other busy container on the device takes the rest (the
    /// leader's word, `rest_beside_ns`): windows are looked for inside
    /// this one's at a few ms lost (beside a limited one, `beside_limited`,
    /// at a whole window's), and one that ran on moves earlier by what it
    /// lost at once.
    pub beside_rest: bool,
    /// The container has a limit, and a busy one with a limit is on the
    /// board beside it (the leader's word, `limited_beside_ns`): only then
    /// does a whole window inside this one move it past.
    pub beside_limited: bool,
    /// The device's leader places the container's turns from the board
    /// (`tiling.rs`): the window does not move, and one that ran on
    /// leaves time unspent as one that opened late would.
    pub tiled: bool,
    /// The board leaves room after the placed window for its end
    /// (`tiling::roomy`): it keeps nothing back for it.
    pub roomy: bool,
    /// Picks the factor of a move later (`turns::verdict`).
    pub random: u64,
}

/// Why a window changed only what it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Alone on the device: the fill only, streak and cut cleared.
    Alone,
    /// The turns moved while it ran: the fill only.
    Moved,
    /// Judged in full.
    Judged,
}

/// What to do after a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub reason: Reason,
    /// The fill the window measured, and the container's new fill.
    pub window_fill: Option<u64>,
    pub fill_milli: u64,
    /// Note in the region that the container met another context.
    pub note_shared: bool,
    /// The new covered streak and lateness (this process's).
    pub covered: u32,
    pub late: bool,
    /// This window had another's inside it.
    pub nested: bool,
    /// This window ran on from a clear start.
    pub ran_on: bool,
    /// What the container leaves unspent of each share.
    pub cut_ns: u64,
    /// Where the turns move, if they do.
    pub step: Option<Move>,
}

/// Judges a window (what `probes.rs` used to decide inline).
pub fn judge(w: &Window) -> Verdict {
    // (The fill is the workload's: a window beside another measures
    // nothing and leaves it as it was.)
    let window_fill = fill::window_fill_milli(w.probes);
    let fill_milli = window_fill.map_or(w.fill_milli, |f| fill::next_fill_milli(w.fill_milli, f));
    let mut v = Verdict {
        reason: Reason::Judged,
        window_fill,
        fill_milli,
        note_shared: false,
        covered: w.covered,
        late: w.late,
        nested: false,
        ran_on: w.ran_on,
        cut_ns: w.cut_ns,
        step: None,
    };
    if w.alone {
        // Nothing of another container is on the device: what a probe
        // lost went to this process's own work on another stream (two
        // threads on two streams: windows moved, and up to a quarter of
        // each share went unspent on an H200, run 74).
        return Verdict {
            reason: Reason::Alone,
            covered: 0,
            late: false,
            ran_on: false,
            cut_ns: 0,
            ..v
        };
    }
    v.note_shared = w.probes.iter().any(Probe::beside_another);
    if w.anchor_now != w.anchor || w.moved_ns >= w.period {
        // The turns moved while this window ran: its probes describe
        // neither place, and it is often cut short. Taken as a window
        // that met no one, it started the covered streak anew after every
        // move beside a container that takes no turns (run 71).
        v.reason = Reason::Moved;
        return v;
    }
    let share = turns::share_ns(
        w.percent,
        fill::turn_scale_milli(w.rate_scale_milli, fill_milli),
        w.period_ns,
    );
    v.covered = turns::next_streak(w.covered, w.probes, share, w.period_ns);
    // (Placed from the board, the container has neighbours in turns,
    // whether or not its probes met them: a rest's deep queue hid a
    // 90 % container's tail from its probes, it left nothing unspent, and
    // its last kernels ran on into the 90 % window one period in four
    // or so, a step waiting a time slice each time: p99 3.40 ms where
    // beside a limited 10 % container, which kept the guard, it was
    // 1.05; H200, run 196.)
    let shared = w.shared || v.note_shared || w.tiled;
    v.cut_ns = cut::next_cut(
        w.cut_ns,
        (share, w.period_ns),
        w.probes,
        v.covered,
        shared,
        cut::Placed::of(w.tiled, w.roomy),
    );
    v.late = w.probes.first().is_some_and(Probe::beside_another);
    v.step = turns::verdict(w.probes, w.random, w.late, w.period_ns);
    v.ran_on = turns::ran_on_from_a_clear_start(w.probes);
    if v.ran_on && (w.beside_rest || w.ran_on) {
        // The other does not yield to this window's tail: a rest's queue
        // hides it, and so does a limited neighbour's queue of long
        // kernels from its probes. 0.5 ms earlier every other period left
        // 50 % of 0.1 ms steps running into a rest for 4 s (H200, run
        // 162), and PyTorch steps at 30 % into a 60 % container's 1 ms
        // kernels for 4 s (p99 2.48 ms, run 165). Beside a rest at once,
        // beside a limited one once the 0.5 ms did not clear it (that one
        // had its window to move): as far as what the tail lost.
        let lost = turns::trailing_lost_ns(w.probes);
        let most = w.period_ns / 10;
        v.step = Some(Move::Earlier(lost.clamp(turns::min_move_ns(), most)));
    }
    if v.step.is_none() {
        // Another window inside this one, twice in a row (the other
        // container had a window to move out itself, as the one that
        // opened late): this one moves past it. Beside rests alone, whose
        // deep queues hide this window from their probes, at a few ms
        // lost; beside a limited neighbour, only at a whole window's worth
        // (`turns::NESTED_BESIDE_LIMITED_PCT`), so that 10 + 20 + 30 + 40
        // settle as they are.
        let least = match (w.beside_rest, w.beside_limited) {
            (true, _) => Some(turns::min_lead_ns()),
            (false, true) => Some(w.period_ns / 100 * turns::NESTED_BESIDE_LIMITED_PCT),
            (false, false) => None,
        };
        let nested = least.and_then(|least| turns::nested_until_ns(w.probes, least));
        v.nested = nested.is_some() && !w.nested;
        v.step = nested
            .filter(|_| w.nested)
            .map(|ns| Move::Later(ns.clamp(turns::min_move_ns(), turns::max_move_ns(w.period_ns))));
    }
    if w.tiled {
        // Its place is the board's.
        v.step = None;
        v.nested = false;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::turns::tests::{clean, shared};

    const MS: u64 = 1_000_000;
    const P: u64 = turns::PERIOD_NS;

    fn window(probes: &[Probe]) -> Window<'_> {
        Window {
            anchor: 7 * P,
            period: 20 * P,
            period_ns: P,
            probes,
            anchor_now: 7 * P,
            moved_ns: 0,
            alone: false,
            shared: false,
            fill_milli: 1000,
            cut_ns: 0,
            percent: 30,
            rate_scale_milli: 1000,
            covered: 0,
            late: false,
            nested: false,
            ran_on: false,
            beside_rest: true,
            beside_limited: false,
            tiled: false,
            roomy: false,
            random: 0,
        }
    }

    #[test]
    fn a_window_placed_from_the_board_never_moves_and_cuts_its_tail_instead() {
        let late = [shared(3, 8), clean(3), clean(3)];
        let ran_on = [clean(3), clean(3), shared(3, 3), shared(3, 3)];
        let nested = [clean(3), shared(3, 30), clean(3)];
        for probes in [&late[..], &ran_on, &nested] {
            let free = judge(&Window {
                nested: true,
                ..window(probes)
            });
            assert!(free.step.is_some(), "{probes:?}");
            let placed = judge(&Window {
                nested: true,
                tiled: true,
                ..window(probes)
            });
            assert_eq!((placed.step, placed.nested), (None, false), "{probes:?}");
        }
        let placed = judge(&Window {
            tiled: true,
            ..window(&ran_on)
        });
        assert_eq!(placed.cut_ns, turns::trailing_lost_ns(&ran_on) / 2);
        // Clear from end to end, its probes never having met anyone (a
        // rest's deep queue hides the neighbour's tail): placed, it still
        // keeps the guard.
        let clear = [clean(3), clean(3), clean(3)];
        assert_eq!(judge(&window(&clear)).cut_ns, 0);
        let placed = judge(&Window {
            tiled: true,
            ..window(&clear)
        });
        assert_eq!(placed.cut_ns, crate::limiter::cut::guard_ns());
    }

    #[test]
    fn a_window_with_another_inside_it_twice_moves_past_it() {
        // Clear at both ends, 24 ms lost in its middle (run 158).
        let probes = [clean(3), clean(3), shared(3, 24), shared(3, 4), clean(3)];
        let first = judge(&window(&probes));
        assert_eq!(first.step, None);
        assert!(first.nested);
        // The other had its window to move out; it did not.
        let again = judge(&Window {
            nested: true,
            ..window(&probes)
        });
        assert!(!again.nested);
        assert_eq!(
            again.step,
            Some(Move::Later(3_100_000 * 2 + 27 * MS + 7 * MS))
        );
        // Moved out: the next window is clear, and nothing moves.
        let clear = [clean(3), clean(3), clean(3)];
        let after = judge(&Window {
            nested: true,
            ..window(&clear)
        });
        assert_eq!((after.step, after.nested), (None, false));
        // A little lost in its middle (a host's hiccup) is no window.
        let noise = [clean(3), shared(3, 2), clean(3)];
        let v = judge(&Window {
            nested: true,
            ..window(&noise)
        });
        assert_eq!((v.step, v.nested), (None, false));
        // One that opened late, or ran on, is judged as before.
        let late = [shared(3, 24), clean(3), clean(3)];
        assert!(matches!(judge(&window(&late)).step, Some(Move::Later(_))));
        assert!(!judge(&window(&late)).nested);
        // One that ran on beside a rest moves earlier by what its tail
        // lost, not by 0.5 ms.
        let ran_on = [clean(3), clean(3), shared(3, 4)];
        assert_eq!(judge(&window(&ran_on)).step, Some(Move::Earlier(4 * MS)));
        let limited = Window {
            beside_rest: false,
            ..window(&ran_on)
        };
        let first = judge(&limited);
        assert_eq!(first.step, Some(Move::Earlier(turns::min_move_ns())));
        assert!(first.ran_on);
        // Beside a limited one, the 0.5 ms did not clear it: as far as
        // what the tail lost (run 165).
        let again = Window {
            ran_on: first.ran_on,
            ..limited
        };
        assert_eq!(judge(&again).step, Some(Move::Earlier(4 * MS)));
        // One that ended clear forgets it; so does a window alone.
        let clear = [clean(3), clean(3), clean(3)];
        assert!(
            !judge(&Window {
                ran_on: true,
                ..window(&clear)
            })
            .ran_on
        );
        let alone = Window {
            alone: true,
            ..again
        };
        assert!(!judge(&alone).ran_on);
        // Beside limited neighbours only, 24 ms lost is no whole window:
        // nothing new.
        let less = [clean(3), clean(3), shared(3, 20), shared(3, 4), clean(3)];
        let limited = Window {
            nested: true,
            beside_rest: false,
            beside_limited: true,
            ..window(&less)
        };
        assert_eq!(
            (judge(&limited).step, judge(&limited).nested),
            (None, false)
        );
    }

    #[test]
    fn a_limited_neighbour_s_whole_window_inside_this_one_twice_moves_it_past() {
        // 0.1 ms steps at 30 % beside a 60 % container: seven clear
        // probes, then one that crawled through the other's window, then
        // the window's clear tail (H200, run 171).
        let probes = [
            clean(3),
            clean(3),
            clean(3),
            clean(3),
            clean(3),
            clean(3),
            clean(3),
            shared(3, 58),
            clean(1),
        ];
        let limited = Window {
            beside_rest: false,
            beside_limited: true,
            ..window(&probes)
        };
        let first = judge(&limited);
        assert_eq!(first.step, None);
        assert!(first.nested);
        // Beside a process off the board (without vgpu), or as a rest,
        // nothing new.
        let unseen = Window {
            nested: true,
            beside_limited: false,
            ..limited
        };
        assert_eq!((judge(&unseen).step, judge(&unseen).nested), (None, false));
        let again = judge(&Window {
            nested: true,
            ..limited
        });
        assert_eq!(
            again.step,
            Some(Move::Later(
                turns::max_move_ns(P).min(7 * 3_100_000 + 61 * MS)
            ))
        );
    }

    #[test]
    fn a_window_that_met_no_one_stays_and_measures_its_fill() {
        let probes = [clean(3), clean(3), clean(3)];
        let v = judge(&window(&probes));
        assert_eq!(v.reason, Reason::Judged);
        assert_eq!(v.step, None);
        assert!(!v.note_shared && !v.late);
        assert_eq!((v.covered, v.cut_ns), (0, 0));
        assert!(v.window_fill.is_some());
    }

    #[test]
    fn a_window_that_opened_beside_another_moves_later_and_notes_it() {
        let probes = [shared(3, 5), clean(3), clean(3)];
        let v = judge(&window(&probes));
        assert!(v.note_shared && v.late);
        assert!(matches!(v.step, Some(Move::Later(ns)) if ns > 0), "{v:?}");
        // Its fill is what the clean probes said, not the lost time.
        assert_eq!(v.fill_milli, 1000.min(v.fill_milli));
    }

    #[test]
    fn alone_a_window_keeps_only_its_fill() {
        let probes = [shared(3, 5), shared(3, 5)];
        let w = Window {
            alone: true,
            covered: 4,
            late: true,
            cut_ns: 2 * MS,
            ..window(&probes)
        };
        let v = judge(&w);
        assert_eq!(v.reason, Reason::Alone);
        assert_eq!((v.covered, v.late, v.cut_ns, v.step), (0, false, 0, None));
        assert!(!v.note_shared);
    }

    #[test]
    fn a_window_during_which_the_turns_moved_changes_nothing_but_the_fill() {
        let probes = [shared(3, 5), shared(3, 5)];
        for w in [
            Window {
                anchor_now: 8 * P,
                ..window(&probes)
            },
            Window {
                moved_ns: 20 * P,
                ..window(&probes)
            },
        ] {
            let w = Window {
                covered: 3,
                late: true,
                cut_ns: MS,
                ..w
            };
            let v = judge(&w);
            assert_eq!(v.reason, Reason::Moved);
            assert!(v.note_shared);
            assert_eq!((v.covered, v.late, v.cut_ns, v.step), (3, true, MS, None));
        }
    }

    #[test]
    fn covered_windows_build_a_streak_and_then_leave_nothing_unspent() {
        let probes = [shared(3, 5), shared(3, 5), shared(3, 5)];
        let mut w = Window {
            cut_ns: 2 * MS,
            shared: true,
            ..window(&probes)
        };
        let mut last = None;
        for _ in 0..=turns::COVERED_STREAK + 1 {
            let v = judge(&w);
            w.covered = v.covered;
            w.late = v.late;
            w.cut_ns = v.cut_ns;
            last = Some(v);
        }
        let v = last.unwrap();
        assert!(v.covered > turns::COVERED_STREAK, "{v:?}");
        assert_eq!(v.cut_ns, 0, "{v:?}");
    }
}
