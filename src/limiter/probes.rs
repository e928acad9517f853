//! Probes for the turns (`limiter/turns.rs`): consecutive launches of one
//! stream in one window, timed with one pair of events, so that the
//! container learns whether its window opened while another context
//! still ran. A probe opens at a limited launch, takes in the launches
//! after it on the same stream and context, and closes once they cost
//! `turns::probe_ns`, or, beside a limited neighbour, where the window's
//! share is spent and the thread's next launch waits for the next window
//! ([`close_at_window_end`]). A probe that the thread left (another stream or
//! context, a later window, a pause of the host over 0.2 ms with its
//! stream dry) is dropped: its timing would hold time that was not the
//! GPU's. A pause spent waiting in a synchronisation is not one
//! ([`synced`]), and the host's time after a synchronisation drained the
//! stream, up to the next launch, is the probe's dry time, not lost to
//! another context (`turns::Probe::lost_ns`).
//!
//! Finished probes are collected without blocking, at most every
//! [`POLL_EVERY_NS`], and a window is judged once a later one has begun
//! and all its probes are in. While the container is alone on the device
//! (its leader's word, `DeviceEntry::alone`), a window measures its fill
//! and nothing else: what its probes lost went to the process's own work
//! on another stream. No lock is held across a driver call.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use vgpu_shm::EntryIndex;

use super::events;
use super::fill;
use super::streams::stream_key;
use super::turns::{self, Probe, StreamKey};
use super::verdicts;
use super::windows::{self, Done};
use crate::attach::Attach;
use crate::clock;
use crate::cuda::sys::*;
use crate::cuda::{driver, real};
use crate::ffi::Out;
use crate::lock::{Listed, Lock, Name};
use crate::process;

/// A probe still taking in launches (one per thread).
#[derive(Clone, Copy)]
struct Open {
    /// [`GENERATION`] when it opened: a forked child drops its parent's.
    generation: u32,
    /// [`EPOCH`] when it opened.
    epoch: u64,
    dev: EntryIndex,
    anchor: u64,
    /// The start of the window's period, and the period's length.
    period: u64,
    period_ns: u64,
    ctx: usize,
    stream: usize,
    /// The stream as the window's judging tells streams apart.
    key: StreamKey,
    start: usize,
    end: usize,
    /// When it opened and when its last launch returned (monotonic ns).
    opened_ns: u64,
    last_ns: u64,
    cost_ns: u64,
    /// The host's pauses with the stream dry (`synced::dry_since`).
    dry_ns: u64,
    /// It closes once `cost_ns` reaches this (`turns::probe_ns`).
    close_ns: u64,
}

/// A closed probe waiting for its end event.
pub struct Pending {
    open: Open,
}

/// Finished probes are collected at most this often.
const POLL_EVERY_NS: u64 = 2_000_000;
/// A thread's open probe, given back when the thread exits with one open:
/// its two events would otherwise be lost to the pool for good, two for
/// every thread that ever launched under a limit.
struct OpenProbe(Cell<Option<Open>>);

impl OpenProbe {
    fn take(&self) -> Option<Open> {
        self.0.take()
    }

    fn set(&self, open: Option<Open>) {
        self.0.set(open);
    }

    fn get(&self) -> Option<Open> {
        self.0.get()
    }
}

impl Drop for OpenProbe {
    fn drop(&mut self) {
        let Some(open) = self.0.take() else {
            return;
        };
        if open.generation == GENERATION.load(Ordering::Relaxed)
            && open.epoch == EPOCH.load(Ordering::Acquire)
        {
            events::try_give_back(open.ctx, &[open.start, open.end]);
        }
    }
}

thread_local! {
    static OPEN: OpenProbe = const { OpenProbe(Cell::new(None)) };
}

