//! The room a limited container asks a container without an SM limit
//! (`rest.rs`) to leave it, beyond its limit, on the node's SM board
//! (`Claim::room`): where its short steps would fare badly in turns, room
//! for their switches; in turns, the span of its windows (issue 29).
//! `pacing.rs` decides when to ask.
#![forbid(unsafe_code)]

/// Limits that sum to at most this (percent) leave room to pace side by
/// side: the switches between two busy contexts cost 5-10 % of the GPU
/// (0.303 + 0.600 at 30 + 60 on an H200, 0.455 each at 50 + 50).
pub const ROOM_PERCENT: u32 = 90;

/// A paced container short of the GPU beside a container without a limit
/// asks it for room rather than for turns where a window in turns would
/// hold fewer of its steps than this: one step in each window waits out
/// the rest of the period, so 0.1 ms steps at 10 % (86 to a 10 ms window)
/// had a p99 of 90 ms in turns beside the rest (H200, run 149), where
/// paced beside a 60 % container they had 1.7 ms. A step is told by a
/// synchronisation (`cuCtxSynchronize`, a stream's or an event's): a loop
/// that synchronises several times a step counts more steps than it
/// makes (and asks more room, at most the room there is), and one that
/// only waits in a synchronous copy counts none, and takes turns.
const WINDOW_STEPS: f64 = 120.0;
/// What each step of a paced loop costs beside a busy neighbour in
/// switches: two hand-overs between contexts, about 0.15 ms each on an
/// H100 (gpu-tests/switchcost.cu). A loop short of the GPU asks the rest
/// for room for them, at the steps a second it makes at its limit.
const SWITCHES_PER_STEP_NS: f64 = 300_000.0;

/// The room (percent of the GPU's time) a container at `percent`, paced
/// side by side and short of the GPU (it got `got` of it, making
/// `syncs_per_s` synchronisations a second), needs a container without a
/// limit to leave it, if it should stay paced: its limit, and what its
/// steps' switches cost at its limit. None where a window of a `period_ns`
/// would hold enough of its steps ([`WINDOW_STEPS`]): turns serve it.
pub fn steps_room(percent: u32, got: f64, syncs_per_s: f64, period_ns: u64) -> Option<u32> {
    let limit = f64::from(percent) / 100.0;
    if got <= 0.0 || syncs_per_s <= 0.0 {
        return None;
    }
    let steps_at_limit = syncs_per_s * limit / got;
    let in_window = steps_at_limit * period_ns as f64 / 1e9;
    let switches = steps_at_limit * SWITCHES_PER_STEP_NS / 1e9;
    // (The rest keeps its least whatever is asked: `rest.rs`.)
    (in_window < WINDOW_STEPS).then(|| {
        // (`percent` is the region's, which any process of the container
        // may write: clamped, and added without overflow.)
        let percent = percent.min(100);
        percent
            .saturating_add((switches * 100.0).ceil() as u32)
            .min(ROOM_PERCENT.max(percent))
    })
}

/// The room (percent of the period) the windows of a container at
/// `percent` span in turns: its share over its fill (`fill_milli`, 0:
/// not known). 0.1 ms steps with a fill of 0.81 at 50 % span 62 ms of
/// each 100, and beside them the rest's 40 % left no room between the
/// windows: they ran into each other by a probe's noise each period
/// (p99 2.5 ms, H200, run 151).
pub fn span_room(percent: u32, fill_milli: u64) -> u32 {
    match fill_milli {
        1..1000 => (u64::from(percent) * 1000).div_ceil(fill_milli).min(100) as u32,
        _ => percent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_steps_ask_the_rest_for_room_and_long_windows_take_turns() {
        const P: u64 = 100_000_000;
        // 0.1 ms steps at 10 % beside a rest of 80 (run 147): 0.053 of
        // the GPU, about 500 steps a second; at 10 %, 94 to a window.
        // Room for their switches: 29 % more.
        assert_eq!(steps_room(10, 0.053, 500.0, P), Some(10 + 29));
        // The same steps at 30 % make 300 to a window: turns serve them.
        assert_eq!(steps_room(30, 0.16, 1600.0, P), None);
        // 1 ms steps at 30 %, short: 30 to a window; 9 % of switches.
        assert_eq!(steps_room(30, 0.2, 200.0, P), Some(39));
        // Never more than the room there is, nor less than the limit;
        // nothing known, nothing asked.
        assert_eq!(steps_room(60, 0.3, 550.0, P), Some(ROOM_PERCENT));
        assert_eq!(steps_room(89, 0.5, 100.0, P), Some(ROOM_PERCENT));
        assert_eq!(steps_room(70, 0.5, 10.0, P), Some(71));
        assert_eq!(steps_room(90, 0.1, 1.0, P), Some(90));
        assert_eq!(steps_room(10, 0.0, 500.0, P), None);
        assert_eq!(steps_room(10, 0.05, 0.0, P), None);
        // A longer period holds more steps to a window.
        assert_eq!(steps_room(10, 0.053, 500.0, 2 * P), None);
    }

    #[test]
    fn windows_in_turns_span_their_share_over_their_fill() {
        assert_eq!(span_room(50, 810), 62);
        assert_eq!(span_room(30, 1000), 30);
        assert_eq!(span_room(30, 0), 30);
        assert_eq!(span_room(90, 500), 100);
        assert_eq!(span_room(10, 999), 11);
    }
}
