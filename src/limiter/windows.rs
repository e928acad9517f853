//! Finished probes (`probes.rs`) gathered into the windows they timed
//! (pure): the probes in so far of the window still running, whose fill
//! converts the rest of its share (`fill::live_fill_milli`), and the
//! windows that can be judged (`judge.rs`).
#![forbid(unsafe_code)]

use vgpu_shm::EntryIndex;

use super::turns::{self, Probe};

/// One window of a device's turns: its anchor, the start of its period
/// and the period's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Window {
    pub dev: EntryIndex,
    pub anchor: u64,
    pub period: u64,
    pub period_ns: u64,
}

/// A finished probe, and the window it timed.
pub struct Done {
    pub window: Window,
    /// When it opened (monotonic ns): a window's probes are judged in
    /// that order.
    pub opened_ns: u64,
    pub probe: Probe,
}

/// A window of a `period_ns` period whose probes are not all in by then
/// is judged without them. (Four periods.)
fn stale_ns(period_ns: u64) -> u64 {
    4 * period_ns
}

/// The probes of `dev`'s window of the period that began at `period`, in
/// the order they opened.
fn probes_of(done: &[Done], dev: EntryIndex, period: u64) -> Vec<Probe> {
    let mut mine: Vec<&Done> = done
        .iter()
        .filter(|d| d.window.dev == dev && d.window.period == period)
        .collect();
    mine.sort_by_key(|d| d.opened_ns);
    mine.iter().map(|d| d.probe).collect()
}

/// The finished probes of `dev`'s window that is still running at `now`,
/// in the order they opened (none once a later window has begun).
pub fn running(done: &[Done], dev: EntryIndex, now: u64) -> Vec<Probe> {
    let Some(last) = done
        .iter()
        .map(|d| d.window)
        .filter(|w| w.dev == dev)
        .max_by_key(|w| w.period)
    else {
        return Vec::new();
    };
    if turns::period_start(last.anchor, now, last.period_ns) > last.period {
        return Vec::new();
    }
    probes_of(done, dev, last.period)
}

/// Takes out of `done` the windows that can be judged: a later window of
/// the same device has begun and none of their probes is still in flight
/// (`in_flight`: whether a probe of that device and period waits for
/// its end event), or they are stale. Each comes with its probes in the order
/// they opened.
pub fn ready(
    done: &mut Vec<Done>,
    in_flight: impl Fn(EntryIndex, u64) -> bool,
    now: u64,
) -> Vec<(Window, Vec<Probe>)> {
    let mut windows: Vec<Window> = done
        .iter()
        .map(|d| d.window)
        .filter(|w| {
            let later = turns::period_start(w.anchor, now, w.period_ns) > w.period;
            let waiting = in_flight(w.dev, w.period);
            later && (!waiting || now.saturating_sub(w.period) > stale_ns(w.period_ns))
        })
        .collect();
    windows.sort_unstable();
    windows.dedup();
    windows
        .into_iter()
        .map(|w| {
            let timings = probes_of(done, w.dev, w.period);
            done.retain(|d| !(d.window.dev == w.dev && d.window.period == w.period));
            (w, timings)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::turns::tests::clean;

    const MS: u64 = 1_000_000;
    const P: u64 = 100 * MS;

    fn done(dev: usize, period: u64, opened_ms: u64, cost_ms: u64) -> Done {
        Done {
            window: Window {
                dev: EntryIndex::new(dev).unwrap(),
                anchor: 7 * MS,
                period,
                period_ns: P,
            },
            opened_ns: period + opened_ms * MS,
            probe: clean(cost_ms),
        }
    }

    #[test]
    fn the_running_window_holds_only_its_own_probes_until_the_next_begins() {
        let (before, running_at) = (7 * MS + 10 * P, 7 * MS + 11 * P);
        let all = [
            done(0, running_at, 6, 3),
            done(0, before, 1, 9),
            done(1, running_at, 1, 8),
            done(0, running_at, 2, 2),
        ];
        let dev = EntryIndex::new(0).unwrap();
        // Mid-window: device 0's probes of this window, in the order they
        // opened; not the last window's, nor another device's.
        let got = running(&all, dev, running_at + 40 * MS);
        assert_eq!(got, [clean(2), clean(3)]);
        // Once the next window has begun, this one is for the judge.
        assert!(running(&all, dev, running_at + P).is_empty());
        assert!(running(&[], dev, running_at).is_empty());
    }

    #[test]
    fn a_window_is_ready_once_a_later_one_began_and_its_probes_are_in() {
        let (before, running_at) = (7 * MS + 10 * P, 7 * MS + 11 * P);
        let dev0 = EntryIndex::new(0).unwrap();
        let mut all = vec![
            done(0, before, 5, 4),
            done(0, running_at, 1, 1),
            done(0, before, 1, 9),
            done(1, before, 1, 8),
        ];
        let now = running_at + 10 * MS;
        // Device 1's earlier window still has a probe in flight: it waits.
        let dev1 = EntryIndex::new(1).unwrap();
        let waits = |dev, period| (dev, period) == (dev1, before);
        let got = ready(&mut all, waits, now);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0.dev, got[0].0.period), (dev0, before));
        assert_eq!(got[0].1, [clean(9), clean(4)]);
        // Taken out; the running window and device 1's stay.
        assert_eq!(all.len(), 2);
        // Five periods on: the running window is over, and device 1's is
        // stale and judged without the probe in flight.
        let late = ready(&mut all, waits, before + 5 * P);
        assert_eq!(late.len(), 2);
        assert_eq!((late[0].0.dev, late[0].0.period), (dev0, running_at));
        assert_eq!(
            (late[1].0.dev, late[1].1.as_slice()),
            (dev1, &[clean(8)][..])
        );
        assert!(all.is_empty());
    }
}
