//! A paced step's wait, taken where the step ends instead of where the
//! next one begins.
//!
//! Paced, the bucket holds each launch until the schedule of the ones
//! before it is paid: a synchronised loop of 0.1 ms steps at 10 % waits
//! about 0.9 ms at each launch. A step whose kernel then meets a
//! neighbour's (a 1 ms kernel of a container taking the rest) waits for
//! that too, on top: 2.0-2.03 ms at its p99 on an H200 against twice the
//! ideal, 2.02 (runs 159-183). Its step has already spent that time on
//! the GPU's side, and the next launch would find the schedule paid.
//!
//! So where a thread runs a steady synchronised loop, its synchronisation
//! waits, once it returns, for what the schedule still asks of the next
//! launch, less the longest the host took from such a return to its next
//! launch of late ([`GAPS`] steps or more). A step then takes its pace or
//! what the GPU made it wait, whichever is longer, not both (1.39 ms in
//! run 186, with the last gap alone for the host's); the next launch goes
//! at once. A thread whose launches also wait on something else now and
//! then (a server between requests, host work that varies, a stall every
//! few dozen steps) has a long gap in view and waits at its next launch,
//! as before: a response is not held back for a request that may not
//! come, and the host's work overlaps the pace. Two limits:
//! - a host stall rarer than that comes after a wait at the
//!   synchronisation; what it runs past the bucket's burst (4 ms) is lost
//!   to the schedule, at most one pace each time (a 14 ms stall every 50
//!   steps of 1 ms at 10 %: 1.9 % of the share, 0.2 % waiting at
//!   the launch);
//! - a server with that many requests queued back to back responds to
//!   each after the next one's pace, not before it (the same throughput).
//!
//! In turns nothing changes: a window's launches wait for the next window
//! where they begin.
#![forbid(unsafe_code)]

use std::cell::Cell;

use vgpu_shm::EntryIndex;
use vgpu_shm::layout::DeviceEntry;

use super::bucket;
use crate::{clock, process};

/// The most a synchronisation waits for the bucket: a longer wait is left
/// to the next launch (a loop's last synchronisation before it exits
/// should not wait out a long step's pace).
pub const MOST_NS: u64 = 20_000_000;

/// For how many steps the longest host gap seen (a synchronisation's
/// return to the next launch) holds, at least: a thread waits at its
/// synchronisation only once that many in a row were short.
pub const GAPS: u32 = 32;

/// What this thread's last admitted launch left owing, until its next
/// synchronisation.
#[derive(Clone, Copy)]
pub(super) struct Owed {
    pub dev: EntryIndex,
    cost_ns: u64,
}

/// The longest of the host's recent gaps from a synchronisation's
/// return to the next launch: of the last [`GAPS`] to twice that many
/// steps; unknown (long) until that many were seen.
#[derive(Clone, Copy)]
struct Gaps {
    longest: u64,
    /// The longest since `longest` was set, and how many steps since.
    since: u64,
    steps: u32,
}

impl Gaps {
    const UNKNOWN: Gaps = Gaps {
        longest: u64::MAX,
        since: 0,
        steps: 0,
    };

    fn note(&mut self, gap_ns: u64) {
        if gap_ns >= self.longest {
            *self = Gaps {
                longest: gap_ns,
                since: 0,
                steps: 0,
            };
            return;
        }
        self.since = self.since.max(gap_ns);
        self.steps += 1;
        if self.steps >= GAPS {
            *self = Gaps {
                longest: self.since,
                since: 0,
                steps: 0,
            };
        }
    }

    fn longest(&self) -> u64 {
        self.longest
    }
}

/// This thread's part: one record, so that a launch reads and writes
/// one thread-local.
#[derive(Clone, Copy)]
struct Thread {
    /// What its last admitted launch left owing, until its next
    /// synchronisation.
    owed: Option<Owed>,
    /// When its last settling synchronisation returned (0: none since its
    /// last launch).
    returned_ns: u64,
    gaps: Gaps,
    /// The next launch's wait was taken, and counted, at a
    /// synchronisation.
    counted: bool,
}

thread_local! {
    static THREAD: Cell<Thread> = const {
        Cell::new(Thread {
            owed: None,
            returned_ns: 0,
            gaps: Gaps::UNKNOWN,
            counted: false,
        })
    };
}

