//! A container's fill in turns: how full its launches keep the GPU in
//! its windows (their cost over the time they span), measured by the
//! probes (`probes.rs`) and judged per window (`judge.rs`), and the scale
//! its share runs at once converted by it, so that a window spans its
//! limit's part of the period (`turns.rs`, `bucket.rs`).
#![forbid(unsafe_code)]

use super::turns::Probe;

/// The fill a window's share is converted by stays within these (×1000).
/// A few odd windows, or a cost not learned yet, cannot halve a
/// container's time. A fill over 1 (launches charged more than they
/// span: a cost that holds the launch latency) counts as 1, so the
/// window spans a little less than its part of the period; limits that
/// sum to the whole period need that room (on the simulator, 50 + 50
/// with a fill of 1.044 left the windows none, and one got 0.42).
pub const MIN_FILL_MILLI: u64 = 500;
pub const MAX_FILL_MILLI: u64 = 1000;

/// The scale a container's turns run at: the controller's
/// (`scale_milli`) times the fill of its windows (`fill_milli`, 0: not
/// measured yet).
///
/// What neighbours share is the period's time, not the cost of the
/// launches in it: a window takes the GPU from its first launch to its
/// last one's end. A host-bound stream of 0.05 ms kernels keeps the GPU
/// 91 % busy, so 60 ms of its launches' cost spans 66 ms, and beside a
/// 30 % container that left 1 ms of the period (0.545 for a 60 % limit,
/// docs/benchmarks.md run 43). Converted by its fill, a share spans its
/// limit's part of the period; alone, the controller's NVML steering then
/// corrects what is left.
pub fn turn_scale_milli(scale_milli: u32, fill_milli: u64) -> u32 {
    let fill = match fill_milli {
        0 => 1000,
        f => f.clamp(MIN_FILL_MILLI, MAX_FILL_MILLI),
    };
    let scaled = u64::from(scale_milli.min(4000)) * fill / 1000;
    // (At most 4000 × 1000 / 1000: fits.)
    u32::try_from(scaled).unwrap_or(u32::MAX).max(1)
}

/// What one window says of its fill: the median of its clean probes'
/// cost over the time they took, ×1000, where at least half of them ran
/// beside no other context (a probe beside another shows the
/// other's time, not how full this container keeps the GPU). The median
/// leaves out the first or last probe that met the tail of a neighbour's
/// window. Judged on clean windows only, the fill of a power-bound GEMM,
/// whose cost follows its wandering clock (1.41-1.65 ms for the same
/// kernel within a second on an H100), was measured so seldom, as most
/// windows met the other's at an edge, that it stayed at 1.0 while a
/// window of 50 ms of cost spanned 58 (50 + 50 at 0.459 + 0.473, run 142).
pub fn window_fill_milli(probes: &[Probe]) -> Option<u64> {
    let clean = probes.iter().filter(|p| !p.beside_another()).count();
    if clean == 0 || clean < probes.len().div_ceil(2) {
        return None;
    }
    let mut fills: Vec<u64> = probes
        .iter()
        .filter(|p| p.elapsed_ns > 0 && !p.beside_another())
        .map(|p| p.cost_ns.saturating_mul(1000) / p.elapsed_ns)
        .collect();
    fills.sort_unstable();
    let median = *fills.get(fills.len() / 2)?;
    Some(median.clamp(MIN_FILL_MILLI, MAX_FILL_MILLI))
}

/// The clean probes a running window needs in before what they say of
/// its fill stands for the rest of it ([`live_fill_milli`]): the median
/// of three leaves out one odd probe (a host hiccup, a neighbour's last
/// kernel).
pub const LIVE_PROBES: usize = 3;

/// What the finished probes of the window now running say of its fill
/// ([`window_fill_milli`]), once [`LIVE_PROBES`] clean ones are in: it
/// converts the rest of that window's share, so that the window ends near
/// its part of the period when the cost of its launches has moved since
/// the windows before. A power-bound GEMM's clock wanders within a
/// second: a window's fill ranged 0.88-1.00 (p10-p90), so a window of 50
/// ms of cost spanned 50 to 57 ms, and each of two 50 % containers left
/// 4.6-5.4 ms of its share unspent on average to keep clear of the other
/// (H200, run 219); converted so, 3.4-4.3 ms, and the pair got
/// 0.479-0.490 each in 8 runs (runs 220-221). Written so, the fill a
/// window is judged with is nearly its own, and [`next_fill_milli`]
/// keeps about the last window's:
/// an odd window sets only its own rest and the next one's first probes.
pub fn live_fill_milli(probes: &[Probe]) -> Option<u64> {
    if probes.iter().filter(|p| !p.beside_another()).count() < LIVE_PROBES {
        return None;
    }
    window_fill_milli(probes)
}

