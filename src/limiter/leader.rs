//! The elected controller of a device's bucket. One process of the
//! container leads each limited device (a lease in the region, renewed
//! every tick, taken over after 3 s of silence or when its holder dies);
//! it reads NVML's per-process SM utilisation for the container's
//! processes and steers the bucket's refill scale.
//!
//! When utilisation samples cannot be had (NVML missing, unsupported, or a
//! process of the container whose host pid is unknown) it says so once and
//! leaves the scale at 1.0: the bucket then runs open-loop on event-timed
//! costs (0.30 +- 0.003 for 1 ms and 10 ms kernels in a prototype on an
//! H200). It never runs unlimited.
//!
//! While processes of other containers use the GPU too, the scale is held
//! where it is. NVML does not measure a process's share of a time-sliced
//! GPU over a control period: it hands each of its sample periods to one
//! process, so over half a second a container at 0.2 reads 0, 0.33, 0.5
//! or 0.99 (docs/benchmarks.md, run 14), and steering on that pulled a
//! 30 % tenant down to 0.19. The event-timed costs, which count a kernel's
//! own time (see `estimate`), then pace the bucket on their own. Who
//! counts as a neighbour, and for how long, is `neighbours`. Every control
//! period it also notes in the region whether the container is alone on
//! the device, for the turns (`alone_ns`, [`alone_on`]), and whether the
//! limits on it leave room to pace beside others (`pacing`).
#![forbid(unsafe_code)]

use vgpu_shm::procinfo::pid_exists;
use vgpu_shm::{EntryIndex, MAX_DEVICES, SlotIndex};

use super::controller::Controller;
use super::neighbours::Neighbours;
use super::readings::{alone_on, container_utilisation};
use crate::attach::Attach;
use crate::clock;
use crate::nvml::client;

/// Seconds without a heartbeat before another process takes over.
const LEASE_S: u64 = 3;
const CONTROL_PERIOD_NS: u64 = 500_000_000;
/// A bucket idle this long starts its next workload at scale 1.0.
const IDLE_RESET_NS: u64 = 10_000_000_000;
/// No step in this long after leading starts or the bucket wakes from
/// idle: NVML's figure then still averages in the time before the
/// workload (or a neighbour) was there.
const SETTLE_NS: u64 = 2_000_000_000;
/// A neighbour is seen up to this long after it began: once seen, the
/// scale goes back to what it was this long before.
const NEIGHBOUR_LAG_NS: u64 = 2_000_000_000;
/// Control steps remembered for that.
const HISTORY: usize = 8;
/// The utilisation the region shows (for `vgpuctl` and node monitors) is
/// NVML's over this many control periods (2 s): under time-slicing one
/// period's figure is a coin toss between the processes.
const SHOWN: usize = 4;

#[derive(Default)]
struct Device {
    leading: bool,
    last_seen_us: u64,
    last_control_ns: u64,
    last_waits: u64,
    /// The bucket's admitted GPU time at the last control period.
    last_admitted_ns: u64,
    /// The GPU time admitted launches typically hold, then.
    last_held_ns: u64,
    /// No step before this (CLOCK_MONOTONIC ns).
    settle_until_ns: u64,
    /// Processes of other containers seen using the device.
    neighbours: Neighbours,
    /// Whether they counted as present at the last control period.
    neighbours_present: bool,
    /// Whether the container paces beside others (the node's SM board).
    pacing: super::pacing::Pacing,
    /// (when, scale ×1000) of the last control steps, round robin.
    history: [(u64, u32); HISTORY],
    next: usize,
    /// The last readings' (slot, utilisation) pairs, round robin.
    shown: [Vec<(SlotIndex, f64)>; SHOWN],
    shown_next: usize,
}

impl Device {
    fn remember(&mut self, now: u64, scale_milli: u32) {
        self.history[self.next % HISTORY] = (now, scale_milli);
        self.next += 1;
    }

    /// The scale in force `NEIGHBOUR_LAG_NS` ago (the oldest remembered
    /// one if the history is shorter).
    fn scale_before_neighbours(&self, now: u64) -> Option<u32> {
        let cutoff = now.saturating_sub(NEIGHBOUR_LAG_NS);
        let known = self.history.iter().filter(|(t, _)| *t != 0);
        known
            .clone()
            .filter(|(t, _)| *t <= cutoff)
            .max_by_key(|(t, _)| *t)
            .or_else(|| known.min_by_key(|(t, _)| *t))
            .map(|&(_, s)| s)
    }

