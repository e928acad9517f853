//! The compute bucket: a GCRA ("virtual scheduling") on one atomic per
//! device in the shared region, so every process of the container draws
//! from it.
//!
//! A launch costs its estimated GPU time. At limit `L` (a fraction) and
//! controller scale `s`, it advances the device's theoretical arrival time
//! `tat` by `cost / (L * s)`. It may go when `tat` is at most [`BURST_NS`]
//! ahead of now: one CAS when tokens are there, a sleep otherwise. Refill
//! is implicit in the clock, so the bucket never stops refilling when a
//! process dies, and an idle container cannot save up more than the burst.
//!
//! Alone on its device the container needs no turns: its share is paced
//! evenly, in leases of at most [`PACE_NS`] of the schedule, so that an
//! inference loop's steps wait about their share each, not one step in
//! many waiting out the rest of a period (issue 29).
//!
//! Beside other containers, once its turns have an anchor (`turns.rs`),
//! the schedule may instead run ahead to the end of the current period, from no
//! earlier than its start (a share not spent in its period is gone): the
//! container spends each period's share at once, from the start of its
//! window, and its launches wait for the next period after that (less
//! what the turns leave unspent: `cut::next_cut`). In turns the share
//! is converted by the fill of the container's windows, so that it spans
//! its part of the period (`fill::turn_scale_milli`).
#![forbid(unsafe_code)]

use vgpu_shm::layout::DeviceEntry;

use super::turns;

/// How far ahead of its schedule the container may run: absorbs sleep
/// overshoot (Linux timer slack is 50 µs) without allowing a burst that
/// shows in a one-second window (at most this much wall time of work).
pub const BURST_NS: u64 = 4_000_000;

/// Paced (alone), the most of the schedule one lease takes: a quarter
/// of a millisecond, so that a synchronised loop waits in steps that
/// small (a 0.1 ms step at 90 % waits about 0.03 ms, plus the sleep's
/// overshoot, Linux's 50 µs timer slack, which the next leases then take
/// back), where a whole 2 ms lease at 10 % kept one step in twenty
/// waiting 18 ms. One CAS on the bucket per lease: at 10 %, one per
/// 25 µs of GPU time.
pub const PACE_NS: u64 = 250_000;

/// The furthest ahead of now the shared schedule may stand: a `tat_ns`
/// from before a reboot, another clock or a hand edit is clamped to it,
/// so no launch ever waits more than one second of bucket depth (in
/// turns, one second past the end of the current period).
pub const MAX_AHEAD_NS: u64 = 1_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Go: this much GPU time was granted.
    Now(u64),
    /// Try again after this many nanoseconds.
    Wait(u64),
    /// In turns, the window's share is spent: try again after this many
    /// nanoseconds, in the next window.
    NextWindow(u64),
}

/// Wall-clock nanoseconds of the device's schedule that `cost_ns` of GPU
/// time uses at `percent` and `scale_milli`.
pub fn schedule_ns(cost_ns: u64, percent: u32, scale_milli: u32) -> u64 {
    let denom = u64::from(percent.max(1)) * u64::from(scale_milli.max(1));
    // Costs are far below 2^46 ns (a day), so this stays in 64 bits.
    match cost_ns.checked_mul(100_000) {
        Some(n) => (n / denom).min(u64::MAX / 2),
        None => u64::MAX / 2,
    }
}

/// The GPU time that `schedule_ns` of the schedule holds at `percent`
/// and `scale_milli` (the inverse of [`schedule_ns`], rounded down).
fn gpu_ns(schedule_ns: u64, percent: u32, scale_milli: u32) -> u64 {
    let n = u128::from(schedule_ns) * u128::from(percent.max(1)) * u128::from(scale_milli.max(1));
    u64::try_from(n / 100_000).unwrap_or(u64::MAX)
}

