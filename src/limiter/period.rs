//! The period of a device's turns: the configured one
//! (`VGPU_SM_PERIOD_MS`, 100 ms by default), or a longer one that the
//! short steps of a container in turns there ask for on the node's SM
//! board (issue 29).
//!
//! In turns, a synchronised loop's step that meets another container's
//! window waits it out. A 90 ms window of 1 ms steps at 90 % beside a
//! busy 10 % container holds about 88 of them, so more than one step in
//! a hundred meets the other's window, and p99 is that wait: 3.40 ms
//! where the windows nest, 7.35 ms where they are placed end to end,
//! against twice the ideal, 2.25 (H200, runs 174-190). At 130 and 150
//! ms, placed, the window holds over 115 steps and p99 was 1.29-1.30 ms
//! (runs 194-195). A longer period is not right for every loop: 10 ms
//! steps at 90 % that meet a 13 ms window wait it out on top of their
//! own (p99 27-29 ms at 130 ms, against 22.25; at 100 ms 17.6-20.3), and
//! 0.1 ms steps fare as well at 100 ms. So a container in turns whose
//! loop's windows would hold some but too few of its steps asks for the
//! period at which they hold [`WINDOW_STEPS`], or [`LONGEST_NS`] where
//! that is longer and a window there holds enough; every busy container
//! on the device's board takes the longest period asked there (`following.rs`), and two in turns are then
//! placed end to end from the board (`tiling.rs`), so that one step a
//! period waits.
//!
//! A period set by `VGPU_SM_PERIOD_MS` stays as it is and asks for
//! nothing, and says so on the board: beside it, as beside a library from
//! before asks, nothing is lengthened, and a container alone on the board
//! or off it lengthens nothing for its own steps
//! (`following::asked_on_the_board`).
//! A writer of the board can lengthen a GPU's turns to [`LONGEST_NS`] and no more (the shares stay as they are, and
//! each window's wait grows by half at most), keep them at the configured
//! period, or move the windows once every 10 ms it raises its word.
#![forbid(unsafe_code)]

use vgpu_shm::layout::{DeviceEntry, TURNS_PAUSED};

use super::turns;

/// The longest period a device's turns take for steps: 150 ms.
pub const LONGEST_NS: u64 = 150_000_000;

/// The steps a window should hold: one in a hundred and more then waits
/// out another's window, with a margin for the windows' edges and a
/// container's first seconds. At 1 ms steps and 90 %, 130 ms held 115
/// (p99 1.30 ms, run 195); 140 ms held 125, and in one run of five a few
/// steps more than one in a hundred waited (p99 3.40 ms, run 203).
pub const WINDOW_STEPS: u64 = 135;

/// A window that holds this many steps or more asks for nothing: fewer
/// than one step in a hundred then waits out another's window already
/// (a 60 % loop of 0.5 ms steps, 120 to a window, stays at the
/// configured period, and its neighbours' turns with it).
pub const FEWEST_STEPS: u64 = 110;

/// The span over which a leader measures its container's steps: half a
/// second, so that the turns lengthen soon after they begin (each tick
/// until then, a step in ninety waits out another's window).
pub const SPAN_NS: u64 = 500_000_000;
/// The fewest synchronisations in a span for its steps to count.
pub const MIN_SYNCS: u64 = 20;
/// How long an ask holds after the last span that called for it: a span
/// paced, or cut short by a pause, does not shorten the turns at once.
pub const HOLD_NS: u64 = 3_000_000_000;

/// What one device's leader asks for, from its container's steps in
/// turns (`pacing::Pacing::tick` publishes it on the board).
#[derive(Debug, Default)]
pub struct Asking {
    /// The region's admitted GPU time and synchronisations when the span
    /// began, and when (0: no span open).
    admitted_ns: u64,
    syncs: u64,
    since_ns: u64,
    /// The period asked (ms, 0: none), and until when the ask holds.
    asked_ms: u32,
    until_ns: u64,
}