    /// Writes the mean of the last readings into the region: each slot's
    /// SM utilisation (percent) and the container's (×1000).
    fn show(
        &mut self,
        region: &vgpu_shm::Region,
        dev: EntryIndex,
        per_slot: Vec<(SlotIndex, f64)>,
    ) {
        self.shown[self.shown_next % SHOWN] = per_slot;
        self.shown_next += 1;
        let n = self.shown_next.min(SHOWN) as f64;
        let mut total = 0.0;
        for i in region.occupied_slots() {
            let sum: f64 = self
                .shown
                .iter()
                .flatten()
                .filter(|(s, _)| *s == i)
                .map(|(_, u)| u)
                .sum();
            let mean = sum / n;
            region.set_sm_util(i, dev, (mean * 100.0).round() as u32);
            total += mean;
        }
        region
            .device(dev)
            .set_util_milli((total.min(1.0) * 1000.0).round() as u32);
    }
}

#[derive(Default)]
pub struct Leader {
    devices: [Device; MAX_DEVICES],
}

fn monotonic_s() -> u64 {
    clock::monotonic_ns() / 1_000_000_000
}

impl Leader {
    /// One watcher tick for device entry `dev`.
    pub fn tick(&mut self, attach: &Attach, dev: EntryIndex) {
        let entry = attach.region.device(dev);
        let state = &mut self.devices[dev.get()];
        let me = std::process::id();
        // A container without a limit may take the rest beside limited
        // ones (`rest.rs`): its leader watches the board.
        // (A rest left in the region by a leader that yielded is cleared
        // by the next leader that does not: processes of one container
        // may have been started with different settings, and only the
        // leader decides.)
        let unlimited = entry.sm_limit() == 0;
        let resting = unlimited && super::rest::yields();
        let control = attach.region.sm_control_on(dev);
        if !control && unlimited && entry.rest_percent() != 0 {
            entry.set_rest_percent(0); // (the policy went `disable`)
        }
        let governed = !unlimited || resting || entry.rest_percent() != 0;
        if !governed
            || !control
            || !entry.elect_leader(me, monotonic_s(), LEASE_S, |p| pid_exists(p as i32))
        {
            // (Its slot on the SM board, if any, goes with its descriptor.)
            state.pacing = Default::default();
            state.leading = false;
            return;
        }
        if unlimited && !resting {
            // The leader does not yield (`VGPU_SM_YIELD=false`).
            entry.set_rest_percent(0);
            super::tiling::unplace(entry);
            state.pacing.withdraw();
            state.leading = false;
            return;
        }
        if resting && super::rest::take(&mut state.pacing, entry, dev) == 0 {
            // Free again: nothing to place.
            super::tiling::unplace(entry);
            state.leading = false;
            return;
        }
        let percent = entry.sm_percent();
        // Processes of one container would share each window and
        // time-slice within it: on an H200 two sharing 30 % in turns ran
        // spin kernels at 0.363 (run 40). They are paced as before turns.
        let users = attach
            .region
            .occupied_slots()
            .filter(|&s| attach.region.slot_total(s, dev) > 0)
            .count();
        entry.set_turn_flag(vgpu_shm::layout::TURNS_PAUSED, users > 1);
        let now = clock::monotonic_ns();
        let gaps = attach.region.host_gap_ns(dev);
        if !state.leading {
            // A new leader: most often a new program of the container,
            // whose windows' fill is its own to measure, not its
            // predecessor's (until measured, shares are not converted).
            // Nor is a place its own until its board reads agree
            // (`tiling::Placer`): a flag left by one that exited would
            // keep its windows from moving meanwhile.
            entry.set_turn_fill_milli(0);
            super::tiling::unplace(entry);
            entry.note_alone(alone_on(attach, dev) == Some(true), now);
            *state = Device {
                leading: true,
                last_seen_us: clock::unix_us(),
                last_control_ns: now,
                last_waits: entry.waits(),
                last_admitted_ns: entry.admitted_ns(),
                last_held_ns: entry.held_ns(),
                settle_until_ns: now + SETTLE_NS,
                // (What its predecessors admitted is not work of its own:
                // an idle new leader must not show busy on the board. A
                // board it watched for its rest stays open.)
                pacing: std::mem::take(&mut state.pacing).restart(entry.admitted_ns()),
                ..Device::default()
            };
            log::debug!("leading the compute bucket of device entry {dev}");
            return;
        }
        let period_ns = now.saturating_sub(state.last_control_ns);
        if period_ns < CONTROL_PERIOD_NS {
            state
                .pacing
                .tick(entry, &entry.uuid(), (percent, resting), gaps, now);
            return;
        }
        state.last_control_ns = now;
        let alone = alone_on(attach, dev) == Some(true);
        entry.note_alone(alone, now);
        state
            .pacing
            .tick(entry, &entry.uuid(), (percent, resting), gaps, now);
        let admitted = entry.admitted_ns();
        let admitted_share =
            admitted.saturating_sub(state.last_admitted_ns) as f64 / period_ns as f64;
        state.last_admitted_ns = admitted;
        let held = entry.held_ns();
        let held_share = held_share(
            held.saturating_sub(state.last_held_ns),
            admitted_share,
            period_ns,
        );
        state.last_held_ns = held;
        if now.saturating_sub(entry.schedule_ns()) > IDLE_RESET_NS {
            entry.set_rate_scale_milli(1000);
            state.settle_until_ns = now + SETTLE_NS;
        }
        let Some(reading) = container_utilisation(attach, dev, &mut state.last_seen_us) else {
            entry.set_rate_scale_milli(1000);
            return;
        };
        let waits = entry.waits();
        let throttled = waits != state.last_waits;
        state.last_waits = waits;
        let mut scale_milli = entry.rate_scale_milli();
        // (NVML shows a caller in a pid namespace only that namespace's
        // processes: in a pod, a neighbour shows only as not being alone.)
        let present = !alone
            || state.neighbours.present(now, &reading.busy_neighbours, || {
                let nd = client::device(&entry.uuid())?;
                let list = client::processes(nd).ok()?;
                Some(list.into_iter().map(|(pid, _)| pid).collect())
            });
        if present && !state.neighbours_present {
            // Steps taken while the neighbour went unseen were misled.
            scale_milli = state.scale_before_neighbours(now).unwrap_or(scale_milli);
            entry.set_rate_scale_milli(scale_milli);
        }
        state.neighbours_present = present;
        let misread = misattributed(reading.ours, admitted_share);
        let beside_others = present || misread || entry.turn_shared(clock::monotonic_ns());
        state.show(
            &attach.region,
            dev,
            shown(reading.per_slot, beside_others.then_some(held_share)),
        );
        if present || misread || now < state.settle_until_ns {
            log::debug!(
                "control dev {dev}: scale held at {:.3} ({}; measured {:.3})",
                f64::from(scale_milli) / 1000.0,
                if present {
                    "neighbours on the device"
                } else if misread {
                    "NVML counts more than the bucket admitted"
                } else {
                    "settling"
                },
                reading.ours
            );
            state.remember(now, scale_milli);
            return;
        }
        let mut c = Controller::new(f64::from(scale_milli) / 1000.0);
        let target = f64::from(percent) / 100.0;
        let scale = c.update(target, reading.ours, throttled);
        log::debug!(
            "control dev {dev}: target {target:.3} measured {:.3} throttled {throttled} scale {:.3} -> {scale:.3}",
            reading.ours,
            f64::from(scale_milli) / 1000.0
        );
        let scale_milli = (scale * 1000.0).round() as u32;
        entry.set_rate_scale_milli(scale_milli);
        state.remember(now, scale_milli);
    }
}

