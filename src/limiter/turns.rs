//! Turns on the shared clock: containers that share a GPU run their
//! compute in windows that do not overlap (pure: no clock, no driver).
//!
//! Contexts of different processes time-slice, and whenever two have
//! work at once the switches cost about 9 % of the device: two busy
//! contexts get 0.90 of it between them, so no split of the time gives
//! two 50 % containers 0.47 each (docs/benchmarks.md, runs 13 and 38).
//! Run in turns, 50 ms each in every 100 ms, the same two got 0.987
//! (run 38). So a container with an SM limit spends its share of each
//! period at once, from the start of its window, and then waits for the
//! next period: the bucket's schedule may run ahead only to the end of
//! the current period, and a share not spent in its period is gone.
//!
//! Containers share nothing, but all of them read the same
//! `CLOCK_MONOTONIC`. Each one's windows open at its anchor plus whole
//! periods; a new container picks its anchor at random, and moves it
//! later when its window opened while another context still ran: its
//! first probe (about 3 ms of its own launches, timed with events) took
//! longer than the launches cost, because the other context's slices ran
//! in between. It moves by what the leading probes lost ([`verdict`]), so
//! it lands where the other's window ends. A container whose window
//! opened on an idle GPU stays, or moves a little earlier if it ran into
//! the next window: the one that came second moves the most.
//!
//! Windows of shares that sum to the whole period leave no room: when one
//! runs into the next, the two time-slice, each loses time, and each then
//! runs into the next one in turn. So a container whose window opened
//! late and ran into another's leaves that much of its share unspent for
//! a while (`cut::next_cut`) until its windows end clear. A window ends where
//! its share does, or one launch later: the bucket cuts the last lease of
//! a window to what is left (`bucket::admit`).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The default period of the turns: every container gets its share of
/// each one. Long enough for a 10 % container to run several 1 ms kernels
/// in its window and close a probe there, short enough that every second
/// holds ten. `VGPU_SM_PERIOD_MS` sets another ([`set_period_ms`]);
/// containers that share a GPU must use the same.
pub const PERIOD_NS: u64 = vgpu_shm::layout::TURN_PERIOD_NS;
/// The periods `VGPU_SM_PERIOD_MS` may set (ms).
pub const PERIOD_MS_RANGE: std::ops::RangeInclusive<u64> = 10..=1000;

/// This process's period (set once at start from the configuration).
static PERIOD: AtomicU64 = AtomicU64::new(PERIOD_NS);

/// Whether `VGPU_SM_PERIOD_MS` set it: then no neighbour's steps
/// lengthen it (`period.rs`).
static EXPLICIT: AtomicBool = AtomicBool::new(false);

/// The configured period of the turns in this process (a device's turns
/// may run at a longer one: `period::of`).
pub fn period_ns() -> u64 {
    PERIOD.load(Ordering::Relaxed)
}

/// Whether the period was set by `VGPU_SM_PERIOD_MS`.
pub fn period_is_explicit() -> bool {
    EXPLICIT.load(Ordering::Relaxed)
}

/// Sets the period of the turns (`VGPU_SM_PERIOD_MS`), within
/// [`PERIOD_MS_RANGE`].
pub fn set_period_ms(ms: u64) {
    let ms = ms.clamp(*PERIOD_MS_RANGE.start(), *PERIOD_MS_RANGE.end());
    PERIOD.store(ms * 1_000_000, Ordering::Relaxed);
    EXPLICIT.store(true, Ordering::Relaxed);
}
/// The period the probes, slacks, leads and guards below were measured
/// at; at shorter periods they shrink with it ([`scaled`]), so that a
/// 10 % window of a 10 ms period still closes probes and moves.
const TUNED_PERIOD_NS: u64 = 100_000_000;

/// `ns`, a figure tuned at a 100 ms period, at this process's period:
/// in proportion below 100 ms, as it is above.
pub fn scaled(ns: u64) -> u64 {
    scaled_at(ns, period_ns())
}

/// [`scaled`] at `period` (ns).
pub fn scaled_at(ns: u64, period: u64) -> u64 {
    let scaled =
        u128::from(ns) * u128::from(period.min(TUNED_PERIOD_NS)) / u128::from(TUNED_PERIOD_NS);
    // (At most `ns`: fits.)
    u64::try_from(scaled).unwrap_or(ns)
}

/// A probe closes once its launches cost this much GPU time: more than a
/// time slice (about 2.5 ms on an H200), so another context that has
/// work shows in it whatever the kernels' length ([`probe_ns`]).
pub const PROBE_NS: u64 = 3_000_000;

/// The GPU time a probe of a container at `percent` closes at: [`PROBE_NS`],
/// or half its window where that is shorter (1 ms for a 10 % window of a
/// 20 ms period), so that a short window still closes two probes, and one
/// that runs on into the next window shows it. Not
/// shorter where the window allows: a probe of one 1 ms kernel met the
/// other context's slices only every other time, and two 50 % windows
/// at a 20 ms period then each looked clear at its start and moved
/// earlier, time-slicing for good.
pub fn probe_ns(percent: u32, period: u64) -> u64 {
    let window = period / 100 * u64::from(percent.min(100));
    PROBE_NS.min(window / 2).max(MIN_PROBE_NS)
}