/// Takes a lease of `lease_ns` of GPU time from `entry`'s bucket at time
/// `now`, or less but at least `least_ns` (the launch's cost) where the
/// window in turns has less left ([`Admit::Now`] says how much).
pub fn admit(entry: &DeviceEntry, least_ns: u64, lease_ns: u64, now: u64) -> Admit {
    let percent = entry.sm_percent();
    if percent == 0 {
        return Admit::Now(lease_ns);
    }
    if let Some(anchor) = turns_at(entry, now) {
        let scale = turn_scale_milli(entry);
        return admit_in_turns(entry, anchor, percent, scale, (least_ns, lease_ns), now);
    }
    // Alone on the device, with turns paused, or side by side where the
    // limits leave room (`pacing`): no windows, the share is paced
    // evenly, a lease of at most `PACE_NS` of the schedule at a time (a
    // launch's whole cost at least). (Side by side, leases of at least
    // 1 ms and shares converted by the fill, as in turns, cost a 1 ms
    // step beside a 60 % container 0.9 ms more at its p99 and the
    // neighbour 0.04 of its share, run 129; loops that hand the GPU over
    // too often ask for turns instead.)
    let scale = entry.rate_scale_milli();
    let granted = lease_ns.min(gpu_ns(PACE_NS, percent, scale)).max(least_ns);
    let step = schedule_ns(granted, percent, scale);
    move_schedule(entry, now.saturating_add(MAX_AHEAD_NS), |tat| {
        if tat > now + BURST_NS {
            return Err(Admit::Wait(tat - BURST_NS - now));
        }
        Ok((tat.max(now) + step, granted))
    })
}

/// Whether `entry`'s launches are admitted in turns at `now` (not alone,
/// not paced side by side).
pub fn in_turns(entry: &DeviceEntry, now: u64) -> bool {
    turns_at(entry, now).is_some()
}

/// The anchor of the turns `entry`'s bucket admits in at `now`: beside
/// others, where they do not pace side by side (`pacing`); None where it
/// paces.
fn turns_at(entry: &DeviceEntry, now: u64) -> Option<u64> {
    let anchor = entry.turns_in_force();
    let beside = anchor != 0 && !entry.alone(now);
    (beside && !super::pacing::paces_beside_others(entry, now)).then_some(anchor)
}

/// How long from `now` until `entry`'s bucket admits a launch paced (as
/// [`admit`] does alone, with turns paused, or side by side): 0 where it
/// would at once. None where a launch would be admitted in turns, or
/// without a limit.
pub fn paced_ready_in(entry: &DeviceEntry, now: u64) -> Option<u64> {
    if entry.sm_percent() == 0 || turns_at(entry, now).is_some() {
        return None;
    }
    let tat = entry.schedule_ns().min(now.saturating_add(MAX_AHEAD_NS));
    Some(tat.saturating_sub(now.saturating_add(BURST_NS)))
}

/// The scale a container's turns run at on `entry`: the controller's,
/// converted by the fill of its windows (`fill::turn_scale_milli`).
pub fn turn_scale_milli(entry: &DeviceEntry) -> u32 {
    super::fill::turn_scale_milli(entry.rate_scale_milli(), entry.turn_fill_milli())
}

/// Moves the device's schedule where `decide` says (`Ok`: the new
/// schedule and the GPU time granted), or leaves it and answers what
/// `decide` says (`Err`); retried while other processes move it
/// meanwhile. A schedule beyond `ceiling` (from before a reboot, another
/// clock, a hand edit) is clamped to it first.
fn move_schedule(
    entry: &DeviceEntry,
    ceiling: u64,
    mut decide: impl FnMut(u64) -> Result<(u64, u64), Admit>,
) -> Admit {
    let mut tat = entry.schedule_ns();
    loop {
        if tat > ceiling {
            tat = match entry.move_schedule(tat, ceiling) {
                Ok(_) => ceiling,
                Err(seen) => seen,
            };
            continue;
        }
        let (next, granted) = match decide(tat) {
            Ok(decided) => decided,
            Err(answer) => return answer,
        };
        match entry.move_schedule(tat, next) {
            Ok(_) => return Admit::Now(granted),
            Err(seen) => tat = seen,
        }
    }
}