/// What the region shows of each process of the container this period: NVML's
/// figures, or, beside other containers (`held`: the share of the period its
/// admitted launches typically held, [`held_share`]), that share, split among
/// the processes as NVML split it (evenly when NVML saw none of them). NVML
/// hands each of its sample periods to one process, so beside others its
/// figures are not shares: four containers at 0.24 each read 0.00, 0.00, 0.14
/// and 0.83 on an H200 (docs/benchmarks.md, run 46).
fn shown(per_slot: Vec<(SlotIndex, f64)>, held: Option<f64>) -> Vec<(SlotIndex, f64)> {
    let Some(held) = held else {
        return per_slot;
    };
    let held = held.clamp(0.0, 1.0);
    let seen: f64 = per_slot.iter().map(|(_, u)| u).sum();
    let n = per_slot.len() as f64;
    per_slot
        .into_iter()
        .map(|(slot, u)| match seen > 0.0 {
            true => (slot, held * u / seen),
            false => (slot, held / n),
        })
        .collect()
}

/// The share of a `period_ns` that the container's admitted launches
/// typically held (`held_ns` of it), at least what its bucket admitted
/// (`admitted`, a share): a process of layout 2.2 or older adds nothing
/// to the held time.
fn held_share(held_ns: u64, admitted: f64, period_ns: u64) -> f64 {
    (held_ns as f64 / period_ns.max(1) as f64).max(admitted)
}

