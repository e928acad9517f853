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