/// The fill after a window that measured `window`: a running average
/// over about two windows (from the first one measured), so that it
/// follows a cost that wanders with the clock within a few periods. (In
/// turns, a running window's own probes have set the fill already,
/// [`live_fill_milli`], so there it keeps about the last window's.)
pub fn next_fill_milli(fill_milli: u64, window: u64) -> u64 {
    match fill_milli {
        0 => window,
        f => {
            let f = f.clamp(MIN_FILL_MILLI, MAX_FILL_MILLI);
            (f + window).div_ceil(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::turns::tests::shared;
    use crate::limiter::turns::{self, share_ns};

    fn timed(cost_us: u64, elapsed_us: u64) -> Probe {
        Probe {
            stream: Default::default(),
            cost_ns: cost_us * 1000,
            elapsed_ns: elapsed_us * 1000,
            dry_ns: 0,
        }
    }

    #[test]
    fn a_clean_window_measures_its_fill_and_a_neighbour_s_tail_does_not_count() {
        // A host-bound stream: 3 ms of launches span 3.3 ms.
        let host_bound = [timed(3000, 3300); 5];
        assert_eq!(window_fill_milli(&host_bound), Some(909));
        // The first probe met a neighbour's last kernel (0.9 ms: not a
        // neighbour by `beside_another`): the median leaves it out.
        let mut tail = host_bound;
        tail[0] = timed(3000, 3900);
        assert!(!tail[0].beside_another());
        assert_eq!(window_fill_milli(&tail), Some(909));
        // A probe beside another context is left out, while at least half
        // the window's probes are clean.
        tail[2] = shared(3, 3);
        assert_eq!(window_fill_milli(&tail), Some(909));
        tail[3] = shared(3, 3);
        assert_eq!(window_fill_milli(&tail), Some(909));
        tail[4] = shared(3, 3);
        assert_eq!(window_fill_milli(&tail), None);
        assert_eq!(window_fill_milli(&[timed(3000, 3300)]), Some(909));
        assert_eq!(window_fill_milli(&[shared(3, 3)]), None);
        assert_eq!(window_fill_milli(&[]), None);
        // Bounded whatever the timings: a probe that took no time, or a
        // cost far over its span.
        assert_eq!(window_fill_milli(&[timed(3000, 0)]), None);
        assert_eq!(
            window_fill_milli(&[timed(9000, 1000)]),
            Some(MAX_FILL_MILLI)
        );
        assert_eq!(window_fill_milli(&[timed(3100, 3000)]), Some(1000));
        assert_eq!(
            window_fill_milli(&[timed(3000, 3900), timed(1000, 2000)]),
            Some(769)
        );
    }

    #[test]
    fn a_running_window_s_fill_stands_once_three_of_its_probes_are_in() {
        // The clock slowed: 3 ms of cost now spans 3.4 ms.
        let slow = [timed(3000, 3400); 3];
        assert_eq!(live_fill_milli(&slow[..2]), None, "too few yet");
        assert_eq!(live_fill_milli(&slow), Some(882));
        // Beside another context they say nothing of the fill.
        let met = [timed(3000, 3400), shared(3, 3), shared(3, 3)];
        assert_eq!(live_fill_milli(&met), None);
        // Three clean ones are needed, whatever else is in.
        let mut some = [timed(3000, 3400); 5];
        some[0] = shared(3, 3);
        some[3] = shared(3, 3);
        assert_eq!(live_fill_milli(&some), Some(882));
        some[4] = shared(3, 3);
        assert_eq!(live_fill_milli(&some), None);
        assert_eq!(live_fill_milli(&[timed(3000, 0); 3]), None);
    }

    #[test]
    fn the_fill_settles_on_what_windows_measure_and_scales_the_share() {
        let mut fill = 0;
        fill = next_fill_milli(fill, 909);
        assert_eq!(fill, 909, "the first window sets it");
        for _ in 0..20 {
            fill = next_fill_milli(fill, 950);
        }
        assert!((949..=951).contains(&fill), "{fill}");
        // A 60 % share at a fill of 0.909 is 54.5 ms of cost: 60 ms of span.
        let scale = turn_scale_milli(1000, 909);
        assert_eq!(scale, 909);
        assert_eq!(share_ns(60, scale, turns::PERIOD_NS), 54_540_000);
        // Not measured: the controller's scale alone. Hostile values stay
        // bounded.
        assert_eq!(turn_scale_milli(1200, 0), 1200);
        assert_eq!(turn_scale_milli(1000, 1), 500);
        assert_eq!(turn_scale_milli(u32::MAX, u64::MAX), 4000);
        assert_eq!(turn_scale_milli(1000, 1044), 1000);
        assert_eq!(turn_scale_milli(0, 0), 1);
        assert_eq!(
            next_fill_milli(u64::MAX, 1000),
            (MAX_FILL_MILLI + 1000).div_ceil(2)
        );
        // Half of each window's word: a cost that fell 15 % with the
        // clock is followed within three windows.
        let mut fill = 1000;
        for _ in 0..3 {
            fill = next_fill_milli(fill, 870);
        }
        assert!((870..=890).contains(&fill), "{fill}");
    }
}
