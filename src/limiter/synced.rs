//! This thread's last synchronisation (`cuCtxSynchronize`, its `_v2`,
//! `cuStreamSynchronize`, `cuEventSynchronize`) under an SM limit: when it
//! was entered and returned, for the probes (a pause spent waiting for
//! the GPU keeps a probe open), and how long it waited, for the pacing
//! beside other containers (`pacing`).
#![forbid(unsafe_code)]

use std::cell::Cell;

use crate::clock;
use crate::cuda::driver;
use crate::cuda::sys::*;

/// This thread's last synchronisation that succeeded.
#[derive(Clone, Copy)]
struct Synced {
    /// When it was entered and when it returned (monotonic ns).
    entered_ns: u64,
    returned_ns: u64,
    /// The context it waited in (the current one, or the one
    /// `cuCtxSynchronize_v2` named; 0: none), and the stream it waited
    /// for there (None: the whole context, or an event).
    ctx: usize,
    stream: Option<usize>,
    /// Whether the stream stood drained at its return: not after an
    /// event, which may have been recorded before the stream's last work.
    drained: bool,
}

/// What a synchronisation waits for.
#[derive(Clone, Copy)]
pub enum Waits {
    /// A whole context: the current one (`cuCtxSynchronize`, and its
    /// `_v2` given none), or the one named.
    All(Option<CUcontext>),
    /// An event, taken to be on the stream that is launching.
    Event,
    Stream(CUstream),
}

thread_local! {
    static SYNCED: Cell<Option<Synced>> = const { Cell::new(None) };
}

/// Runs a synchronisation (`call`) that waits for `waits`; with an SM
/// limit in force, notes when it was entered and when it returned, if it
/// succeeded ([`waited_for_the_gpu`]), and tells `waited` how long it
/// waited.
pub fn synchronise(
    waits: Waits,
    call: impl FnOnce() -> CUresult,
    waited: impl FnOnce(u64),
) -> CUresult {
    if !crate::duty::any(crate::duty::LIMIT) {
        return call();
    }
    let entered_ns = clock::monotonic_ns();
    let rc = call();
    if rc.is_ok() {
        let returned_ns = clock::monotonic_ns();
        waited(returned_ns.saturating_sub(entered_ns));
        let (ctx, stream) = match waits {
            Waits::All(Some(ctx)) if !ctx.is_null() => (Some(ctx), None),
            Waits::All(_) | Waits::Event => (None, None),
            Waits::Stream(s) => (None, Some(s as usize)),
        };
        // (A stream, its null handle above all, is a stream of the
        // current context: a thread that drives two GPUs must not take one
        // context's synchronisation for the other's.)
        let ctx = ctx
            .or_else(driver::current_context)
            .map_or(0, |c| c as usize);
        SYNCED.with(|s| {
            s.set(Some(Synced {
                entered_ns,
                returned_ns,
                ctx,
                stream,
                drained: !matches!(waits, Waits::Event),
            }))
        });
        log::trace!("turns: a synchronisation returned");
    }
    rc
}

/// Whether the thread spent the pause from its last launch on `stream`
/// of context `ctx` (`last_ns`) to `now` waiting for the GPU, in a
/// synchronisation that covers `stream` ([`pause_was_a_wait`]).
pub(super) fn waited_for_the_gpu(last_ns: u64, ctx: usize, stream: CUstream, now: u64) -> bool {
    SYNCED.with(Cell::get).is_some_and(|s| {
        s.covers(ctx, stream) && pause_was_a_wait(last_ns, s.entered_ns, s.returned_ns, now)
    })
}

impl Synced {
    /// Whether it waited for `stream` of context `ctx`: for that stream,
    /// for the whole context, or for an event there.
    fn covers(&self, ctx: usize, stream: CUstream) -> bool {
        self.ctx == ctx && self.stream.is_none_or(|waited| waited == stream as usize)
    }
}

/// How long `stream` has stood dry before a launch at `now`: from the
/// return of a synchronisation that drained it, entered after the
/// stream's last launch (`last_ns`), to `now`; 0 without one. The host's
/// work between two synchronised steps (a PyTorch loop's Python, 0.03 ms
/// of every 0.1 ms step) leaves the GPU idle, not taken by another
/// context (`turns::Probe::lost_ns`).
pub(super) fn dry_since(last_ns: u64, ctx: usize, stream: CUstream, now: u64) -> u64 {
    SYNCED.with(Cell::get).map_or(0, |s| {
        let covers = s.drained && s.covers(ctx, stream);
        dry_ns(last_ns, s.entered_ns, s.returned_ns, now, covers)
    })
}