impl Asking {
    /// The period (ms) the container asks for now (0: none).
    pub fn asked_ms(&self) -> u32 {
        self.asked_ms
    }

    /// At each of the leader's ticks: the container's share `percent`,
    /// whether it takes turns (`in_turns`; not while its turns are paused
    /// for several processes) and has a limit of its own (a rest asks
    /// nothing). Closes a span of [`SPAN_NS`] in turns and asks for what
    /// its steps need ([`asked_ms`]; [`renewed_ms`] while an ask holds).
    pub fn tick(
        &mut self,
        entry: &DeviceEntry,
        percent: u32,
        in_turns: bool,
        limited: bool,
        now: u64,
    ) {
        if now >= self.until_ns {
            self.asked_ms = 0;
        }
        let (admitted, syncs) = (entry.admitted_ns(), entry.syncs());
        let paused = entry.turn_flag(TURNS_PAUSED);
        if !in_turns || paused || !limited || turns::period_is_explicit() {
            self.since_ns = 0;
            return;
        }
        if self.since_ns == 0 {
            (self.admitted_ns, self.syncs, self.since_ns) = (admitted, syncs, now);
            return;
        }
        if now.saturating_sub(self.since_ns) < SPAN_NS {
            return;
        }
        let steps = syncs.saturating_sub(self.syncs);
        let gpu = admitted.saturating_sub(self.admitted_ns);
        (self.admitted_ns, self.syncs, self.since_ns) = (admitted, syncs, now);
        if steps < MIN_SYNCS {
            return;
        }
        let ask = if self.asked_ms == 0 {
            asked_ms
        } else {
            renewed_ms
        };
        let asked = steadied(ask(percent, gpu / steps, turns::period_ns()), self.asked_ms);
        if asked != 0 {
            if asked != self.asked_ms {
                log::debug!(
                    "turns: steps of {:.2} ms at {percent} %: asking for a period of {asked} ms",
                    (gpu / steps) as f64 / 1e6
                );
            }
            self.asked_ms = asked;
            self.until_ns = now.saturating_add(HOLD_NS);
        }
    }
}

/// Sets the period of the container's turns on `entry` from the longest
/// asked on the device (`asked_ms`: its own ask and the board's,
/// [`chosen_ns`]), where monitors read it too (`vgpuctl status`). A
/// change marks the turns moved, so that no window that spans it is
/// judged as if it had run at one period.
pub fn choose(entry: &DeviceEntry, asked_ms: u32, now: u64) {
    let chosen = chosen_ns(asked_ms, turns::period_ns(), turns::period_is_explicit());
    if entry.turn_period_ns() == chosen {
        return;
    }
    let was = of(entry);
    entry.set_turn_period_ns(chosen);
    if was == chosen {
        return;
    }
    let anchor = entry.turn_anchor();
    if anchor != 0 {
        entry.move_turn(anchor, anchor, now);
    }
    log::debug!(
        "turns: the device's period is now {} ms",
        chosen / 1_000_000
    );
}

/// The period (ms) a container at `percent` in turns asks for, whose
/// loop spends `step_ns` of admitted GPU time between synchronisations, at
/// the configured `period` (ns): the one at which its window holds
/// [`WINDOW_STEPS`] steps, or [`LONGEST_NS`] where that is longer and a
/// window there still holds [`FEWEST_STEPS`], where its window holds fewer
/// than [`FEWEST_STEPS`] now; 0 otherwise (its steps are short enough, or
/// so long that each window holds too few of them for any period to
/// help: they wait out the other's window, which a shorter period keeps
/// short).
pub fn asked_ms(percent: u32, step_ns: u64, period: u64) -> u32 {
    asked_below(percent, step_ns, period, FEWEST_STEPS)
}

