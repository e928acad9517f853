//! The pinned host arena the VMM moves copy through (mover.rs): pinned
//! ahead of a suspension by a thread of its own, a chunk at a time, kept
//! while turns ask for it and given back once nobody has for a while.
//! Pinning fresh memory runs at ~1 GB/s, copies through a pinned arena at
//! ~50 GB/s (docs/vmm-facts.md facts 1-2).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::backing::{self, Backed};
use crate::cuda::real::{self, Pinned};
use crate::cuda::sys::*;
use crate::ffi::Out;
use crate::lock::{Listed, Lock, Name, keep};

/// The pinned host arena, in chunks of `CHUNK`, grown on demand and kept.
/// (Taken out of the lock while the driver copies: no lock is held
/// across a driver call.)
pub(super) static ARENA: Lock<Vec<Pinned>> = Lock::new(Vec::new(), keep);
/// The arena is out of `ARENA` with its user (a move, or `prepare`'s
/// thread growing it one chunk): the other waits.
static ARENA_BUSY: AtomicBool = AtomicBool::new(false);
/// `prepare`'s thread is running.
static PREPARING: AtomicBool = AtomicBool::new(false);
/// Where each moved-out block is in the arena: (base, offset).
pub(super) static PLACES: Lock<Vec<(CUdeviceptr, u64)>> = Lock::new(Vec::new(), keep);

/// This module's locks, for the fork handlers (`fork.rs`).
pub(super) fn locks() -> [Listed; 2] {
    [
        (Name::of("oversub.arena"), &ARENA),
        (Name::of("oversub.places"), &PLACES),
    ]
}

/// One chunk of the arena.
pub(super) const CHUNK: u64 = 256 << 20;

/// Runs `f` with `ctx` current on this thread.
pub(super) fn in_ctx<R>(ctx: usize, f: impl FnOnce() -> R) -> Result<R, CUresult> {
    let rc = real::cuCtxPushCurrent_v2(ctx as CUcontext);
    if !rc.is_ok() {
        return Err(rc);
    }
    let r = f();
    let mut popped: CUcontext = std::ptr::null_mut();
    let _ = real::cuCtxPopCurrent_v2(Out::from(&mut popped));
    Ok(r)
}

/// Takes the arena out for `f`, waiting while `prepare`'s thread has it
/// (one chunk's pinning, ~0.1-0.2 s).
pub(super) fn with_arena<R>(f: impl FnOnce(&mut Vec<Pinned>) -> R) -> R {
    while ARENA_BUSY
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut arena = std::mem::take(&mut *ARENA.lock());
    let r = f(&mut arena);
    ARENA_BYTES.store(arena.len() as u64 * CHUNK, Ordering::Release);
    *ARENA.lock() = arena;
    ARENA_BUSY.store(false, Ordering::Release);
    r
}

/// The arena's size, as `with_arena` last left it.
static ARENA_BYTES: AtomicU64 = AtomicU64::new(0);
/// The arena thread's last chunk was refused, or the thread could not
/// start (until a chunk is pinned again).
static PIN_STALLED: AtomicBool = AtomicBool::new(false);
/// VMM-backed bytes this process's allocations wait for (`waiting`): the
/// arena is pinned for them too.
static AWAITED: AtomicU64 = AtomicU64::new(0);
/// The latest request to `prepare_in`, read by its thread on every chunk
/// (a request while the thread runs is taken up by it, not lost): the
/// context to pin in where no block has one yet (0: none), the host bytes
/// a suspension of this process may take (the arena grows no further).
static ASK_CTX: AtomicUsize = AtomicUsize::new(0);
static ASK_CAP: AtomicU64 = AtomicU64::new(0);
/// A request came since `prepare_in`'s thread last looked.
static ASKED: AtomicBool = AtomicBool::new(false);
/// When `prepare_in` was last asked (monotonic ns): the arena is given
/// back [`ARENA_KEEP`] after that (the setting's figure), where nothing is
/// moved out.
static LAST_ASKED: AtomicU64 = AtomicU64::new(0);
/// How long the arena stays pinned after the last request for it: turns
/// ask every watcher tick, so it goes only once they stop; pinned host
/// memory is not on the board's host bound (`VGPU_OVERSUBSCRIBE_HOST_LIMIT`,
/// which counts suspended state), so it is not kept for ever.
pub(super) const ARENA_KEEP: Duration = Duration::from_secs(30);