/// The shortest probe.
pub const MIN_PROBE_NS: u64 = 100_000;

/// A probe ran beside another context when its timing exceeds its
/// launches' cost by more than [`slack_ns`], and by more than
/// [`SHARE_PCT`] of the cost: a host that feeds the GPU a little late
/// (9 % idle for a host-bound stream of 0.05 ms kernels) or a
/// neighbour's last kernel finishing as the window opens is not a reason
/// to move.
pub const SLACK_NS: u64 = 1_000_000;
pub const SHARE_PCT: u64 = 30;
/// The least slack at any period: more than a switch between contexts
/// (about 0.15 ms on an H100, gpu-tests/switchcost.cu).
pub const MIN_SLACK_NS: u64 = 250_000;

/// [`SLACK_NS`] at this process's period.
pub fn slack_ns() -> u64 {
    scaled(SLACK_NS).max(MIN_SLACK_NS)
}

/// The most a window moves at once: half the `period`.
pub fn max_move_ns(period: u64) -> u64 {
    period / 2
}
/// Less than this lost at a window's start is left to the window before
/// to mend, by leaving a little of its share unspent ([`min_lead_ns`]).
pub const MIN_LEAD_NS: u64 = 3_000_000;

/// [`MIN_LEAD_NS`] at this process's period.
pub fn min_lead_ns() -> u64 {
    scaled(MIN_LEAD_NS)
}

/// The least a window moves ([`min_move_ns`]): also what is added to
/// what the probes lost, so that the window lands just clear of the other
/// one.
pub const MIN_MOVE_NS: u64 = 500_000;
/// The least move and guard at any period: about a switch between
/// contexts.
pub const MIN_STEP_NS: u64 = 100_000;

/// [`MIN_MOVE_NS`] at this process's period.
pub fn min_move_ns() -> u64 {
    scaled(MIN_MOVE_NS).max(MIN_STEP_NS)
}

/// The start of the period (of `period` ns) that holds `now`, for turns
/// anchored at `anchor`.
pub fn period_start(anchor: u64, now: u64, period: u64) -> u64 {
    let period = period.max(1);
    if now >= anchor {
        now - (now - anchor) % period
    } else {
        let back = (anchor - now).div_ceil(period).saturating_mul(period);
        anchor.saturating_sub(back)
    }
}

/// The first period start at which a schedule standing at `from` may
/// spend again: the period that `from` falls in (a schedule at the end
/// of one period is at the start of the next).
pub fn next_open(anchor: u64, from: u64, period: u64) -> u64 {
    period_start(anchor, from.saturating_sub(period), period) + period
}

/// The GPU time a container at `percent` (and the controller's
/// `scale_milli`) may spend in each `period`.
pub fn share_ns(percent: u32, scale_milli: u32, period: u64) -> u64 {
    // (Clamped: the region's values may be anyone's.)
    let percent = u64::from(percent.min(100));
    let scale = u64::from(scale_milli.min(4000));
    period.saturating_mul(percent * scale) / 100_000
}

/// Covered windows in a row (every probe beside another context) after
/// which the container stops leaving time unspent for them: whatever
/// covers its windows takes no turns (a container without a limit), and
/// unspent time would only go to it.
pub const COVERED_STREAK: u32 = 6;

/// [`COVERED_STREAK`] at this process's period: as many windows as take
/// 600 ms, as at 100 ms. Two 50 % containers at a 20 ms period that
/// time-slice cover each other's windows, and six windows (120 ms) left
/// them too little time to part before both stopped leaving time unspent.
pub fn covered_streak() -> u32 {
    covered_streak_at(period_ns())
}

/// [`covered_streak`] at `period` (ns).
pub fn covered_streak_at(period: u64) -> u32 {
    let periods = (TUNED_PERIOD_NS / period.max(1)).max(1);
    COVERED_STREAK.saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX))
}

/// Whether the window opened on an idle GPU but ran on into another
/// context's window: there may be room before it, and there is none
/// after it.
pub fn ran_on_from_a_clear_start(probes: &[Probe]) -> bool {
    probes.first().is_some_and(|p| !p.beside_another()) && trailing_lost_ns(probes) > 0
}

/// Covered windows in a row after a window with `probes` (`streak` before
/// it) of a container whose share is `share_ns`: one more after a covered
/// window, as many after a nearly covered one, none after any other.
pub fn next_streak(streak: u32, probes: &[Probe], share_ns: u64, period: u64) -> u32 {
    if covered(probes) {
        streak.saturating_add(1)
    } else if nearly_covered(probes, share_ns, period) {
        streak
    } else {
        0
    }
}

/// A window that takes less than this is not one of two that cover each
/// other: two containers that take turns cover each other's windows from
/// end to end only when both windows stretch over nearly the whole
/// period, time-slicing.
pub fn short_window_ns(period: u64) -> u64 {
    period / 10 * 9
}