/// What an ask that holds asks on ([`asked_ms`]): until a window at the
/// configured period holds [`WINDOW_STEPS`], not [`FEWEST_STEPS`]. Steps
/// near the edge would otherwise ask and lapse by turns, and each change
/// of the period moves every window on the device: 0.55 ms steps at 60 %
/// asked 130 ms, measured 0.54 ms a span later and lapsed, and asked
/// again 10 s on (H200, run 207).
pub fn renewed_ms(percent: u32, step_ns: u64, period: u64) -> u32 {
    asked_below(percent, step_ns, period, WINDOW_STEPS)
}

/// [`asked_ms`], where a window at `period` holding `fewest` steps asks
/// nothing.
fn asked_below(percent: u32, step_ns: u64, period: u64, fewest: u64) -> u32 {
    let percent = u64::from(percent.clamp(1, 100));
    if step_ns == 0 {
        return 0;
    }
    let window = period / 100 * percent;
    if window / step_ns >= fewest {
        return 0;
    }
    let want = u128::from(step_ns) * u128::from(WINDOW_STEPS) * 100 / u128::from(percent);
    let longest = u128::from(LONGEST_NS);
    if want > longest
        && longest * u128::from(percent) / 100 / u128::from(step_ns) < u128::from(FEWEST_STEPS)
    {
        return 0;
    }
    // (At most 150 ms: fits.)
    u32::try_from(want.min(longest).div_ceil(1_000_000)).unwrap_or(0)
}

/// An ask (ms) from a span, given the one that holds: 10 ms steps up,
/// and the one that holds kept where the new one is at most 10 ms
/// shorter. Each change of a device's period moves every window there,
/// and steps of 1.00 or 1.01 ms asked 139 and 140 ms by turns (H200, run
/// 197).
pub fn steadied(asked: u32, holding: u32) -> u32 {
    let asked = asked.div_ceil(10).saturating_mul(10);
    if asked != 0 && asked <= holding && asked.saturating_add(10) >= holding {
        holding
    } else {
        asked
    }
}

/// The period (ns) of the turns on a device where the longest period
/// asked there, this container's or another's, is `asked_ms` (0: none):
/// that, within the configured one and [`LONGEST_NS`]; the configured one
/// where `VGPU_SM_PERIOD_MS` set it (`explicit`).
pub fn chosen_ns(asked_ms: u32, configured: u64, explicit: bool) -> u64 {
    if explicit {
        return configured;
    }
    (u64::from(asked_ms) * 1_000_000).clamp(configured, LONGEST_NS.max(configured))
}

/// The period (ns) of the container's turns on `entry`'s device: what its
/// leader chose ([`chosen_ns`], `DeviceEntry::turn_period_ns`), bounded as
/// [`chosen_ns`] bounds it (anyone who maps the region can write it), or
/// the configured one.
pub fn of(entry: &DeviceEntry) -> u64 {
    let configured = turns::period_ns();
    if turns::period_is_explicit() {
        return configured;
    }
    entry
        .turn_period_ns()
        .clamp(configured, LONGEST_NS.max(configured))
}