/// A pause of the host longer than this between two launches of a probe
/// may have left the GPU idle in it ([`pause_was_a_wait`]).
pub const HOST_PAUSE_NS: u64 = 200_000;

/// Whether a pause since a probe's last launch (`last_launch_ns`) to
/// `now` was spent waiting for the GPU: a synchronisation that covers the
/// probe's stream was entered within [`HOST_PAUSE_NS`] of that launch
/// (`entered_ns`) and returned within as long before `now`
/// (`returned_ns`). The GPU then ran the probe's work until about the
/// return, so the pause held no idle GPU time to speak of; host work
/// before the synchronisation (which may have left the GPU idle) fails
/// the first test. A loop that synchronises every ten 0.05 ms kernels
/// pauses 0.45 ms at each, with its stream dry when it launches again:
/// without this, none of its probes ever closed, and its windows never
/// found their turns (docs/benchmarks.md, runs 47-49).
pub fn pause_was_a_wait(last_launch_ns: u64, entered_ns: u64, returned_ns: u64, now: u64) -> bool {
    entered_ns >= last_launch_ns
        && entered_ns - last_launch_ns <= HOST_PAUSE_NS
        && returned_ns >= entered_ns
        && now >= returned_ns
        && now - returned_ns <= HOST_PAUSE_NS
}
/// The time a probe's stream stood dry before a launch at `now`
/// (`synced::dry_since`): since the return (`returned_ns`) of a
/// synchronisation that `covers` the stream and was entered
/// (`entered_ns`) after the probe's last launch (`last_launch_ns`). It
/// ran the probe's work to the end, so from its return to `now` the GPU
/// had none of it; at most [`HOST_PAUSE_NS`], as long as the other ways
/// a probe stays open allow (one kept open because its stream had work
/// again, another thread's or a copy's, was not dry all that time). 0 for
/// any other.
pub fn dry_ns(
    last_launch_ns: u64,
    entered_ns: u64,
    returned_ns: u64,
    now: u64,
    covers: bool,
) -> u64 {
    if covers && entered_ns >= last_launch_ns && returned_ns >= entered_ns {
        now.saturating_sub(returned_ns).min(HOST_PAUSE_NS)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_synchronisation_after_the_last_launch_leaves_the_stream_dry() {
        // Launched at 100, synchronised from 110 to 180, launched at 200.
        assert_eq!(dry_ns(100, 110, 180, 200, true), 20);
        // One that did not cover the stream, or began before the launch.
        assert_eq!(dry_ns(100, 110, 180, 200, false), 0);
        assert_eq!(dry_ns(100, 90, 180, 200, true), 0);
        // A probe kept open by its stream's new work counts no more dry
        // time than a pause that keeps it open otherwise.
        assert_eq!(dry_ns(100, 110, 180, 900_000, true), HOST_PAUSE_NS);
        // Clocks out of order count nothing.
        assert_eq!(dry_ns(100, 110, 100, 200, true), 0);
        assert_eq!(dry_ns(100, 110, 250, 200, true), 0);
    }

    #[test]
    fn a_pause_counts_as_waiting_only_when_the_host_went_straight_into_a_synchronisation() {
        let us = 1_000u64;
        let last = 1_000_000_000;
        // Ten 0.05 ms kernels: in the synchronisation 20 us after the last
        // launch, out 450 us later, launching again 60 us after that.
        assert!(pause_was_a_wait(
            last,
            last + 20 * us,
            last + 470 * us,
            last + 530 * us
        ));
        // 1 ms of host work first, then a synchronisation that returned at
        // once: the GPU may have idled for most of that millisecond.
        let entered = last + 1_000 * us;
        assert!(!pause_was_a_wait(
            last,
            entered,
            entered + 5 * us,
            entered + 20 * us
        ));
        // Host work after the synchronisation returned.
        assert!(!pause_was_a_wait(
            last,
            last + 20 * us,
            last + 470 * us,
            last + 900 * us
        ));
        // A synchronisation from before the last launch says nothing.
        assert!(!pause_was_a_wait(
            last,
            last - 10 * us,
            last - 5 * us,
            last + 100 * us
        ));
        // Out of order clocks (another thread's values) do not wrap.
        assert!(!pause_was_a_wait(
            last,
            last + 20 * us,
            last + 10 * us,
            last + 30 * us
        ));
        assert!(!pause_was_a_wait(
            last,
            last + 20 * us,
            last + 470 * us,
            last + 400 * us
        ));
    }
}
