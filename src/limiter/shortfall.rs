//! Whether a container paced side by side was short of the GPU over a
//! span, and whether it asks for more now (pure); `pacing.rs` keeps the
//! spans and acts on the verdict.
#![forbid(unsafe_code)]

/// Side by side, the contexts' hand-overs cost what the limits leave
/// free, and more where the loops hand over often: 30 + 60 of 0.05 ms
/// kernels synchronised every 0.5 ms got 0.341 + 0.508 on an H100 (run
/// 128; the 60 % one waited in synchronisations 0.65 of the time). A
/// container that waited there over this part of the time,
/// hardly for its bucket, and got under [`SHORT_OF`] of its limit is
/// short of the GPU, not of work: a host-bound loop waits in
/// synchronisations little, and a paced inference loop waits for its
/// bucket (1 ms steps at 30 %: about 0.7 of the time).
pub const SYNC_BOUND: f64 = 0.5;
/// See [`SYNC_BOUND`].
pub const BUCKET_BOUND: f64 = 0.1;
/// See [`SYNC_BOUND`].
pub const SHORT_OF: f64 = 0.93;

/// A span short of the GPU by less than this part of the limit sends the
/// container to turns only after a span before it was short too: 1 ms
/// steps at 50 % paced beside a busy 40 % container get about 0.485 of
/// the GPU, and a span of 300 ms now and then reads under 0.465; one such
/// sent them to turns for 30 s, where one step in 50 waits out the rest of
/// the period (p99 44 ms, H200 run 165; 2.29 ms paced in runs 149, 159 and
/// 166). Loops far short, as short steps beside a busy neighbour (0.14-0.21
/// at 30 %, runs 165-168), ask at once.
pub const FAR_SHORT_OF: f64 = 0.8;

/// The least part of a span a container counts as having had work in.
pub const BUSY_FLOOR: f64 = 0.25;

/// How far over the span a container's host gaps and waits may add up
/// for the gaps to count: one thread's are disjoint, and a gap or a wait
/// counted where it ends may straddle the span's start.
pub const OVERLAP_SLACK: f64 = 0.05;

/// What a container got of the GPU over the part of a span it had work
/// in: `admitted` (a fraction of the span) over what its host gaps leave
/// (`idle`: a synchronisation's return to the next launch, summed over
/// its threads, a fraction). A server of 1 ms requests arriving 250 a
/// second, at 30 % beside a busy 60 % container, got 0.20-0.28 of the GPU
/// paced side by side, waiting in synchronisations 0.64 of the time, and
/// was judged short: in turns a request that missed its 30 ms window
/// waited out the other 70 (p99 117-130 ms against 85; H200 runs 203-204).
/// Over the time it had requests it got about 0.39: it was short of
/// work, not of the GPU.
///
/// Where the gaps and the time it `waited` (in synchronisations and for
/// its bucket, a fraction) add up to more than the span, threads or
/// processes overlapped (one idle between requests while another
/// waited for the GPU), and whether the container had work in a gap is
/// not known: it is judged over the whole span, as without gaps. So are
/// a span into which a gap of seconds was counted at its end, and one
/// where a process left (its gaps leave the sum).
pub fn while_busy(admitted: f64, idle: f64, waited: f64) -> f64 {
    if !(0.0..=1.0).contains(&idle) || idle + waited > 1.0 + OVERLAP_SLACK {
        return admitted;
    }
    admitted / (1.0 - idle).max(BUSY_FLOOR)
}

/// Whether a container short of the GPU over the span just judged, where
/// it got `admitted` at limit `limit` (fractions), asks now
/// (`short_before`: the span before was short too).
pub fn asks_now(admitted: f64, limit: f64, short_before: bool) -> bool {
    short_before || admitted < FAR_SHORT_OF * limit
}

/// Whether a container side by side, over a span, was short of
/// the GPU: it got `admitted` of the device (fraction) at limit `limit`
/// (fraction), waiting `synced` of the time in synchronisations and
/// `held` for its bucket.
pub fn short_of_the_gpu(admitted: f64, synced: f64, held: f64, limit: f64) -> bool {
    synced > SYNC_BOUND && held < BUCKET_BOUND && admitted < SHORT_OF * limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_of_the_gpu_is_waiting_for_it_and_getting_less_than_the_limit() {
        // 0.05 ms kernels synchronised every 0.5 ms at 60 %: 0.425.
        assert!(short_of_the_gpu(0.425, 0.65, 0.0, 0.6));
        // Its share: not short, however long it waits.
        assert!(!short_of_the_gpu(0.60, 0.9, 0.0, 0.6));
        // A host-bound loop under its limit waits for the GPU little.
        assert!(!short_of_the_gpu(0.20, 0.3, 0.0, 0.3));
        // A paced inference loop on a loaded host, a little under its
        // limit, waits for its bucket most of the time.
        assert!(!short_of_the_gpu(0.273, 0.55, 0.5, 0.3));
    }

    #[test]
    fn a_server_short_of_requests_is_not_short_of_the_gpu() {
        // The server at 250 a second beside 60 %: 0.25 of the GPU, 0.64 of
        // the time in synchronisations, 0.34 between a response and the
        // next request.
        let got = while_busy(0.25, 0.34, 0.64);
        assert!((got - 0.379).abs() < 0.001, "{got}");
        assert!(!short_of_the_gpu(got, 0.64, 0.0, 0.3));
        // A closed loop has next to no gaps: short as before.
        let got = while_busy(0.20, 0.01, 0.95);
        assert!(short_of_the_gpu(got, 0.95, 0.0, 0.3));
        // Two threads, one between requests while the other waits for
        // the GPU: gaps and waits add up to more than the span, and the
        // container is judged over the whole of it.
        let got = while_busy(0.20, 0.4, 0.9);
        assert_eq!(got, 0.20);
        assert!(short_of_the_gpu(got, 0.9, 0.0, 0.3));
        // Gaps over the whole span (one of seconds, counted at its end),
        // or none to speak of: the span as it is.
        assert_eq!(while_busy(0.1, 3.0, 0.6), 0.1);
        assert_eq!(while_busy(0.1, -1.0, 0.6), 0.1);
        assert_eq!(while_busy(0.1, f64::NAN, 0.6), 0.1);
        // Gaps with next to no waits: a quarter of the span at least.
        assert_eq!(while_busy(0.1, 0.9, 0.0), 0.4);
    }

    #[test]
    fn a_little_short_asks_after_two_spans_and_far_short_at_once() {
        // 1 ms steps at 50 % beside 40 %, one span a little short (run 165).
        assert!(!asks_now(0.46, 0.5, false));
        assert!(asks_now(0.46, 0.5, true));
        // Short steps at 30 % beside 60 %: 0.137-0.205 (runs 165-168).
        assert!(asks_now(0.205, 0.3, false));
        // 0.05 ms kernels at 60 %, synchronised every 0.5 ms: 0.425.
        assert!(asks_now(0.425, 0.6, false));
        assert!(!asks_now(0.508, 0.6, false));
    }
}