/// What a launch being admitted learnt here.
pub(super) struct Admitted {
    /// A synchronisation already counted its wait (`admit` then counts
    /// none, should it wait a little more).
    pub counted: bool,
    /// How long the host took from this thread's last synchronisation's
    /// return to this launch (0: it is not the first launch since one).
    pub host_gap_ns: u64,
}

/// A launch of `cost_ns` on device entry `dev` is being admitted.
pub(super) fn admitted(dev: EntryIndex, cost_ns: u64) -> Admitted {
    THREAD.with(|cell| {
        let mut t = cell.get();
        t.owed = Some(Owed { dev, cost_ns });
        let mut host_gap_ns = 0;
        if t.returned_ns != 0 {
            host_gap_ns = clock::monotonic_ns().saturating_sub(t.returned_ns);
            t.gaps.note(host_gap_ns);
            t.returned_ns = 0;
        }
        let counted = std::mem::take(&mut t.counted);
        cell.set(t);
        Admitted {
            counted,
            host_gap_ns,
        }
    })
}

/// A synchronisation of this thread returned at `now`: what its last
/// launch left owing, if anything (taken: a second synchronisation owes
/// nothing). The host's gap runs from the last return before the next
/// launch: a second synchronisation's wait (another stream, an event,
/// then the context) is the GPU's, not the host's.
pub(super) fn owed_at(now: u64) -> Option<Owed> {
    THREAD.with(|cell| {
        let mut t = cell.get();
        let owed = t.owed.take();
        if owed.is_some() || t.returned_ns != 0 {
            t.returned_ns = now;
        }
        cell.set(t);
        owed
    })
}

/// How long the synchronisation that returned at `now` waits for
/// `owed`'s bucket, `entry` (see the module's doc): 0 where the process
/// bought the next launch ahead, or the bucket admits in turns.
pub(super) fn wait_at(owed: Owed, entry: &DeviceEntry, now: u64) -> u64 {
    let cost = i64::try_from(owed.cost_ns).unwrap_or(i64::MAX / 2);
    if process::device(owed.dev).limiter.holds(cost) {
        return 0;
    }
    let Some(ready_in) = bucket::paced_ready_in(entry, now) else {
        return 0;
    };
    wait_ns(ready_in, THREAD.with(Cell::get).gaps.longest())
}

/// The synchronisation waited for the bucket until `after`: the next
/// launch's wait was taken, and counted.
pub(super) fn waited_until(after: u64) {
    THREAD.with(|cell| {
        let mut t = cell.get();
        t.counted = true;
        t.returned_ns = after;
        cell.set(t);
    });
}