/// Bumped in a forked child: probes opened before it are its parent's.
static GENERATION: AtomicU32 = AtomicU32::new(0);
/// Bumped when a context is destroyed: a probe opened before it may hold
/// that context's events, which are gone (never queried or pooled again;
/// at worst two events leak).
static EPOCH: AtomicU64 = AtomicU64::new(0);
static LAST_POLL_NS: AtomicU64 = AtomicU64::new(0);
/// Closed probes in flight, and finished ones of windows not yet judged.
/// In a forked child there are none (their events were the parent's).
pub static PROBES: Lock<(Vec<Pending>, Vec<Done>)> = Lock::new((Vec::new(), Vec::new()), |p| {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    p.0.clear();
    p.1.clear();
});

/// This module's lock, for the fork handlers (`fork.rs`).
pub fn locks() -> [Listed; 1] {
    [(Name::of("probes"), &PROBES)]
}

/// A launch that a probe takes in: what [`after`] needs.
pub struct Token {
    open: Open,
}

/// Before a limited launch on device entry `dev`, and before its timing
/// sample begins (the host time this may take would be timed as the
/// kernel's on an idle stream: a 0.05 ms kernel was costed at twice its
/// time on an H200, run 49): collects finished probes and judges the
/// windows that are complete, at most every [`POLL_EVERY_NS`].
/// Returns the container's turns (None: not in turns), for [`before`].
pub fn poll_if_due(attach: &Attach, dev: EntryIndex) -> Option<InTurns> {
    let anchor = attach.region.device(dev).turns_in_force();
    if anchor == 0 {
        return None;
    }
    let mut now = clock::monotonic_ns();
    let last = LAST_POLL_NS.load(Ordering::Relaxed);
    if now.saturating_sub(last) >= POLL_EVERY_NS
        && LAST_POLL_NS
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        poll(attach, now);
        now = clock::monotonic_ns();
    }
    let entry = attach.region.device(dev);
    let period_ns = super::period::of(entry);
    let close_ns = turns::probe_ns(entry.sm_percent(), period_ns);
    Some(InTurns {
        anchor,
        now,
        close_ns,
        period_ns,
    })
}

/// A limited launch's container in turns: their anchor, and the time of
/// the launch (read once for [`poll_if_due`] and [`before`]).
#[derive(Clone, Copy)]
pub struct InTurns {
    anchor: u64,
    now: u64,
    close_ns: u64,
    /// The device's period (`period::of`).
    period_ns: u64,
}

/// Before a limited launch of `cost_ns` on `stream`, on device entry
/// `dev`, whose container is in turns: the probe that takes it in.
pub fn before(at: InTurns, dev: EntryIndex, stream: CUstream, cost_ns: u64) -> Option<Token> {
    let InTurns {
        anchor,
        now,
        close_ns,
        period_ns,
    } = at;
    let period = turns::period_start(anchor, now, period_ns);
    let ctx = driver::current_context()? as usize;
    let generation = GENERATION.load(Ordering::Relaxed);
    let epoch = EPOCH.load(Ordering::Acquire);
    if let Some(open) = OPEN.try_with(OpenProbe::take).ok().flatten() {
        let same = open.generation == generation
            && open.epoch == epoch
            && open.dev == dev
            && open.anchor == anchor
            && open.period == period
            && open.period_ns == period_ns
            && open.ctx == ctx
            && open.stream == stream as usize
            && (now.saturating_sub(open.last_ns) <= super::synced::HOST_PAUSE_NS
                || super::synced::waited_for_the_gpu(open.last_ns, ctx, stream, now)
                || real::cuStreamQuery(stream) == CUresult::ERROR_NOT_READY);
        if same {
            let dry_ns = super::synced::dry_since(open.last_ns, ctx, stream, now);
            return Some(Token {
                open: Open {
                    cost_ns: open.cost_ns + cost_ns,
                    dry_ns: open.dry_ns.saturating_add(dry_ns),
                    ..open
                },
            });
        }
        drop_open(open, generation);
    }
    let start = events::take_event(ctx)?;
    let Some(end) = events::take_event(ctx) else {
        events::give_back(ctx, &[start as usize]);
        return None;
    };
    if !real::cuEventRecord(start, stream).is_ok() {
        events::give_back(ctx, &[start as usize, end as usize]);
        return None;
    }
    Some(Token {
        open: Open {
            generation,
            epoch,
            dev,
            anchor,
            period,
            period_ns,
            ctx,
            stream: stream as usize,
            key: stream_key(ctx, stream),
            start: start as usize,
            end: end as usize,
            opened_ns: now,
            last_ns: now,
            cost_ns,
            dry_ns: 0,
            close_ns,
        },
    })
}