/// Whether all the window's probes but one ran beside another context,
/// three probes at least, and the window is short ([`short_window_ns`]):
/// its whole share (`share_ns`) at the stretch its probes ran at, so that
/// probes dropped at host pauses do not make a long window look short.
/// Beside a container that takes no turns, a probe of a 30 % container's
/// window now and then runs while that one waits for its host: such a
/// window started the covered streak anew, and the container went back to
/// leaving up to a quarter of its share unspent, all of which went to the
/// other (0.244-0.259 for 1 ms kernels on an H200, runs 63-70). A long
/// window may be one of two that cover each other: there a probe in the
/// clear is what stops two 50 % containers from time-slicing for good (a
/// simulated pair did, run 61).
pub fn nearly_covered(probes: &[Probe], share_ns: u64, period: u64) -> bool {
    let (cost, elapsed) = probes.iter().fold((0u128, 0u128), |(c, e), p| {
        (c + u128::from(p.cost_ns), e + u128::from(p.elapsed_ns))
    });
    let span = elapsed * u128::from(share_ns) / cost.max(1);
    probes.len() >= 3
        && probes.iter().filter(|p| !p.beside_another()).count() == 1
        && span < u128::from(short_window_ns(period))
}

/// Whether the window's probes all ran beside another context (two at
/// least: one alone may have met the other's last kernel).
pub fn covered(probes: &[Probe]) -> bool {
    probes.len() >= 2 && probes.iter().all(Probe::beside_another)
}

/// What the probes after the window's last clean one lost, each stream's
/// loss counted once ([`lost_once_ns`]). 0 when the window ended clear,
/// or when no probe was clean: something that takes no turns covers the
/// window, and leaving time unspent would not give it back to anyone.
pub fn trailing_lost_ns(probes: &[Probe]) -> u64 {
    let Some(last_clean) = probes.iter().rposition(|p| !p.beside_another()) else {
        return 0;
    };
    lost_once_ns(&probes[last_clean + 1..])
}

/// What `probes` lost to other contexts, once: two streams that wait out
/// the same other window lose the same time, so each stream's probes are
/// summed (from its first, allocating nothing) and the most counts.
pub fn lost_once_ns(probes: &[Probe]) -> u64 {
    probes
        .iter()
        .enumerate()
        .filter(|&(i, p)| !probes[..i].iter().any(|q| q.stream == p.stream))
        .map(|(i, first)| {
            probes[i..]
                .iter()
                .filter(|p| p.stream == first.stream)
                .fold(0u64, |sum, p| sum.saturating_add(p.lost_ns()))
        })
        .max()
        .unwrap_or(0)
}

/// Where another context's window lies inside this one: the window opened
/// clear and ended clear, but probes between them lost over
/// [`min_lead_ns`]. Neither rule above sees it, and the other container
/// may not either: beside 0.1 ms steps at 50 %, the 40 % rest of a
/// container without a limit, queued 30 ms deep, ran its windows clear
/// from the middle of theirs while one step of theirs waited 25 ms each
/// period, and neither moved (p99 2.5 ms, H200, run 158). Returns about
/// how far into the window the last probe that lost time ended (the sum
/// of the probes' lengths to it, gaps between probes left out): past it,
/// the other window is over. `least_lost_ns`: what the probes must lose
/// between the clear ends, at least [`min_lead_ns`]. Each stream is
/// judged on its own probes, and the one that lost most counts: two
/// streams that wait out the same other window lose the same time, once.
pub fn nested_until_ns(probes: &[Probe], least_lost_ns: u64) -> Option<u64> {
    let clear = |p: Option<&Probe>| p.is_some_and(|p| !p.beside_another());
    if !clear(probes.first()) || !clear(probes.last()) {
        return None;
    }
    let mut streams: Vec<StreamKey> = probes.iter().map(|p| p.stream).collect();
    streams.sort_unstable();
    streams.dedup();
    let (lost, until) = streams
        .into_iter()
        .map(|stream| {
            let mine: Vec<&Probe> = probes.iter().filter(|p| p.stream == stream).collect();
            let Some(last_lossy) = mine.iter().rposition(|p| p.beside_another()) else {
                return (0, 0);
            };
            let lost = mine
                .iter()
                .filter(|p| p.beside_another())
                .fold(0u64, |sum, p| sum.saturating_add(p.lost_ns()));
            let until = mine[..=last_lossy]
                .iter()
                .fold(0u64, |sum, p| sum.saturating_add(p.elapsed_ns));
            (lost, until)
        })
        .max()?;
    (lost > 0 && lost >= least_lost_ns.max(min_lead_ns())).then_some(until)
}

/// What a window beside a limited neighbour (one that takes turns) must
/// lose between its clear ends, in percent of the period, before it moves
/// past what lies inside it ([`nested_until_ns`]). Such a neighbour moves
/// its own window out of one that covers its start, so only a whole
/// window inside this one is looked for: a 60 % container's, nested in
/// a 30 % one of 0.1 ms steps whose steps crawled through it at 2.5 ms
/// each for 3 s (its probes saw nothing: its queue of long kernels hid
/// the steps; H200, run 171). Less is left alone: four containers whose
/// limits fill the period nest each other's edges while they settle.
pub const NESTED_BESIDE_LIMITED_PCT: u64 = 25;