/// How long a synchronisation waits when the bucket would admit a launch
/// in `ready_in` ns and the host took at most `host_ns` to its next launch
/// in the last steps.
fn wait_ns(ready_in: u64, host_ns: u64) -> u64 {
    ready_in.saturating_sub(host_ns).min(MOST_NS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::bucket::{Admit, tests::entry};

    /// A synchronised loop of `own` ns steps at `percent`, alone on its
    /// bucket, for `n` steps: step `k` waits `gpu(k)` more on the GPU (a
    /// neighbour's kernel) and the host then takes `host(k)` to the next
    /// launch (a server: until the next request). `settle`: the pace is
    /// waited at the synchronisation, as `limiter::settle_at_sync` does, else at the
    /// next launch. Each step's latency, and when the loop ended.
    fn run(
        settle: bool,
        (percent, own, n): (u32, u64, u64),
        gpu: impl Fn(u64) -> u64,
        host: impl Fn(u64) -> u64,
    ) -> (Vec<u64>, u64) {
        let (r, i) = entry(percent);
        let d = r.device(i);
        let mut gaps = Gaps::UNKNOWN;
        let mut now = 1_000_000_000u64;
        let mut latency = Vec::new();
        for k in 0..n {
            let began = now;
            while let Admit::Wait(ns) | Admit::NextWindow(ns) =
                bucket::admit(d, own, 2_000_000, now)
            {
                now += ns;
            }
            now += own + gpu(k);
            if settle {
                let ready = bucket::paced_ready_in(d, now).expect("paced");
                now += wait_ns(ready, gaps.longest());
            }
            latency.push(now - began);
            now += host(k);
            gaps.note(host(k));
        }
        (latency, now)
    }

    #[test]
    fn the_host_gap_runs_from_the_last_synchronisation_before_a_launch() {
        let dev = EntryIndex::new(0).unwrap();
        let long_ago = clock::monotonic_ns() - 5_000_000_000;
        let _ = admitted(dev, 1000);
        assert!(owed_at(long_ago).is_some());
        // A second synchronisation (another stream, then the context)
        // owes nothing, but its wait was the GPU's: the gap starts anew.
        assert!(owed_at(clock::monotonic_ns()).is_none());
        let gap = admitted(dev, 1000).host_gap_ns;
        assert!(gap < 1_000_000_000, "{gap}");
        // Without it, the gap runs from the first return.
        assert!(owed_at(long_ago).is_some());
        assert!(admitted(dev, 1000).host_gap_ns >= 5_000_000_000);
        // A launch that follows a launch has no gap.
        assert_eq!(admitted(dev, 1000).host_gap_ns, 0);
    }

    fn p99(mut v: Vec<u64>) -> u64 {
        v.sort_unstable();
        v[v.len() * 99 / 100]
    }

    fn mean(v: &[u64]) -> u64 {
        v.iter().sum::<u64>() / v.len() as u64
    }

    #[test]
    fn a_step_that_meets_a_neighbour_waits_for_it_within_its_pace() {
        // 0.1 ms steps at 10 %, the host 0.02 ms between them, one step in
        // seven held 0.9 ms by a neighbour's kernel.
        let shape = (10, 100_000, 2000);
        let neighbour = |k| if k % 7 == 3 { 900_000 } else { 0 };
        let (at_launch, ended_then) = run(false, shape, neighbour, |_| 20_000);
        let (at_sync, ended_now) = run(true, shape, neighbour, |_| 20_000);
        // Waited at the next launch, a step that met the neighbour waited
        // for it on top of its pace (1 ms); at its synchronisation,
        // within it.
        let (before, now) = (p99(at_launch), p99(at_sync));
        assert!(before >= 1_800_000, "{before}");
        assert!(now <= 1_010_000, "{now}");
        // The same rate: the loop ends within a step of where it did.
        assert!(
            ended_now.abs_diff(ended_then) <= 1_000_000,
            "{ended_now} {ended_then}"
        );
    }

    #[test]
    fn host_work_that_varies_costs_no_share() {
        // 1 ms steps at 10 % and 30 %, the host taking 0.02 and 6 ms in
        // turn: waiting out the pace less the last gap alone, a 6 ms one
        // after a short one fell past the burst (0.091 for 10 %).
        for percent in [10, 30] {
            let shape = (percent, 1_000_000, 1000);
            let host = |k| if k % 2 == 0 { 20_000 } else { 6_000_000 };
            let (_, ended_then) = run(false, shape, |_| 0, host);
            let (_, ended_now) = run(true, shape, |_| 0, host);
            // (Within one step's pace of 1000: one short gap foretold
            // wrong while the last gaps were learnt.)
            let pace = 1_000_000 * 100 / u64::from(percent);
            assert!(
                ended_now <= ended_then + pace,
                "{percent} %: {ended_now} against {ended_then}"
            );
        }
    }

    /// A one-thread server of 1 ms requests at 10 % (100 a second at
    /// most), arriving `intervals` apart in turn, 0.02 ms of host work
    /// before each launch: each response's time from its request's
    /// arrival. `settle` as in [`run`].
    fn serve(settle: bool, intervals: &[u64], n: usize) -> Vec<u64> {
        let (r, i) = entry(10);
        let d = r.device(i);
        let (own, host) = (1_000_000u64, 20_000u64);
        let mut gaps = Gaps::UNKNOWN;
        let (mut now, mut arrives) = (1_000_000_000u64, 1_000_000_000u64);
        let mut response = Vec::new();
        for k in 0..n {
            arrives += intervals[k % intervals.len()];
            let returned = now;
            now = now.max(arrives) + host;
            gaps.note(now - returned);
            while let Admit::Wait(ns) | Admit::NextWindow(ns) =
                bucket::admit(d, own, 2_000_000, now)
            {
                now += ns;
            }
            now += own;
            if settle {
                let ready = bucket::paced_ready_in(d, now).expect("paced");
                now += wait_ns(ready, gaps.longest());
            }
            response.push(now - arrives);
        }
        response
    }

    #[test]
    fn a_host_stall_now_and_then_costs_no_share() {
        // 1 ms steps at 10 %, the host 0.02 ms between them but 14 ms
        // (logging, a loader) every ninth to thirty-first step: with only
        // the last eight gaps in view, each stall after a wait at the
        // synchronisation fell past the burst (4-10 % of the share).
        for every in [9, 20, 31] {
            let shape = (10, 1_000_000, 2000);
            let host = |k: u64| {
                if k.is_multiple_of(every) {
                    14_000_000
                } else {
                    20_000
                }
            };
            let (_, ended_then) = run(false, shape, |_| 0, host);
            let (_, ended_now) = run(true, shape, |_| 0, host);
            assert!(
                ended_now <= ended_then + 10_000_000,
                "every {every}: {ended_now} against {ended_then}"
            );
        }
    }

    #[test]
    fn a_server_s_response_is_not_held_for_a_request_not_yet_come() {
        // Half the limit's rate, in uneven intervals (20 ms on average):
        // waited at the synchronisation after a short gap, a response
        // would wait out a pace the next request may not need.
        let intervals = [2, 40, 5, 30, 15, 25, 1, 42].map(|ms: u64| ms * 1_000_000);
        let at_launch = serve(false, &intervals, 2000);
        let at_sync = serve(true, &intervals, 2000);
        assert!(
            mean(&at_sync) <= mean(&at_launch) + 100_000,
            "{} against {}",
            mean(&at_sync),
            mean(&at_launch)
        );
    }

    #[test]
    fn the_host_s_time_is_the_longest_of_its_last_gaps_and_unknown_is_long() {
        let mut g = Gaps::UNKNOWN;
        assert_eq!(g.longest(), u64::MAX);
        for _ in 0..GAPS {
            g.note(20_000);
        }
        assert_eq!(g.longest(), 20_000);
        g.note(6_000_000);
        assert_eq!(g.longest(), 6_000_000);
        for _ in 0..GAPS - 1 {
            g.note(30_000);
        }
        assert_eq!(g.longest(), 6_000_000);
        g.note(30_000);
        assert_eq!(g.longest(), 30_000);
        // What expires gives way to the longest since, not the last.
        g.note(100_000);
        g.note(60_000);
        for _ in 0..GAPS - 1 {
            g.note(20_000);
        }
        assert_eq!(g.longest(), 60_000);
    }

    #[test]
    fn a_schedule_from_anywhere_holds_a_synchronisation_at_most_the_most() {
        // Anyone who maps the region can write the schedule: an hour
        // ahead, or the top of the clock, is clamped to a second by the
        // bucket and to [`MOST_NS`] here.
        let (r, i) = entry(50);
        let d = r.device(i);
        let now = 5_000_000_000u64;
        for tat in [now + 3_600_000_000_000, u64::MAX] {
            d.tat_ns.store(tat, std::sync::atomic::Ordering::Relaxed);
            let ready = bucket::paced_ready_in(d, now).expect("paced");
            assert!(ready <= bucket::MAX_AHEAD_NS, "{ready}");
            assert_eq!(wait_ns(ready, 0), MOST_NS);
        }
    }

    #[test]
    fn the_wait_is_what_the_schedule_asks_less_the_host_s_work() {
        // 0.1 ms steps at 10 %: 0.9 ms to wait, 0.02 of it on the host.
        assert_eq!(wait_ns(900_000, 20_000), 880_000);
        // Nothing asked, or the host's work covers it.
        assert_eq!(wait_ns(0, 20_000), 0);
        assert_eq!(wait_ns(500_000, 700_000), 0);
        assert_eq!(wait_ns(6_000_000, u64::MAX), 0);
        // A long step's pace waits at the next launch past the most.
        assert_eq!(wait_ns(90_000_000, 0), MOST_NS);
    }
}