/// While the guard lives, an allocation of `bytes` to be VMM-backed
/// waits for its turn in context `ctx`: the arena is pinned for it and
/// for the blocks held, now, unless they come to more than `cap` bytes
/// (what a suspension may take under the host bound: it would be
/// refused). Its turn will end in a suspension; pinned during the turn
/// instead, the arena took 0.03-0.08 of the job's throughput there (runs
/// 104-106). (A wait for an idle process to leave pins nothing: this one
/// may never be suspended.)
pub(super) fn waiting(bytes: u64, ctx: usize, cap: u64) -> Awaited {
    AWAITED.fetch_add(bytes, Ordering::AcqRel);
    prepare_in(Some(ctx), cap);
    Awaited(bytes)
}

/// [`waiting`]'s guard.
pub(super) struct Awaited(u64);

impl Drop for Awaited {
    fn drop(&mut self) {
        AWAITED.fetch_sub(self.0, Ordering::AcqRel);
    }
}

/// Pins the arena for this process's VMM blocks ahead of a suspension
/// (nothing where they come to more than `cap` bytes, what a suspension
/// may take under the host bound: it would be refused), in a thread of
/// its own, a chunk at a time: pinning runs at 1-2 GB/s
/// (docs/vmm-facts.md fact 2), so a busy job's first switch spent 7.7 of
/// its 8.5 s pinning (run 99). The watcher calls this when another
/// process wants room on a card this one holds: its turn is then near.
pub(super) fn prepare(cap: u64) {
    prepare_in(None, cap);
}

/// [`prepare`]; `ctx`: the context to pin in where no block has one yet.
fn prepare_in(ctx: Option<usize>, cap: u64) {
    if let Some(ctx) = ctx {
        ASK_CTX.store(ctx, Ordering::Release);
    }
    ASK_CAP.store(cap, Ordering::Release);
    LAST_ASKED.store(crate::clock::monotonic_ns(), Ordering::Release);
    // SeqCst here and where the thread ends: each side writes one flag and
    // reads the other, so one of them sees the other's write.
    ASKED.store(true, Ordering::SeqCst);
    if PREPARING.swap(true, Ordering::SeqCst) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("vgpu-arena".into())
        .spawn(|| {
            // Until no request came while it pinned: one that found this
            // thread running left its figures for it.
            loop {
                ASKED.store(false, Ordering::SeqCst);
                pin_asked();
                PREPARING.store(false, Ordering::SeqCst);
                if !ASKED.load(Ordering::SeqCst) || PREPARING.swap(true, Ordering::SeqCst) {
                    return;
                }
            }
        });
    if spawned.is_err() {
        PIN_STALLED.store(true, Ordering::Release);
        PREPARING.store(false, Ordering::SeqCst);
    }
}

/// Whether the arena is still short of this process's VMM blocks,
/// within the latest request's cap (the arena thread pins the rest): a
/// busy process then keeps its turn a while (`line::hold_for_arena`), so
/// that its switch copies at the bus's speed instead of pinning with the
/// card idle (run 111: a first 33 GiB suspension took 11.2 s, 3.2 GB/s,
/// pinning the arena begun 4 s before).
/// Not while pinning fails: the turn would only be held up.
pub(super) fn arena_short() -> bool {
    let need = backing::mapped_bytes();
    need > ARENA_BYTES.load(Ordering::Acquire)
        && need <= ASK_CAP.load(Ordering::Acquire)
        && !PIN_STALLED.load(Ordering::Acquire)
}

/// The cap for [`prepare`] and [`waiting`]: what the host bound leaves
/// this process's suspension (`Here::host_room`) less what it would
/// reserve beside the VMM blocks (its context and other counted memory:
/// a suspension reserves all of it, and is refused past the bound).
pub(super) fn arena_cap(h: &super::state::Here) -> u64 {
    let on_cards: u64 = h.entry().cards().iter().map(|&(_, b)| b).sum();
    h.host_room()
        .saturating_sub(on_cards.saturating_sub(backing::mapped_bytes()))
}