/// Whether NVML's figure for the container (`ours`) is far more than
/// the GPU time its bucket admitted (`admitted`, a fraction of the same
/// period): NVML hands a sample period to one process, and beside a
/// container it does not list (another pid namespace) or shows idle, it
/// gives that one's time to us. On an H200 a 60 % container running in
/// turns beside a 30 % one read 0.62 at a scale of 0.5, when it used
/// 0.33 (docs/benchmarks.md, run 39). Stepping on that would halve it.
fn misattributed(ours: f64, admitted: f64) -> bool {
    ours > admitted * 1.25 + 0.05
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beside_others_the_region_shows_the_held_time_split_as_nvml_split_it() {
        let (a, b) = (SlotIndex::new(0).unwrap(), SlotIndex::new(3).unwrap());
        let nvml = vec![(a, 0.6), (b, 0.2)];
        // Alone: NVML's figures as they are.
        assert_eq!(shown(nvml.clone(), None), nvml);
        // Beside others: the held 0.3, three to one.
        let got = shown(nvml, Some(0.3));
        assert_eq!(got.len(), 2);
        assert!((got[0].1 - 0.225).abs() < 1e-9 && (got[1].1 - 0.075).abs() < 1e-9);
        // NVML saw neither (it gave its periods to a neighbour): evenly.
        let got = shown(vec![(a, 0.0), (b, 0.0)], Some(0.3));
        assert!(got.iter().all(|&(_, u)| (u - 0.15).abs() < 1e-9));
        // A share beyond the device is the device.
        assert_eq!(shown(vec![(a, 0.0)], Some(7.0)), vec![(a, 1.0)]);
        assert!(shown(Vec::new(), Some(0.3)).is_empty());
    }

    #[test]
    fn the_held_share_is_the_typical_time_and_never_less_than_the_admitted() {
        let half_s = 500_000_000;
        assert!((held_share(300_000_000, 0.57, half_s) - 0.6).abs() < 1e-9);
        // Only older libraries admitted: their cost is all there is.
        assert_eq!(held_share(0, 0.3, half_s), 0.3);
        assert_eq!(held_share(5, 0.0, 0), 5.0);
    }

    #[test]
    fn nvml_counting_far_more_than_was_admitted_is_a_misreading() {
        assert!(misattributed(0.62, 0.33));
        assert!(misattributed(0.97, 0.6));
        assert!(!misattributed(0.62, 0.6));
        assert!(!misattributed(0.33, 0.30));
        // Under-reading (a container NVML shows idle) is left to the
        // controller, which takes no step on a reading of 0.
        assert!(!misattributed(0.0, 0.30));
    }

    #[test]
    fn a_neighbour_seen_late_gets_the_scale_from_before_it_came() {
        let mut d = Device::default();
        assert_eq!(d.scale_before_neighbours(10_000_000_000), None);
        let s = 1_000_000_000;
        // Steady at 1.0, then three steps misled by an unseen neighbour.
        for (t, scale) in [(1, 1000), (2, 1000), (3, 1000), (4, 800), (5, 640)] {
            d.remember(t * s / 2 + 10 * s, scale);
        }
        // At 12.5 s the neighbour is seen: 2 s earlier the scale was 1.0.
        assert_eq!(d.scale_before_neighbours(12 * s + s / 2), Some(1000));
        // A history shorter than the lag gives its oldest entry.
        let mut short = Device::default();
        short.remember(10 * s, 1250);
        short.remember(10 * s + s / 2, 900);
        assert_eq!(short.scale_before_neighbours(11 * s), Some(1250));
        // Only the last HISTORY steps are kept.
        for i in 0..20 {
            short.remember(20 * s + i * s / 2, 1000 + i as u32);
        }
        assert_eq!(short.scale_before_neighbours(30 * s), Some(1016));
        // Older ones are gone: the oldest kept stands in.
        assert_eq!(short.scale_before_neighbours(26 * s), Some(1012));
    }
}