/// [`admit`] for a container in turns, of a lease of (at least, at most)
/// GPU ns. The last lease of a window is cut to what is left of its
/// share, so that the window ends where its share does, or one launch
/// later (a launch that finds any of the share left goes whole): a whole
/// 2 ms lease there ran the windows of limits that fill the period
/// (10+20+30+40) into the next one's in a third of the periods, each such
/// window then cut its next share and moved (docs/benchmarks.md, run 68).
fn admit_in_turns(
    entry: &DeviceEntry,
    anchor: u64,
    percent: u32,
    scale: u32,
    (least_ns, lease_ns): (u64, u64),
    now: u64,
) -> Admit {
    let period = super::period::of(entry);
    let start = turns::period_start(anchor, now, period);
    // (Bounded whatever the region holds: a cut judged at a higher scale,
    // or written by anyone, leaves at least three quarters of the period.)
    let cut = schedule_ns(entry.turn_cut_ns(), percent, scale)
        .min(period * super::cut::MAX_CUT_PCT / 100);
    let end = start + period - cut;
    move_schedule(entry, start + period + MAX_AHEAD_NS, |tat| {
        let from = tat.max(start);
        if from >= end {
            // Not before the next period: with a cut, `end` comes before
            // the period's end, and the schedule may stand between them.
            let open = turns::next_open(anchor, from, period).max(start + period);
            return Err(Admit::NextWindow(open.saturating_sub(now).max(1)));
        }
        let left = gpu_ns(end - from, percent, scale);
        let granted = lease_ns.min(left).max(least_ns);
        Ok((from + schedule_ns(granted, percent, scale), granted))
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use vgpu_shm::{CorePolicy, DeviceInfo, EntryIndex, Limits, Region};

    /// A region with one device whose SM limit is `percent` (tiling.rs's
    /// tests too).
    pub(in crate::limiter) fn entry(percent: u32) -> (Region, EntryIndex) {
        let r = Region::anonymous().unwrap();
        let info = DeviceInfo {
            uuid: [3; 16],
            total_mem: 1,
            sm_count: 132,
        };
        let i = r
            .register_device(
                &info,
                Limits {
                    mem: 0,
                    sm: percent,
                    policy: CorePolicy::Default,
                },
            )
            .unwrap()
            .index;
        (r, i)
    }

    /// [`entry`], its turns anchored at `anchor`.
    fn in_turns(percent: u32, anchor: u64) -> (Region, EntryIndex) {
        let (r, i) = entry(percent);
        r.device(i).choose_turn_anchor(anchor);
        (r, i)
    }

    /// Launches kernels of `cost` back to back for `secs` of simulated
    /// time, sleeping exactly as asked, the GPU running each at once;
    /// returns the GPU time admitted and when each launch went.
    fn run_with(percent: u32, cost: u64, secs: u64, anchor: u64) -> (f64, Vec<u64>) {
        let (r, i) = entry(percent);
        let d = r.device(i);
        d.choose_turn_anchor(anchor);
        let (mut now, end, mut gpu) =
            (1_000_000_000u64, 1_000_000_000 + secs * 1_000_000_000, 0u64);
        let mut went = Vec::new();
        while now < end {
            match admit(d, cost, cost, now) {
                Admit::Now(_) => {
                    gpu += cost;
                    went.push(now);
                    if anchor != 0 {
                        now += cost; // one stream: the next launch follows it
                    }
                }
                Admit::Wait(ns) | Admit::NextWindow(ns) => now += ns,
            }
        }
        (gpu as f64 / (secs * 1_000_000_000) as f64, went)
    }

    fn run(percent: u32, cost: u64, secs: u64) -> f64 {
        run_with(percent, cost, secs, 0).0
    }

    /// A synchronised loop of steps of `cost` GPU ns at `percent`, alone
    /// on the device, for `secs` of simulated time, through the credit
    /// as `limiter::admit` keeps it (2 ms leases asked); each sleep
    /// overshoots by `slack`. Returns the GPU share and the step
    /// latencies (ns).
    fn steps_alone(percent: u32, cost: u64, secs: u64, slack: u64) -> (f64, Vec<u64>) {
        let (r, i) = in_turns(percent, 1_000_000_000 + 37_000_000);
        let d = r.device(i);
        let (mut now, mut credit, mut gpu) = (1_000_000_000u64, 0u64, 0u64);
        let end = now + secs * 1_000_000_000;
        let mut steps = Vec::new();
        while now < end {
            d.note_alone(true, now);
            let began = now;
            if credit >= cost {
                credit -= cost;
            } else {
                loop {
                    match admit(d, cost, cost.max(2_000_000), now) {
                        Admit::Now(granted) => {
                            credit += granted - cost;
                            break;
                        }
                        Admit::Wait(ns) | Admit::NextWindow(ns) => now += ns + slack,
                    }
                }
            }
            now += cost;
            gpu += cost;
            steps.push(now - began);
        }
        (gpu as f64 / (now - 1_000_000_000) as f64, steps)
    }

    fn p99(mut v: Vec<u64>) -> u64 {
        v.sort_unstable();
        v[(v.len() - 1) * 99 / 100]
    }

    #[test]
    fn alone_the_share_is_paced_evenly_not_spent_in_one_window() {
        for percent in [10, 30, 60, 90] {
            for cost in [100_000, 1_000_000, 10_000_000] {
                for slack in [0, 60_000] {
                    let (got, steps) = steps_alone(percent, cost, 20, slack);
                    let want = f64::from(percent) / 100.0;
                    assert!(
                        (got - want).abs() < 0.01,
                        "{percent}% {cost}ns slack {slack}: share {got}"
                    );
                    // The ideal paced step: its work over the share.
                    let ideal = cost * 100 / u64::from(percent);
                    let p99 = p99(steps);
                    assert!(
                        p99 <= 2 * ideal,
                        "{percent}% {cost}ns slack {slack}: p99 {p99} ns, ideal {ideal} ns"
                    );
                }
            }
        }
    }

    #[test]
    fn in_turns_each_period_s_share_runs_at_the_window_start() {
        let anchor = 1_000_000_000 + 37_000_000;
        for percent in [10, 30, 60, 90] {
            for cost in [50_000, 1_000_000, 10_000_000] {
                let (got, went) = run_with(percent, cost, 20, anchor);
                let want = f64::from(percent) / 100.0;
                assert!((got - want).abs() < 0.01, "{percent}% {cost}ns: {got}");
                // Every launch after the first period starts within its
                // period's share (plus one kernel) of the period start.
                let share = turns::PERIOD_NS * u64::from(percent) / 100;
                for &t in went.iter().filter(|&&t| t > anchor + turns::PERIOD_NS) {
                    let into = t - turns::period_start(anchor, t, turns::PERIOD_NS);
                    assert!(
                        into <= share + cost,
                        "{percent}% {cost}ns: a launch {into} ns into its period"
                    );
                }
            }
        }
    }

    #[test]
    fn admitted_time_matches_the_limit() {
        for percent in [10, 30, 60, 90] {
            for cost in [50_000, 1_000_000, 10_000_000] {
                let got = run(percent, cost, 20);
                let want = f64::from(percent) / 100.0;
                assert!((got - want).abs() < 0.01, "{percent}% {cost}ns: {got}");
            }
        }
    }

    #[test]
    fn an_idle_bucket_saves_up_only_the_burst() {
        let (r, i) = entry(30);
        let d = r.device(i);
        let now = 10_000_000_000u64;
        let mut burst = 0u64;
        while matches!(admit(d, 100_000, 100_000, now), Admit::Now(_)) {
            burst += 100_000;
        }
        // 4 ms of schedule at 30% is 1.2 ms of GPU time (+1 launch).
        assert!(burst <= 1_300_000, "burst {burst}");
    }

    #[test]
    fn a_schedule_from_the_future_costs_at_most_a_second() {
        let (r, i) = entry(50);
        let d = r.device(i);
        let now = 5_000_000_000u64;
        d.tat_ns.store(now + 3_600_000_000_000, Ordering::Relaxed);
        match admit(d, 100_000, 100_000, now) {
            Admit::Wait(ns) => assert!(ns <= MAX_AHEAD_NS, "waits {ns} ns"),
            other => panic!("a full bucket alone answered {other:?}"),
        }
        assert_eq!(d.tat_ns.load(Ordering::Relaxed), now + MAX_AHEAD_NS);
        d.tat_ns.store(u64::MAX, Ordering::Relaxed);
        assert!(matches!(admit(d, 100_000, 100_000, now), Admit::Wait(ns) if ns <= MAX_AHEAD_NS));
    }

    /// Launches of `cost` ns from `start` (each spanning `span` ns) until
    /// the bucket says wait or the period ends: the GPU time admitted,
    /// where the launches got to, and the wait asked for, if any.
    fn one_period(d: &DeviceEntry, start: u64, cost: u64, span: u64) -> (u64, u64, Option<u64>) {
        let (mut now, mut gpu) = (start, 0u64);
        while now < start + turns::PERIOD_NS {
            match admit(d, cost, cost, now) {
                Admit::Now(_) => {
                    gpu += cost;
                    now += span;
                }
                Admit::Wait(ns) | Admit::NextWindow(ns) => return (gpu, now, Some(ns)),
            }
        }
        (gpu, now, None)
    }

    #[test]
    fn a_cut_waits_for_the_next_period_and_any_cut_leaves_most_of_it() {
        let anchor = 2_000_000_000u64;
        for cut in [5_000_000, 100_000_000, u64::MAX] {
            let (r, i) = in_turns(30, anchor);
            let d = r.device(i);
            d.set_turn_cut_ns(cut);
            let start = anchor + 10 * turns::PERIOD_NS;
            let (gpu, now, wait) = one_period(d, start, 1_000_000, 1_000_000);
            // The wait runs to the next period, not 1 ns at a time.
            if let Some(ns) = wait {
                assert_eq!(now + ns, start + turns::PERIOD_NS, "cut {cut}");
            }
            let least = turns::share_ns(30, 1000, turns::PERIOD_NS) * 3 / 4;
            assert!(gpu >= least, "cut {cut}: {gpu} ns in the period");
        }
    }

    #[test]
    fn in_turns_a_window_s_last_lease_is_cut_to_what_is_left_of_its_share() {
        let anchor = 2_000_000_000u64;
        let (r, i) = in_turns(40, anchor);
        let d = r.device(i);
        d.set_turn_cut_ns(1_300_000);
        let start = anchor + 10 * turns::PERIOD_NS;
        // 1 ms launches bought 2 ms at a time, one stream running each
        // lease's launches back to back.
        let (mut now, mut gpu) = (start, 0u64);
        while let Admit::Now(granted) = admit(d, 1_000_000, 2_000_000, now) {
            assert!((1_000_000..=2_000_000).contains(&granted), "{granted}");
            gpu += granted;
            now += granted;
        }
        // 40 ms less the cut, and at most one launch more (a launch that
        // finds any of the share left goes whole): a whole last lease went
        // up to 2 ms over, into the next container's window.
        let share = turns::share_ns(40, 1000, turns::PERIOD_NS) - 1_300_000;
        assert!(
            (share..share + 1_000_000).contains(&gpu),
            "{gpu} ns for a share of {share}"
        );
        // The window's end says so (its last probe closes there), with the
        // wait to the next window's start.
        assert_eq!(
            admit(d, 1_000_000, 2_000_000, now),
            Admit::NextWindow(start + turns::PERIOD_NS - now)
        );
        // Alone, the same bucket paces: its waits are no window's end.
        d.note_alone(true, now);
        assert!(
            matches!(admit(d, 1_000_000, 2_000_000, now), Admit::Wait(_)),
            "{:?}",
            admit(d, 1_000_000, 2_000_000, now)
        );
        // A launch that costs more than is left still goes whole, and the
        // schedule runs past the window's end by what it took.
        let (r, i) = in_turns(40, anchor);
        let d = r.device(i);
        let end = start + turns::PERIOD_NS;
        d.tat_ns.store(end - 1_000_000, Ordering::Relaxed);
        assert_eq!(
            admit(d, 10_000_000, 10_000_000, start + 50_000_000),
            Admit::Now(10_000_000)
        );
        assert_eq!(d.tat_ns.load(Ordering::Relaxed), end + 24_000_000);
    }

    #[test]
    fn in_turns_a_fill_converts_the_share_so_that_it_spans_the_limit() {
        let anchor = 2_000_000_000u64;
        let (r, i) = in_turns(60, anchor);
        let d = r.device(i);
        d.set_turn_fill_milli(909);
        let start = anchor + 10 * turns::PERIOD_NS;
        // The launches span 1 / 0.909 of their cost.
        let (gpu, now, _) = one_period(d, start, 50_000, 55_000);
        // 60 % of 100 ms at a fill of 0.909: 54.5 ms of cost, 60 ms of span.
        assert!(
            (54_500_000..=54_600_000).contains(&gpu),
            "{gpu} ns admitted"
        );
        assert!(
            (59_900_000..=60_100_000).contains(&(now - start)),
            "spanned {}",
            now - start
        );
        // Without turns the fill is not used: 0.6 ms at 60 % is 1 ms of
        // schedule, not 2.
        let (r, i) = entry(60);
        let d = r.device(i);
        d.set_turn_fill_milli(500);
        let now = 10_000_000_000u64;
        assert_eq!(admit(d, 600_000, 600_000, now), Admit::Now(600_000));
        assert_eq!(d.tat_ns.load(Ordering::Relaxed), now + 1_000_000);
    }

    #[test]
    fn paced_a_bucket_tells_when_it_admits_next_and_in_turns_nothing() {
        let (r, i) = entry(10);
        let d = r.device(i);
        let now = 1_000_000_000;
        assert_eq!(paced_ready_in(d, now), Some(0));
        // Run up to its burst, then 1 ms of schedule per 0.1 ms launch.
        while let Admit::Now(_) = admit(d, 100_000, 100_000, now) {}
        assert_eq!(paced_ready_in(d, now), Some(1_000_000));
        assert_eq!(paced_ready_in(d, now + 400_000), Some(600_000));
        // What the next launch would wait.
        let later = now + 400_000;
        let wait = paced_ready_in(d, later).unwrap();
        assert_eq!(admit(d, 100_000, 100_000, later), Admit::Wait(wait));
        // In turns beside others: windows, not a pace; alone, or with
        // its turns paused, a pace again.
        let (r, i) = in_turns(10, 1);
        let t = r.device(i);
        assert_eq!(paced_ready_in(t, now), None);
        t.note_alone(true, now);
        assert_eq!(paced_ready_in(t, now), Some(0));
        t.note_alone(false, now);
        t.set_turn_flag(vgpu_shm::layout::TURNS_PAUSED, true);
        assert_eq!(paced_ready_in(t, now), Some(0));
        let (r, i) = entry(0);
        assert_eq!(paced_ready_in(r.device(i), now), None);
    }

    #[test]
    fn scale_and_zero_limit() {
        assert_eq!(schedule_ns(1_000_000, 50, 1000), 2_000_000);
        assert_eq!(schedule_ns(1_000_000, 50, 2000), 1_000_000);
        let (r, i) = entry(0);
        assert_eq!(
            admit(r.device(i), u64::MAX, u64::MAX, 0),
            Admit::Now(u64::MAX)
        );
    }
}