/// Grows the arena, a chunk at a time, to what the blocks held and the
/// allocations awaited need, if that is within the latest request's cap.
fn pin_asked() {
    let t0 = Instant::now();
    let mut chunks = 0;
    // Whether a chunk was pinned while an allocation waited (read as each
    // is pinned: the allocation may be granted before the pinning ends).
    let mut for_waiter = false;
    loop {
        let blocks: Vec<Backed> = backing::movable();
        let need = blocks
            .iter()
            .map(|b| b.mapped)
            .sum::<u64>()
            .saturating_add(AWAITED.load(Ordering::Acquire));
        let cap = ASK_CAP.load(Ordering::Acquire);
        let asked = Some(ASK_CTX.load(Ordering::Acquire)).filter(|&c| c != 0);
        let Some(ctx) = blocks.first().map(|b| b.ctx).or(asked) else {
            break;
        };
        let grown = with_arena(|arena| {
            let len = arena.len() as u64;
            // Past the cap, the suspension is refused: nothing to pin for.
            if len * CHUNK >= need
                || need > cap
                || super::state::STATE.load(Ordering::Acquire) != super::state::RUNNING
            {
                return false;
            }
            let pinned = in_ctx(ctx, || Pinned::new(CHUNK as usize))
                .and_then(|r| r)
                .map(|c| arena.push(c))
                .is_ok();
            // A chunk refused (host memory, the driver) leaves the arena
            // short: a turn is then not held for it (`arena_short`).
            PIN_STALLED.store(!pinned, Ordering::Release);
            pinned
        });
        if !grown {
            break;
        }
        PINNED_IN.store(ctx, Ordering::Release);
        chunks += 1;
        for_waiter |= AWAITED.load(Ordering::Acquire) != 0;
    }
    if chunks > 0 {
        let why = if for_waiter {
            "while an allocation waits for its turn"
        } else {
            "ahead of a suspension"
        };
        log::info!(
            "CUDA_OVERSUBSCRIBE: host arena grown by {} in {} ms, {why}",
            crate::log::fmt_bytes(chunks * CHUNK),
            t0.elapsed().as_millis()
        );
    }
}

/// A context the arena was pinned in: it is given back in it.
pub(super) static PINNED_IN: AtomicUsize = AtomicUsize::new(0);

/// Gives the arena back where nobody asked for it for [`ARENA_KEEP`] and
/// nothing of this process is moved out (the watcher, while it runs).
pub(super) fn trim(now_ns: u64) {
    let keep = super::state::settings().arena_keep;
    let keep_ns = u64::try_from(keep.as_nanos()).unwrap_or(u64::MAX);
    let unasked = || {
        now_ns.saturating_sub(LAST_ASKED.load(Ordering::Acquire)) >= keep_ns
            && AWAITED.load(Ordering::Acquire) == 0
            && !PREPARING.load(Ordering::SeqCst)
    };
    if !unasked() || !PLACES.lock().is_empty() || ARENA.lock().is_empty() {
        return;
    }
    // Unpinned in a context of this process that still lives: the one
    // it was pinned in, else any (the arena is pinned portable). With
    // none, the driver's handles are gone with them: the memory is only
    // unmapped.
    let pinned_in = PINNED_IN.load(Ordering::Acquire);
    let ctx = {
        let live = crate::process::CONTEXTS.lock();
        if live.contains_key(&pinned_in) {
            Some(pinned_in)
        } else {
            live.keys().next().copied()
        }
    };
    let freed = with_arena(|arena| {
        // A request may have come while the arena was in use.
        if !unasked() {
            return 0;
        }
        let bytes = arena.len() as u64 * CHUNK;
        match ctx {
            Some(ctx) if in_ctx(ctx, || arena.clear()).is_ok() => {}
            _ => arena.drain(..).for_each(Pinned::forget_driver),
        }
        bytes
    });
    if freed > 0 {
        log::info!(
            "CUDA_OVERSUBSCRIBE: host arena of {} given back: nobody asked for room on this process's cards for {} ms",
            crate::log::fmt_bytes(freed),
            keep.as_millis()
        );
    }
}

/// Grows the arena to `bytes` (a context must be current).
pub(super) fn grow(arena: &mut Vec<Pinned>, bytes: u64) -> Result<(), CUresult> {
    while (arena.len() as u64) * CHUNK < bytes {
        arena.push(Pinned::new(CHUNK as usize)?);
    }
    Ok(())
}