/// A first anchor for a container: somewhere in the period after `now`,
/// picked by `random`.
pub fn first_anchor(now: u64, random: u64, period: u64) -> u64 {
    now + random % period.max(1)
}

/// Which stream a probe timed: its context, its handle (the legacy
/// default stream, NULL or `CU_STREAM_LEGACY`, as 0) and, for the
/// per-thread default stream, its thread's number (else 0): each thread's
/// is a stream of its own under one handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamKey {
    pub ctx: usize,
    pub handle: usize,
    pub thread: usize,
}

/// One probe: consecutive launches of one stream in one window, what
/// they cost, how long the GPU took over them, and how long of that the
/// stream stood dry while the host prepared the next launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// The stream whose launches it timed.
    pub stream: StreamKey,
    pub cost_ns: u64,
    pub elapsed_ns: u64,
    /// From a synchronisation that drained the stream to the probe's next
    /// launch, summed (`synced::dry_since`): time the GPU had none of the
    /// probe's work, which no other context took from it.
    pub dry_ns: u64,
}

impl Probe {
    /// The GPU time in the probe that went to something else: what it
    /// took beyond its launches' cost and the host's pauses with the
    /// stream dry. A loop that synchronises every 0.1 ms step and spends
    /// 0.03 ms on the host before the next one leaves the GPU idle 30 % of
    /// each probe; counted as lost, every probe of a PyTorch CUDA-graph
    /// loop looked as if another context ran in it (3 ms of launches in
    /// 4.1-4.6 ms, H100 run 138), and its windows moved every period.
    pub fn lost_ns(&self) -> u64 {
        self.elapsed_ns
            .saturating_sub(self.cost_ns)
            .saturating_sub(self.dry_ns)
    }

    /// Whether another context ran in the middle of the probe.
    pub fn beside_another(&self) -> bool {
        let lost = self.lost_ns();
        lost > slack_ns() && lost.saturating_mul(100) > self.cost_ns.saturating_mul(SHARE_PCT)
    }
}

/// Where a window moves ([`verdict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    Later(u64),
    Earlier(u64),
}

/// What one window's probes, in the order they ran, say: where the
/// window should open, if it moves at all.
/// - Its first probe ran beside another context (the window opened on a
///   busy GPU): later, by what the leading such probes lost
///   ([`lost_once_ns`]), times a factor from 0.6 to 1 picked by `random`. A window covered from end
///   to end moves with odds of one in two: two containers whose windows
///   open together then part. Less than [`MIN_LEAD_NS`] lost moves the
///   window only when the window before it (`late_before`) also opened
///   beside another.
/// - It opened on an idle GPU but ran on into another context
///   ([`ran_on_from_a_clear_start`]): [`MIN_MOVE_NS`] earlier, into the
///   room there may be before it, and it keeps what it leaves unspent as
///   it was (`cut::next_cut`): the container that came second yields. Beside one
///   that takes no turns and covers some of its windows' ends, leaving
///   time unspent only gave that one more (a 30 % container of 1 ms
///   kernels beside an unlimited one: 0.244, and 0.254 this way, one run
///   each on an H200, docs/benchmarks.md runs 68-69).
pub fn verdict(probes: &[Probe], random: u64, late_before: bool, period: u64) -> Option<Move> {
    if ran_on_from_a_clear_start(probes) {
        return Some(Move::Earlier(min_move_ns()));
    }
    later(probes, random, late_before, period).map(Move::Later)
}

