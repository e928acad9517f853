//! This thread's last synchronisation (`cuCtxSynchronize`, its `_v2`,
//! `cuStreamSynchronize`, `cuEventSynchronize`) under an SM limit: when it
//! was entered and returned, for the probes (a pause spent waiting for
//! the GPU keeps a probe open), and how long it waited, for the pacing
//! beside other containers (`pacing`).
#![forbid(unsafe_code)]

use std::cell::Cell;

use super::turns;
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
/// synchronisation that covers `stream` (`turns::waited_for_the_gpu`).
pub(super) fn waited_for_the_gpu(last_ns: u64, ctx: usize, stream: CUstream, now: u64) -> bool {
    SYNCED.with(Cell::get).is_some_and(|s| {
        s.covers(ctx, stream)
            && turns::waited_for_the_gpu(last_ns, s.entered_ns, s.returned_ns, now)
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
        turns::dry_ns(last_ns, s.entered_ns, s.returned_ns, now, covers)
    })
}
