//! Carrying a window's verdict out (`judge::judge`, pure): reads what
//! the region and this process know of the container's turns, and
//! writes back the fill, the covered streak, what it leaves unspent and
//! where its turns move. `probes.rs` hands over each window once its
//! probes are in.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use vgpu_shm::EntryIndex;

use super::judge;
use super::turns::{self, Probe};
use crate::attach::Attach;
use crate::process;

/// Judges the window that began at `period`, of a period of `period_ns`
/// (`judge::judge`), and carries the verdict out: the fill it measured,
/// the covered streak, what the container leaves unspent and whether its
/// turns move.
pub fn carry_out(
    attach: &Attach,
    dev: EntryIndex,
    anchor: u64,
    (period, period_ns): (u64, u64),
    timings: &[Probe],
    now: u64,
) {
    let entry = attach.region.device(dev);
    let mine = &process::device(dev).limiter.turns;
    if mine.judged.fetch_max(period, Ordering::Relaxed) >= period {
        return; // judged already, or a later window was
    }
    let w = judge::Window {
        anchor,
        period,
        period_ns,
        probes: timings,
        anchor_now: entry.turn_anchor(),
        moved_ns: entry.turn_moved_ns(),
        // Paced side by side, the windows hold nothing of the container's
        // (it runs beside the others all the time): judged as alone, they
        // measure the fill and build no covered streak, cut and move,
        // which would outlast the pacing (two 50 % containers that began
        // paced, a second before each saw the other on the board, then
        // took each other for neighbours that take no turns, and
        // time-sliced at 0.454 each on a loaded CI host).
        alone: entry.alone(now) || super::pacing::paces_beside_others(entry, now),
        shared: entry.turn_shared(now),
        fill_milli: entry.turn_fill_milli(),
        cut_ns: entry.turn_cut_ns(),
        percent: entry.sm_percent(),
        rate_scale_milli: entry.rate_scale_milli(),
        covered: mine.covered.load(Ordering::Relaxed),
        late: mine.late.load(Ordering::Relaxed),
        nested: mine.nested.load(Ordering::Relaxed),
        ran_on: mine.ran_on.load(Ordering::Relaxed),
        beside_rest: entry.rest_beside(now),
        beside_limited: entry.limited_beside(now),
        tiled: entry.turn_flag(vgpu_shm::layout::TURNS_TILED),
        roomy: entry.turn_flag(vgpu_shm::layout::TURNS_ROOMY),
        random: now ^ u64::from(std::process::id()).rotate_left(17),
    };
    let v = judge::judge(&w);
    if let Some(window) = v.window_fill {
        entry.set_turn_fill_milli(v.fill_milli);
        if v.fill_milli.abs_diff(w.fill_milli) >= 20 {
            log::debug!(
                "turns: fill {:.3} (this window {:.3}, {} probes)",
                v.fill_milli as f64 / 1000.0,
                window as f64 / 1000.0,
                timings.len()
            );
        }
    }
    if v.note_shared {
        entry.note_turn_shared(now);
    }
    mine.covered.store(v.covered, Ordering::Relaxed);
    mine.late.store(v.late, Ordering::Relaxed);
    mine.nested.store(v.nested, Ordering::Relaxed);
    mine.ran_on.store(v.ran_on, Ordering::Relaxed);
    if v.cut_ns != w.cut_ns {
        if v.reason == judge::Reason::Judged {
            log::debug!(
                "turns: leaving {:.1} ms of each share unspent",
                v.cut_ns as f64 / 1e6
            );
        }
        entry.set_turn_cut_ns(v.cut_ns);
    }
    let step = match (v.reason, v.step) {
        (judge::Reason::Alone, _) => {
            log::trace!("turns: window at {period} alone on the device ({timings:?})");
            return;
        }
        (judge::Reason::Moved, _) => {
            log::trace!("turns: window at {period} began before the turns moved ({timings:?})");
            return;
        }
        (judge::Reason::Judged, None) => {
            log::trace!("turns: window at {period} stays ({timings:?})");
            return;
        }
        (judge::Reason::Judged, Some(step)) => {
            log::trace!("turns: window at {period} moves ({timings:?})");
            step
        }
    };
    let (to, how) = match step {
        turns::Move::Later(ns) => (anchor.saturating_add(ns), "later"),
        turns::Move::Earlier(ns) => (anchor.saturating_sub(ns), "earlier"),
    };
    if entry.move_turn(anchor, to, now) {
        log::debug!(
            "turns: the window met another context ({} of {} probes); moved {:.1} ms {how}",
            timings.iter().filter(|p| p.beside_another()).count(),
            timings.len(),
            anchor.abs_diff(to) as f64 / 1e6
        );
    }
}