fn later(probes: &[Probe], random: u64, late_before: bool, period: u64) -> Option<u64> {
    if !probes.first()?.beside_another() {
        return None;
    }
    if covered(probes) && random & 1 == 1 {
        // Both windows may be covered by each other: one in two stays, so
        // that they part. (A jump to anywhere in the period lands, in a
        // full period, in a third one's window: four containers on an
        // H200 then never settled, run 44.)
        return None;
    }
    let leading = probes.iter().take_while(|p| p.beside_another()).count();
    let lost = lost_once_ns(&probes[..leading]);
    if lost < min_lead_ns() {
        // A predecessor a little late once: it leaves some of its share
        // unspent (`next_cut`). Moving would only push this window into
        // the next one's, and that one into the next, round the period.
        // Late again in the next window: this one opens too early, and
        // moves by just what it lost.
        return late_before.then_some(lost.max(min_move_ns()));
    }
    let factor_milli = 600 + random % 401;
    let least = min_move_ns();
    let step = lost.saturating_mul(factor_milli) / 1000 + least;
    Some(step.clamp(least, max_move_ns(period)))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::limiter::cut::{GUARD_NS, Placed, guard_ns, next_cut};

    const MS: u64 = 1_000_000;

    /// A probe that met no one (judge.rs's tests use these too).
    pub(in crate::limiter) fn clean(ms: u64) -> Probe {
        Probe {
            stream: StreamKey::default(),
            cost_ns: ms * MS,
            elapsed_ns: ms * MS + 100_000,
            dry_ns: 0,
        }
    }

    /// `p` on the stream of handle `handle`.
    fn on(handle: usize, p: Probe) -> Probe {
        Probe {
            stream: StreamKey {
                handle,
                ..StreamKey::default()
            },
            ..p
        }
    }

    /// A probe that lost `lost_ms` to another context.
    pub(in crate::limiter) fn shared(ms: u64, lost_ms: u64) -> Probe {
        Probe {
            stream: StreamKey::default(),
            cost_ns: ms * MS,
            elapsed_ns: (ms + lost_ms) * MS,
            dry_ns: 0,
        }
    }

    #[test]
    fn probes_leads_and_moves_shrink_with_short_periods() {
        // At the default period, the figures tuned there.
        assert_eq!(probe_ns(10, PERIOD_NS), PROBE_NS);
        assert_eq!(probe_ns(1, PERIOD_NS), 500_000);
        assert_eq!(probe_ns(0, PERIOD_NS), MIN_PROBE_NS);
        assert_eq!(slack_ns(), SLACK_NS);
        assert_eq!(min_lead_ns(), MIN_LEAD_NS);
        assert_eq!((min_move_ns(), guard_ns()), (MIN_MOVE_NS, GUARD_NS));
        // Shorter periods shrink them; longer ones keep the 100 ms figures.
        assert_eq!(scaled_at(MIN_LEAD_NS, 10 * MS), 300_000);
        assert_eq!(scaled_at(MIN_LEAD_NS, 20 * MS), 600_000);
        assert_eq!(scaled_at(MIN_LEAD_NS, 1000 * MS), MIN_LEAD_NS);
        assert_eq!(scaled_at(u64::MAX, u64::MAX), u64::MAX);
        // The covered streak lasts as long in time (600 ms).
        assert_eq!(covered_streak(), COVERED_STREAK);
        assert_eq!(covered_streak_at(20 * MS), 5 * COVERED_STREAK);
        assert_eq!(covered_streak_at(1000 * MS), COVERED_STREAK);
        assert_eq!(covered_streak_at(0), 100_000_000 * COVERED_STREAK);
    }

    #[test]
    fn periods_are_whole_steps_from_the_anchor_either_side_of_it() {
        let a = 10 * PERIOD_NS + 7;
        assert_eq!(period_start(a, a, PERIOD_NS), a);
        assert_eq!(period_start(a, a + PERIOD_NS - 1, PERIOD_NS), a);
        assert_eq!(period_start(a, a + PERIOD_NS, PERIOD_NS), a + PERIOD_NS);
        assert_eq!(period_start(a, a - 1, PERIOD_NS), a - PERIOD_NS);
        assert_eq!(period_start(a, a - PERIOD_NS, PERIOD_NS), a - PERIOD_NS);
        assert_eq!(
            period_start(a, a - PERIOD_NS - 1, PERIOD_NS),
            a - 2 * PERIOD_NS
        );
        // An anchor far ahead of a clock near zero does not wrap.
        assert_eq!(period_start(u64::MAX, 5, PERIOD_NS), 0);
    }

    #[test]
    fn a_schedule_spent_to_the_period_end_opens_at_the_next_period() {
        let a = 1_000 * MS;
        assert_eq!(
            next_open(a, a + 4 * PERIOD_NS, PERIOD_NS),
            a + 4 * PERIOD_NS
        );
        assert_eq!(
            next_open(a, a + 4 * PERIOD_NS + 1, PERIOD_NS),
            a + 4 * PERIOD_NS
        );
        assert_eq!(
            next_open(a, a + 5 * PERIOD_NS - 1, PERIOD_NS),
            a + 4 * PERIOD_NS
        );
        assert_eq!(
            next_open(a, a + 5 * PERIOD_NS + 30 * MS, PERIOD_NS),
            a + 5 * PERIOD_NS
        );
    }

    #[test]
    fn shares_and_cuts_stay_bounded_whatever_the_region_holds() {
        assert_eq!(share_ns(30, 1000, PERIOD_NS), 30 * MS);
        assert_eq!(share_ns(50, 2000, PERIOD_NS), PERIOD_NS);
        assert_eq!(share_ns(u32::MAX, u32::MAX, PERIOD_NS), 4 * PERIOD_NS);
        let share = 30 * MS;
        let late = [clean(3), shared(3, 3)];
        assert_eq!(
            next_cut(
                u64::MAX,
                (share, PERIOD_NS),
                &late,
                0,
                true,
                Placed::ByProbes
            ),
            share / 4
        );
        let huge = Probe {
            stream: StreamKey::default(),
            cost_ns: u64::MAX,
            elapsed_ns: u64::MAX,
            dry_ns: 0,
        };
        assert!(!huge.beside_another());
    }

    #[test]
    fn a_window_late_at_both_ends_leaves_some_of_its_share() {
        let share = 50 * MS;
        let ran_on = [shared(3, 3), clean(3), shared(3, 2), shared(3, 3)];
        let cut = next_cut(0, (share, PERIOD_NS), &ran_on, 0, false, Placed::ByProbes);
        assert_eq!(cut, 5 * MS / 2);
        assert_eq!(
            next_cut(cut, (share, PERIOD_NS), &ran_on, 0, false, Placed::ByProbes),
            5 * MS
        );
        // Bounded, and halved after a window that ended clear.
        let mut big = 0;
        for _ in 0..10 {
            big = next_cut(big, (share, PERIOD_NS), &ran_on, 0, false, Placed::ByProbes);
        }
        assert_eq!(big, share / 4);
        assert_eq!(
            next_cut(
                big,
                (share, PERIOD_NS),
                &[shared(3, 3), clean(3)],
                0,
                false,
                Placed::ByProbes
            ),
            share / 8
        );
    }

    #[test]
    fn covered_windows_leave_time_until_a_streak_says_no_one_takes_turns() {
        let share = 30 * MS;
        let all = [shared(3, 3), shared(3, 3)];
        let mut cut = 0;
        for streak in 1..=COVERED_STREAK {
            cut = next_cut(
                cut,
                (share, PERIOD_NS),
                &all,
                streak,
                true,
                Placed::ByProbes,
            );
        }
        assert_eq!(cut, share / 4);
        assert_eq!(
            next_cut(
                cut,
                (share, PERIOD_NS),
                &all,
                COVERED_STREAK + 1,
                true,
                Placed::ByProbes
            ),
            0
        );
        assert!(covered(&all));
        assert!(!covered(&[shared(3, 3)]));
        assert!(!covered(&[shared(3, 3), clean(3)]));
    }

    #[test]
    fn a_short_window_clear_for_one_probe_keeps_the_covered_streak() {
        let share = 30 * MS;
        let streak = COVERED_STREAK + 1;
        // A 30 % container's window beside one that takes no turns: ten
        // 3 ms probes, each twice as long as its cost, one in the clear.
        let mut nearly: Vec<Probe> = (0..10).map(|_| shared(3, 3)).collect();
        nearly[4] = clean(3);
        assert!(nearly_covered(&nearly, share, PERIOD_NS) && !covered(&nearly));
        assert_eq!(next_streak(streak, &nearly, share, PERIOD_NS), streak);
        assert_eq!(
            next_cut(
                0,
                (share, PERIOD_NS),
                &nearly,
                streak,
                true,
                Placed::ByProbes
            ),
            0
        );
        // Before the streak, it counts for nothing either way.
        assert_eq!(next_streak(2, &nearly, share, PERIOD_NS), 2);
        assert_eq!(
            next_streak(2, &[shared(3, 3), shared(3, 3)], share, PERIOD_NS),
            3
        );
        // Two probes in the clear start the streak anew.
        nearly[7] = clean(3);
        assert_eq!(next_streak(streak, &nearly, share, PERIOD_NS), 0);
        // So does a window over nearly all the period (two 50 % containers
        // that cover each other), even with two of its probes dropped at
        // host pauses: its whole share at its probes' stretch is long.
        let half = 50 * MS;
        let long: Vec<Probe> = (0..14)
            .map(|i| if i == 3 { clean(3) } else { shared(3, 3) })
            .collect();
        assert!(long.iter().map(|p| p.elapsed_ns).sum::<u64>() < short_window_ns(PERIOD_NS));
        assert!(!nearly_covered(&long, half, PERIOD_NS));
        assert_eq!(next_streak(streak, &long, half, PERIOD_NS), 0);
        assert_ne!(
            next_cut(0, (half, PERIOD_NS), &long, streak, false, Placed::ByProbes),
            0
        );
    }

    #[test]
    fn a_window_that_opened_on_an_idle_gpu_stays_or_moves_earlier() {
        assert_eq!(verdict(&[clean(3), clean(3)], 7, false, PERIOD_NS), None);
        assert_eq!(verdict(&[], 7, false, PERIOD_NS), None);
        // It ran on into another's window: into the room before it, and
        // its share stays whole.
        let ran_on = [clean(3), clean(3), shared(3, 3), shared(3, 3)];
        assert!(ran_on_from_a_clear_start(&ran_on));
        assert_eq!(
            verdict(&ran_on, 0, true, PERIOD_NS),
            Some(Move::Earlier(min_move_ns()))
        );
        assert_eq!(
            next_cut(
                2 * MS,
                (30 * MS, PERIOD_NS),
                &ran_on,
                0,
                true,
                Placed::ByProbes
            ),
            2 * MS
        );
        assert_eq!(
            next_cut(0, (30 * MS, PERIOD_NS), &ran_on, 0, true, Placed::ByProbes),
            GUARD_NS
        );
        // Placed from the board, it cannot move: it leaves half what its
        // tail lost, as one late at both ends does.
        let tail = trailing_lost_ns(&ran_on);
        assert_eq!(tail, 6 * MS);
        assert_eq!(
            next_cut(
                2 * MS,
                (30 * MS, PERIOD_NS),
                &ran_on,
                0,
                true,
                Placed::Tiled
            ),
            2 * MS + tail / 2
        );
        // A clear end halves the cut; placed in turns lengthened for
        // short steps, down to twice the floor (the guard and two steps),
        // then by sixteenths, and never under the floor.
        let clear = [clean(3), clean(3)];
        let long = 140 * MS;
        assert_eq!(
            next_cut(4 * MS, (30 * MS, PERIOD_NS), &clear, 0, true, Placed::Tiled),
            2 * MS
        );
        let floor = crate::limiter::cut::lengthened_floor_ns(30 * MS);
        assert!(
            floor > crate::limiter::cut::guard_ns() && floor < MS,
            "{floor}"
        );
        let placed = |cut| next_cut(cut, (30 * MS, long), &clear, 0, true, Placed::Tiled);
        // A placement's jump of 7 ms is gone in three windows.
        assert_eq!(placed(7 * MS), 3 * MS + MS / 2);
        assert_eq!(placed(3 * MS + MS / 2), 2 * floor);
        assert_eq!(placed(2 * floor), 2 * floor - 2 * floor / 16);
        assert_eq!(placed(floor + 1), floor);
        assert_eq!(placed(0), floor);
        // A window whose tail needs more than that runs on, grows its cut
        // by half what it lost, and comes down by halves to the knee, not
        // to where it ran on.
        let cut = next_cut(floor, (30 * MS, long), &ran_on, 0, true, Placed::Tiled);
        assert_eq!(cut, floor + tail / 2);
        assert!(placed(placed(cut)) >= 2 * floor - 2 * floor / 16);
        // Probe-led (not placed), lengthened or not: halved, to the guard.
        assert_eq!(
            next_cut(4 * MS, (30 * MS, long), &clear, 0, true, Placed::ByProbes),
            2 * MS
        );
        assert_eq!(
            next_cut(0, (30 * MS, long), &clear, 0, true, Placed::ByProbes),
            crate::limiter::cut::guard_ns()
        );
        // Placed with room after it for its end: no floor, lengthened or
        // not; a clear end halves the cut to nothing, and a tail that ran
        // on still adds half what it lost.
        let roomy =
            |cut, period| next_cut(cut, (30 * MS, period), &clear, 0, true, Placed::WithRoom);
        assert_eq!(roomy(2 * floor, long), floor);
        assert_eq!(roomy(1, long), 0);
        assert_eq!(roomy(0, long), 0);
        assert_eq!(roomy(0, PERIOD_NS), 0);
        assert_eq!(
            next_cut(0, (30 * MS, long), &ran_on, 0, true, Placed::WithRoom),
            tail / 2
        );
        // A share so small that the floor passes a quarter of it: the
        // quarter.
        let tiny = 2 * MS;
        assert_eq!(
            next_cut(0, (tiny, long), &clear, 0, true, Placed::Tiled),
            tiny / 4
        );
        // Late at both ends: no room either side, so it leaves time.
        let both = [shared(3, 3), clean(3), shared(3, 3)];
        assert!(!ran_on_from_a_clear_start(&both));
        assert_eq!(
            next_cut(0, (30 * MS, PERIOD_NS), &both, 0, false, Placed::ByProbes),
            3 * MS / 2
        );
    }

    #[test]
    fn a_window_that_opened_beside_another_moves_past_it() {
        // A little lost at the start is the window before's to mend.
        assert_eq!(
            verdict(&[shared(3, 2), clean(3)], 0, false, PERIOD_NS),
            None
        );
        assert_eq!(
            verdict(&[shared(3, 2), clean(3)], 0, true, PERIOD_NS),
            Some(Move::Later(2 * MS))
        );
        let probes = [shared(3, 3), shared(3, 2), clean(3), shared(3, 3)];
        let least = verdict(&probes, 0, false, PERIOD_NS).unwrap();
        let most = verdict(&probes, 400, false, PERIOD_NS).unwrap();
        assert_eq!(least, Move::Later(5 * MS * 6 / 10 + MIN_MOVE_NS));
        assert_eq!(most, Move::Later(5 * MS + MIN_MOVE_NS));
        // Two windows that opened together part: different factors.
        assert_ne!(
            verdict(&probes, 100, false, PERIOD_NS),
            verdict(&probes, 300, false, PERIOD_NS)
        );
    }

    #[test]
    fn the_host_s_pauses_with_the_stream_dry_are_not_lost_to_another() {
        // A synchronised loop of 0.1 ms steps with 0.03 ms of host work
        // between them: 3 ms of launches in 4.3 ms, 1.2 ms of it dry.
        let dry = Probe {
            stream: StreamKey::default(),
            cost_ns: 3 * MS,
            elapsed_ns: 4_300_000,
            dry_ns: 1_200_000,
        };
        assert_eq!(dry.lost_ns(), 100_000);
        assert!(!dry.beside_another());
        // The same timing with the stream never dry lost 1.3 ms to another.
        assert!(Probe { dry_ns: 0, ..dry }.beside_another());
        // Beside another context as well: what it took beyond both shows.
        let met = Probe {
            elapsed_ns: 6_800_000,
            ..dry
        };
        assert_eq!(met.lost_ns(), 2_600_000);
        assert!(met.beside_another());
        // The fill still counts the pauses: the window spans them.
        assert_eq!(super::super::fill::window_fill_milli(&[dry]), Some(697));
    }

    #[test]
    fn small_losses_and_long_covers_are_bounded() {
        // A host that fed the GPU 0.9 ms late over 3 ms is not a neighbour.
        assert_eq!(
            verdict(&[shared(3, 0), clean(3)], 0, false, PERIOD_NS),
            None
        );
        let late = Probe {
            stream: StreamKey::default(),
            cost_ns: 3 * MS,
            elapsed_ns: 3 * MS + 900_000,
            dry_ns: 0,
        };
        assert!(!late.beside_another());
        // 2 ms lost over 20 ms of one long kernel is 10 %: not a neighbour.
        assert!(!shared(20, 2).beside_another());
        let mut all: Vec<Probe> = (0..40).map(|_| shared(3, 3)).collect();
        all.push(clean(3));
        assert_eq!(
            verdict(&all, 400, false, PERIOD_NS),
            Some(Move::Later(max_move_ns(PERIOD_NS)))
        );
        // Covered from end to end: one draw in two moves, past the cover.
        all.pop();
        assert_eq!(verdict(&all, 1, false, PERIOD_NS), None);
        assert_eq!(
            verdict(&all, 400, false, PERIOD_NS),
            Some(Move::Later(max_move_ns(PERIOD_NS)))
        );
    }

    #[test]
    fn a_nested_window_counts_each_stream_s_loss_once() {
        // One stream that lost 26 ms between clear ends: past 25 ms, and
        // the other window is over where its last lossy probe ended.
        let one = [clean(3), shared(3, 20), shared(3, 6), clean(3)];
        let until = 3 * MS + 100_000 + 23 * MS + 9 * MS;
        assert_eq!(nested_until_ns(&one, 25 * MS), Some(until));
        assert_eq!(nested_until_ns(&one, 27 * MS), None);
        // Two streams that each lost 13 ms waiting out the same window:
        // 13 ms, not 26.
        let two = [
            on(1, clean(3)),
            on(2, clean(3)),
            on(1, shared(3, 13)),
            on(2, shared(3, 13)),
            on(1, clean(3)),
            on(2, clean(3)),
        ];
        assert_eq!(nested_until_ns(&two, 25 * MS), None);
        // The stream that lost most decides, and its own probes place the
        // end.
        let uneven = [
            on(1, clean(3)),
            on(2, clean(3)),
            on(1, shared(3, 27)),
            on(2, shared(3, 13)),
            on(2, clean(3)),
            on(1, clean(3)),
        ];
        assert_eq!(
            nested_until_ns(&uneven, 25 * MS),
            Some(3 * MS + 100_000 + 30 * MS)
        );
        // A window that opened or ended beside another is not nested.
        assert_eq!(nested_until_ns(&one[1..], 1), None);
        assert_eq!(nested_until_ns(&one[..3], 1), None);
    }

    #[test]
    fn a_window_s_ends_count_each_stream_s_loss_once() {
        // Two streams of a window that opened late and ran on into the
        // next other window, 6 ms each: 6 ms lost, as one stream's, and
        // the cut grows by half of it (summed, by 6 ms).
        let one = [shared(3, 4), clean(3), clean(3), shared(3, 6)];
        let two = [
            on(1, shared(3, 4)),
            on(1, clean(3)),
            on(2, clean(3)),
            on(1, shared(3, 6)),
            on(2, shared(3, 6)),
        ];
        assert_eq!(trailing_lost_ns(&one), 6 * MS);
        assert_eq!(trailing_lost_ns(&two), 6 * MS);
        assert_eq!(
            next_cut(0, (30 * MS, PERIOD_NS), &one, 0, false, Placed::ByProbes),
            3 * MS
        );
        assert_eq!(
            next_cut(0, (30 * MS, PERIOD_NS), &two, 0, false, Placed::ByProbes),
            3 * MS
        );
        // Two streams whose window opened while the other ran its last
        // 8 ms: they move as one stream would, not by 16 ms.
        let late_one = [shared(3, 8), clean(3), clean(3)];
        let late_two = [
            on(1, shared(3, 8)),
            on(2, shared(3, 8)),
            on(1, clean(3)),
            on(2, clean(3)),
        ];
        for random in [0, 200, 400] {
            assert_eq!(
                verdict(&late_two, random, false, PERIOD_NS),
                verdict(&late_one, random, false, PERIOD_NS)
            );
        }
        assert!(matches!(
            verdict(&late_one, 0, false, PERIOD_NS),
            Some(Move::Later(_))
        ));
        // Uneven streams: the one that lost most counts.
        let uneven = [
            on(1, shared(3, 2)),
            on(2, shared(3, 5)),
            on(1, shared(3, 2)),
        ];
        assert_eq!(lost_once_ns(&uneven), 5 * MS);
        assert_eq!(lost_once_ns(&[]), 0);
    }
}