/// After the launch returned `rc`: closes the probe once it holds enough,
/// keeps it open otherwise.
pub fn after(token: Token, rc: CUresult) {
    let mut open = token.open;
    if !rc.is_ok() || open.epoch != EPOCH.load(Ordering::Acquire) {
        drop_open(open, GENERATION.load(Ordering::Relaxed));
        return;
    }
    open.last_ns = clock::monotonic_ns();
    if open.cost_ns < open.close_ns {
        // (A launch from another library's thread-exit code, after ours
        // ran, has nowhere to keep its probe.)
        if OPEN.try_with(|o| o.set(Some(open))).is_err() {
            drop_open(open, GENERATION.load(Ordering::Relaxed));
        }
        return;
    }
    if real::cuEventRecord(open.end as CUevent, open.stream as CUstream).is_ok() {
        PROBES.lock().0.push(Pending { open });
    } else {
        events::give_back(open.ctx, &[open.start, open.end]);
    }
}

/// Where a limited launch on device entry `dev` in turns must wait for
/// the next window (`bucket::Admit::NextWindow`): closes the thread's
/// open probe there, which the next window would drop. The steps at a
/// window's end were in no probe: 0.1 ms steps at 30 % whose last six ran
/// 15 ms into a 60 % container's window each period, 2.5 ms each, looked
/// clear to every probe and never moved (p99 2.49 ms, H200, run 168).
/// The caller asks only beside a limited neighbour (`limited_beside`):
/// beside a process that takes no turns every tail reads lost. `anchor`: the
/// turns in force. Not while a stream capture is under way (no driver
/// call then, `events.rs`: the caller asks). Kept open where the probe
/// is another device's or context's; dropped where it is of another
/// window.
pub fn close_at_window_end(dev: EntryIndex, anchor: u64) {
    let Some(open) = OPEN.try_with(OpenProbe::take).ok().flatten() else {
        return;
    };
    let generation = GENERATION.load(Ordering::Relaxed);
    if open.generation != generation || open.epoch != EPOCH.load(Ordering::Acquire) {
        return; // its events may be gone
    }
    let ctx = driver::current_context().map(|c| c as usize);
    if open.dev != dev || ctx != Some(open.ctx) {
        if OPEN.try_with(|o| o.set(Some(open))).is_err() {
            drop_open(open, generation);
        }
        return;
    }
    let now = clock::monotonic_ns();
    if open.anchor != anchor || open.period != turns::period_start(anchor, now, open.period_ns) {
        // (Opened in an earlier window: it would time several periods.)
        log::trace!("turns: the window's last probe opened in an earlier window");
        drop_open(open, generation);
        return;
    }
    let stream = open.stream as CUstream;
    // (As a launch that took it in: a pause of the host with the stream
    // dry is no time of the GPU's.)
    let timed = now.saturating_sub(open.last_ns) <= super::synced::HOST_PAUSE_NS
        || super::synced::waited_for_the_gpu(open.last_ns, open.ctx, stream, now)
        || real::cuStreamQuery(stream) == CUresult::ERROR_NOT_READY;
    if !timed {
        log::trace!("turns: the window's last probe is not timed (the host paused)");
        drop_open(open, generation);
        return;
    }
    log::trace!(
        "turns: the window's last probe closes at its end ({:.2} ms of launches over {:.2} ms)",
        open.cost_ns as f64 / 1e6,
        now.saturating_sub(open.opened_ns) as f64 / 1e6
    );
    let open = Open {
        dry_ns: open.dry_ns.saturating_add(super::synced::dry_since(
            open.last_ns,
            open.ctx,
            stream,
            now,
        )),
        ..open
    };
    if real::cuEventRecord(open.end as CUevent, stream).is_ok() {
        PROBES.lock().0.push(Pending { open });
    } else {
        events::give_back(open.ctx, &[open.start, open.end]);
    }
}