/// Whether `entry`'s turns run longer than the configured period: some
/// container's steps there asked for it.
pub fn lengthened(entry: &DeviceEntry) -> bool {
    of(entry) > turns::period_ns()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const P: u64 = turns::PERIOD_NS;

    #[test]
    fn steps_a_window_holds_too_few_of_ask_for_a_period_that_holds_enough() {
        // 1 ms steps at 90 %: 90 to a window of 100 ms; 135 at 150 ms.
        assert_eq!(asked_ms(90, MS, P), 150);
        // The rest's share beside it (10 %) holds 10: no period helps.
        assert_eq!(asked_ms(10, MS, P), 0);
        // 0.1 ms steps hold plenty; 10 ms steps too few for any period.
        assert_eq!(asked_ms(90, MS / 10, P), 0);
        assert_eq!(asked_ms(30, MS / 10, P), 0);
        assert_eq!(asked_ms(90, 10 * MS, P), 0);
        // 0.3 ms steps at 30 %: 100 to a window; 135 at 135 ms. 0.5 ms
        // steps at 60 %: 120, enough.
        assert_eq!(asked_ms(30, 300_000, P), 135);
        assert_eq!(asked_ms(60, 500_000, P), 0);
        // 135 would take over 150 ms: 150, where that holds 110 (1 ms at
        // 80 % holds 120 there, at 73 % 109.5: nothing).
        assert_eq!(asked_ms(80, MS, P), 150);
        assert_eq!(asked_ms(74, MS, P), 150);
        assert_eq!(asked_ms(73, MS, P), 0);
        // Nothing known, or limits no region should hold.
        assert_eq!(asked_ms(90, 0, P), 0);
        assert_eq!(asked_ms(0, MS, P), 0);
        assert_eq!(asked_ms(u32::MAX, MS, P), 135);
        assert_eq!(asked_ms(90, u64::MAX, P), 0);
        // A configured period that holds enough asks nothing.
        assert_eq!(asked_ms(90, MS, 150 * MS), 0);
    }

    #[test]
    fn an_ask_that_holds_goes_on_until_a_window_holds_enough() {
        // 0.545 ms steps at 60 %: 110 to a window at 100 ms, enough to
        // ask nothing; an ask that holds goes on, to 135 to a window.
        assert_eq!(asked_ms(60, 545_000, P), 0);
        assert_eq!(renewed_ms(60, 545_000, P), 123);
        assert_eq!(steadied(renewed_ms(60, 545_000, P), 130), 130);
        assert_eq!(renewed_ms(60, 440_000, P), 0);
        // (Beyond that, as `asked_ms`.)
        assert_eq!(renewed_ms(90, MS, P), 150);
        assert_eq!(renewed_ms(90, 10 * MS, P), 0);
        let (r, i) = crate::limiter::bucket::tests::entry(60);
        let e = r.device(i);
        let mut a = Asking::default();
        let s = 1_000_000_000_000u64;
        a.tick(e, 60, true, true, s);
        run(e, 800, 800 * 570_000);
        a.tick(e, 60, true, true, s + SPAN_NS);
        assert_eq!(a.asked_ms(), 130);
        // Spans of 0.54 ms steps long after: the ask goes on.
        for k in 2..20 {
            run(e, 800, 800 * 540_000);
            a.tick(e, 60, true, true, s + k * SPAN_NS);
            assert_eq!(a.asked_ms(), 130, "span {k}");
        }
        // Steps of 0.44 ms (136 to a window): it lapses after its hold.
        for k in 20..40 {
            run(e, 800, 800 * 440_000);
            a.tick(e, 60, true, true, s + k * SPAN_NS);
        }
        assert_eq!(a.asked_ms(), 0);
    }

    #[test]
    fn asks_go_by_10_ms_and_a_little_shorter_one_keeps_the_last() {
        assert_eq!(steadied(139, 0), 140);
        assert_eq!(steadied(141, 140), 150);
        assert_eq!(steadied(131, 140), 140);
        assert_eq!(steadied(111, 140), 120);
        assert_eq!(steadied(0, 140), 0);
        assert_eq!(steadied(u32::MAX, 0), u32::MAX);
    }

    #[test]
    fn a_device_takes_the_longest_asked_within_its_bounds_unless_set() {
        assert_eq!(chosen_ns(0, P, false), P);
        assert_eq!(chosen_ns(139, P, false), 139 * MS);
        assert_eq!(chosen_ns(50, P, false), P);
        assert_eq!(chosen_ns(1000, P, false), LONGEST_NS);
        assert_eq!(chosen_ns(u32::MAX, P, false), LONGEST_NS);
        // Set by VGPU_SM_PERIOD_MS: as set, shorter or longer.
        assert_eq!(chosen_ns(139, 20 * MS, true), 20 * MS);
        assert_eq!(chosen_ns(139, 300 * MS, true), 300 * MS);
    }

    /// `steps` synchronisations over `gpu_ns` of admitted GPU time.
    fn run(e: &DeviceEntry, steps: u64, gpu_ns: u64) {
        e.add_admitted_ns(gpu_ns);
        for _ in 0..steps {
            e.add_sync_wait_ns(1);
        }
    }

    #[test]
    fn a_leader_asks_from_a_span_of_steps_in_turns_and_the_ask_holds_a_while() {
        let (r, i) = crate::limiter::bucket::tests::entry(90);
        let e = r.device(i);
        let mut a = Asking::default();
        let s = 1_000_000_000_000u64;
        // 1 ms steps at 90 %, in turns: asked after a whole span.
        a.tick(e, 90, true, true, s);
        run(e, 880, 880 * MS);
        a.tick(e, 90, true, true, s + SPAN_NS / 2);
        assert_eq!(a.asked_ms(), 0);
        a.tick(e, 90, true, true, s + SPAN_NS);
        assert_eq!(a.asked_ms(), 150);
        // Paced for a while: the ask holds, then goes.
        a.tick(e, 90, false, true, s + 2 * SPAN_NS);
        assert_eq!(a.asked_ms(), 150);
        a.tick(e, 90, false, true, s + SPAN_NS + HOLD_NS);
        assert_eq!(a.asked_ms(), 0);
        // Too few synchronisations (a loop that waits elsewhere), 0.1 ms
        // steps, or a rest: nothing.
        let t = s + 10 * SPAN_NS;
        a.tick(e, 90, true, true, t);
        run(e, MIN_SYNCS - 1, 10 * MS);
        a.tick(e, 90, true, true, t + SPAN_NS);
        assert_eq!(a.asked_ms(), 0);
        run(e, 8000, 800 * MS);
        a.tick(e, 90, true, true, t + 2 * SPAN_NS);
        assert_eq!(a.asked_ms(), 0);
        let mut rest = Asking::default();
        rest.tick(e, 10, true, false, t);
        run(e, 880, 880 * MS);
        rest.tick(e, 10, true, false, t + SPAN_NS);
        assert_eq!(rest.asked_ms(), 0);
    }

    #[test]
    fn paused_turns_ask_for_nothing() {
        let (r, i) = crate::limiter::bucket::tests::entry(90);
        let e = r.device(i);
        e.set_turn_flag(TURNS_PAUSED, true);
        let mut a = Asking::default();
        let s = 1_000_000_000_000u64;
        a.tick(e, 90, true, true, s);
        run(e, 880, 880 * MS);
        a.tick(e, 90, true, true, s + SPAN_NS);
        assert_eq!(a.asked_ms(), 0);
    }

    #[test]
    fn a_chosen_period_marks_the_turns_moved_once() {
        let (r, i) = crate::limiter::bucket::tests::entry(90);
        let e = r.device(i);
        e.choose_turn_anchor(7 * P);
        choose(e, 0, 5);
        assert_eq!((of(e), e.turn_moved_ns(), e.turn_period_ns()), (P, 0, P));
        choose(e, 139, 6);
        assert_eq!(
            (of(e), e.turn_moved_ns(), e.turn_anchor()),
            (139 * MS, 6, 7 * P)
        );
        choose(e, 139, 7);
        assert_eq!(e.turn_moved_ns(), 6);
        choose(e, 0, 8);
        assert_eq!((of(e), e.turn_moved_ns()), (P, 8));
    }

    #[test]
    fn a_region_s_period_is_used_within_its_bounds_only() {
        let (r, i) = crate::limiter::bucket::tests::entry(90);
        let e = r.device(i);
        assert_eq!(of(e), P);
        assert!(!lengthened(e));
        e.set_turn_period_ns(139 * MS);
        assert_eq!(of(e), 139 * MS);
        assert!(lengthened(e));
        // Anyone's writes: too long, too short.
        e.set_turn_period_ns(u64::MAX);
        assert_eq!(of(e), LONGEST_NS);
        e.set_turn_period_ns(1);
        assert_eq!(of(e), P);
    }
}
