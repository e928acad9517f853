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
//! So where a thread's synchronisation returns after a launch the bucket
//! admitted, it waits there for what the schedule still asks of the next
//! launch, less what the host took from such a return to its next launch
//! the last time (a loop that computes on the host between its steps
//! overlaps the two, as before). A step then takes its pace or what the
//! GPU made it wait, whichever is longer, not both; the next launch goes
//! at once. The rate is the bucket's as before: host work that runs
//! longer than the last time is made up from the bucket's burst
//! ([`bucket::BURST_NS`](super::bucket::BURST_NS)). In turns nothing
//! changes: a window's launches wait for the next window where they
//! begin.
#![forbid(unsafe_code)]

use std::cell::Cell;

use vgpu_shm::EntryIndex;

use super::{bucket, pause};
use crate::attach::Attach;
use crate::{clock, process};

/// The most a synchronisation waits for the bucket: a longer wait is left
/// to the next launch (a loop's last synchronisation before it exits
/// should not wait out a long step's pace).
pub const MOST_NS: u64 = 20_000_000;

/// What this thread's last admitted launch left owing, until its next
/// synchronisation.
#[derive(Clone, Copy)]
struct Owed {
    dev: EntryIndex,
    cost_ns: u64,
}

thread_local! {
    static OWED: Cell<Option<Owed>> = const { Cell::new(None) };
    /// When this thread's last settling synchronisation returned (0:
    /// none since its last launch), and how long the host then took to
    /// its next launch.
    static RETURNED_NS: Cell<u64> = const { Cell::new(0) };
    static HOST_NS: Cell<u64> = const { Cell::new(0) };
}

/// A launch of `cost_ns` on device entry `dev` was admitted.
pub(super) fn admitted(dev: EntryIndex, cost_ns: u64) {
    OWED.with(|o| o.set(Some(Owed { dev, cost_ns })));
    let returned = RETURNED_NS.with(|r| r.replace(0));
    if returned != 0 {
        let host = clock::monotonic_ns().saturating_sub(returned);
        HOST_NS.with(|h| h.set(host));
    }
}

/// A synchronisation of this thread returned: waits for the bucket where
/// its last launch was admitted paced (see the module's doc).
pub fn after_sync(attach: &Attach) {
    let Some(owed) = OWED.with(Cell::take) else {
        return;
    };
    let now = clock::monotonic_ns();
    RETURNED_NS.with(|r| r.set(now));
    if !super::enforced(owed.dev) || super::capturing() {
        return;
    }
    // Bought ahead: the next launch spends credit and waits for nothing.
    let cost = i64::try_from(owed.cost_ns).unwrap_or(i64::MAX);
    if process::device(owed.dev).limiter.holds(cost) {
        return;
    }
    let entry = attach.region.device(owed.dev);
    let Some(ready_in) = bucket::paced_ready_in(entry, now) else {
        return;
    };
    let wait = wait_ns(ready_in, HOST_NS.with(Cell::get));
    if wait == 0 {
        return;
    }
    // (The next launch's wait, taken early: counted as its, for the
    // pacing's judging and vgpuctl's throttled launches.)
    entry.count_wait();
    pause(wait, now);
    let after = clock::monotonic_ns();
    RETURNED_NS.with(|r| r.set(after));
    entry.add_wait_ns(after - now);
}

/// How long a synchronisation waits when the bucket would admit a launch
/// in `ready_in` ns and the host took `host_ns` to its next launch the
/// last time.
fn wait_ns(ready_in: u64, host_ns: u64) -> u64 {
    ready_in.saturating_sub(host_ns).min(MOST_NS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::bucket::{Admit, tests::entry};

    /// A synchronised loop of 0.1 ms steps at 10 %, alone on its bucket,
    /// the host taking 0.02 ms between steps, one step in seven meeting a
    /// neighbour's kernel that holds it 0.9 ms longer: each step's
    /// latency, and when the loop ended. `settle`: the pace is waited at
    /// the synchronisation ([`wait_ns`]), else at the next launch.
    fn steps(settle: bool) -> (Vec<u64>, u64) {
        let (r, i) = entry(10);
        let d = r.device(i);
        let (own, host) = (100_000u64, 20_000u64);
        let mut now = 1_000_000_000u64;
        let mut latency = Vec::new();
        for k in 0..2000 {
            let began = now;
            while let Admit::Wait(ns) | Admit::NextWindow(ns) =
                bucket::admit(d, own, 2_000_000, now)
            {
                now += ns;
            }
            now += own + if k % 7 == 3 { 900_000 } else { 0 };
            if settle {
                now += wait_ns(bucket::paced_ready_in(d, now).expect("paced"), host);
            }
            latency.push(now - began);
            now += host;
        }
        (latency, now)
    }

    fn p99(mut v: Vec<u64>) -> u64 {
        v.sort_unstable();
        v[v.len() * 99 / 100]
    }

    #[test]
    fn a_step_that_meets_a_neighbour_waits_for_it_within_its_pace() {
        let (at_launch, ended_then) = steps(false);
        let (at_sync, ended_now) = steps(true);
        // Waited at the next launch, a step that met the neighbour
        // waited for it on top of its pace (1 ms); at its
        // synchronisation, within it.
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
    fn the_wait_is_what_the_schedule_asks_less_the_host_s_work() {
        // 0.1 ms steps at 10 %: 0.9 ms to wait, 0.02 of it on the host.
        assert_eq!(wait_ns(900_000, 20_000), 880_000);
        // Nothing asked, or the host's work covers it.
        assert_eq!(wait_ns(0, 20_000), 0);
        assert_eq!(wait_ns(500_000, 700_000), 0);
        // A loop that computes on the host longer than its pace waits
        // nowhere, as before.
        assert_eq!(wait_ns(6_000_000, 50_000_000), 0);
        // A long step's pace waits at the next launch past the most.
        assert_eq!(wait_ns(90_000_000, 0), MOST_NS);
    }
}