/// Gives a probe's events back, unless they may be gone (a fork, or a
/// context destroyed since it opened).
fn drop_open(open: Open, generation: u32) {
    if open.generation == generation && open.epoch == EPOCH.load(Ordering::Acquire) {
        events::give_back(open.ctx, &[open.start, open.end]);
    }
}

/// Collects finished probes and judges the windows that are complete.
fn poll(attach: &Attach, now: u64) {
    let mut pending = std::mem::take(&mut PROBES.lock().0);
    let mut done = Vec::new();
    pending.retain(|p| {
        let o = &p.open;
        if o.epoch != EPOCH.load(Ordering::Acquire) {
            return false; // its context may be gone, and its events with it
        }
        let rc = real::cuEventQuery(o.end as CUevent);
        if rc == CUresult::ERROR_NOT_READY {
            return true;
        }
        let mut ms = 0f32;
        if rc.is_ok()
            && real::cuEventElapsedTime(Out::from(&mut ms), o.start as CUevent, o.end as CUevent)
                .is_ok()
        {
            done.push(Done {
                window: windows::Window {
                    dev: o.dev,
                    anchor: o.anchor,
                    period: o.period,
                    period_ns: o.period_ns,
                },
                opened_ns: o.opened_ns,
                probe: Probe {
                    stream: o.key,
                    cost_ns: o.cost_ns,
                    elapsed_ns: (f64::from(ms) * 1e6) as u64,
                    dry_ns: o.dry_ns,
                },
            });
        }
        drop_open(*o, GENERATION.load(Ordering::Relaxed));
        false
    });
    let windows =
        {
            let mut probes = PROBES.lock();
            probes.0.extend(pending);
            probes.1.extend(done.into_iter().filter(|d| {
                d.window.period > process::device(d.window.dev).limiter.turns.judged()
            }));
            note_live_fills(attach, &probes.1, now);
            let (pending, done) = &mut *probes;
            let in_flight = |dev, period| {
                pending
                    .iter()
                    .any(|p| p.open.dev == dev && p.open.period == period)
            };
            windows::ready(done, in_flight, now)
        };
    for (w, timings) in windows {
        verdicts::carry_out(
            attach,
            w.dev,
            w.anchor,
            (w.period, w.period_ns),
            &timings,
            now,
        );
    }
}

/// Writes the fill of each device's running window, from its probes in
/// so far (`fill::live_fill_milli`), where it says another and the
/// container takes turns there (alone, or paced side by side, the fill
/// sizes the room it claims, which should not swing within a window).
fn note_live_fills(attach: &Attach, done: &[Done], now: u64) {
    let mut seen: Vec<EntryIndex> = Vec::new();
    for d in done {
        let dev = d.window.dev;
        if seen.contains(&dev) {
            continue;
        }
        seen.push(dev);
        let entry = attach.region.device(dev);
        if !super::bucket::in_turns(entry, now) {
            continue;
        }
        let probes = windows::running(done, dev, now);
        match fill::live_fill_milli(&probes) {
            Some(f) if f != entry.turn_fill_milli() => entry.set_turn_fill_milli(f),
            _ => {}
        }
    }
}

/// Context `ctx` was destroyed: its probes went with it. (Those other
/// threads hold open, or a poll holds, are dropped by [`EPOCH`].)
pub fn forget_context(ctx: usize) {
    EPOCH.fetch_add(1, Ordering::AcqRel);
    PROBES.lock().0.retain(|p| p.open.ctx != ctx);
    let _ = OPEN.try_with(|o| {
        if o.get().is_some_and(|open| open.ctx == ctx) {
            o.set(None);
        }
    });
}
