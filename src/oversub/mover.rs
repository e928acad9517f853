//! Moves the VMM-backed blocks (backing.rs) off the card and back, for a
//! suspension (docs/oversubscription.md section 2b): wait until no thread
//! is inside a hook, synchronise each context, copy every block into a
//! pinned host arena, unmap and release; back: create, map at the same
//! address, copy back, through the arena (arena.rs), pinned once and kept: pinning fresh
//! memory runs at ~1 GB/s, copies through a pinned one at ~50 GB/s
//! (docs/vmm-facts.md facts 1-2).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::backing::{self, Backed};
use super::checkpoint;
use crate::cuda::real::{self, Pinned};
use crate::cuda::sys::*;

pub(super) use super::arena::{ARENA_KEEP, arena_cap, arena_short, prepare, trim, waiting};
use super::arena::{CHUNK, PINNED_IN, PLACES, grow, in_ctx, with_arena};

/// Threads inside a hook now (`oversub::enter`'s guard).
pub(super) static INSIDE: AtomicU64 = AtomicU64::new(0);
/// The last suspension used the checkpoint API too (for what VMM does
/// not hold): its restore comes first.
pub(super) static CHECKPOINTED: AtomicBool = AtomicBool::new(false);

/// How long a suspension waits for the threads inside hooks to leave.
pub(super) const QUIET_BOUND: Duration = Duration::from_millis(1000);
/// Calls through trampolines (no hook) count only across their gate:
/// a moment for one that just passed it to reach the driver and return.
const GRACE: Duration = Duration::from_millis(5);

/// Below this, what VMM does not hold stays on the card with the context
/// rather than pay the checkpoint API's ~1.5 s (docs/vmm-facts.md 4c).
pub(super) const CHECKPOINT_FLOOR: u64 = 64 << 20;

/// What this process's contexts count, on every card it uses.
pub(super) fn context_bytes(attach: &crate::attach::Attach) -> u64 {
    let Some(slot) = attach.slot() else { return 0 };
    crate::process::devices_in_use()
        .map(|dev| attach.region.slot_usage(slot, dev, vgpu_shm::Kind::Context))
        .fold(0, u64::saturating_add)
}

/// Waits until no thread is inside a hook (the gate is closed: new calls
/// wait at it), then the grace for trampolined calls. False: some thread
/// stayed inside past `QUIET_BOUND` (busy inside the driver).
pub(super) fn quiet() -> bool {
    let t0 = Instant::now();
    while INSIDE.load(Ordering::SeqCst) != 0 {
        if t0.elapsed() >= QUIET_BOUND {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(GRACE);
    true
}

/// A thread left hook `name`, entered `since`: one that stayed long
/// enough to hold a suspension back is named (a suspension that waited
/// for it says only that a thread stayed).
pub(super) fn left(name: &'static str, since: Instant) {
    let held = since.elapsed();
    if held >= QUIET_BOUND / 2 {
        log::info!(
            "CUDA_OVERSUBSCRIBE: {name} was inside its hook for {} ms",
            held.as_millis()
        );
    }
}

fn ok(rc: CUresult) -> Result<(), CUresult> {
    if rc.is_ok() { Ok(()) } else { Err(rc) }
}

/// Copies `n` bytes between device `dev` and the arena at `at`, chunk
/// by chunk (`out`: device to host).
fn copy(arena: &mut [Pinned], at: u64, dev: CUdeviceptr, n: u64, out: bool) -> CUresult {
    let mut done = 0;
    while done < n {
        let pos = at + done;
        let (i, off) = ((pos / CHUNK) as usize, pos % CHUNK);
        let piece = (n - done).min(CHUNK - off);
        let Some(c) = arena.get_mut(i) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        let rc = if out {
            c.copy_from_device(off as usize, dev + done, piece as usize)
        } else {
            c.copy_to_device(off as usize, dev + done, piece as usize)
        };
        if !rc.is_ok() {
            return rc;
        }
        done += piece;
    }
    CUresult::SUCCESS
}

/// Where each block went in the arena, and what the move pinned itself
/// (bytes, time).
type MovedOut = (Vec<(CUdeviceptr, u64)>, u64, Duration);

/// Moves every block to the host; the bytes moved from each card (by
/// UUID; `fallback` where the driver names none). On an error nothing is
/// released (the process stays as it was) and the reason is given.
pub(super) fn move_out(fallback: [u8; 16]) -> Result<Vec<([u8; 16], u64)>, String> {
    let blocks: Vec<Backed> = backing::movable();
    let Some(first) = blocks.first() else {
        return Ok(Vec::new());
    };
    let t0 = Instant::now();
    let mut ctxs: Vec<usize> = blocks.iter().map(|b| b.ctx).collect();
    ctxs.sort_unstable();
    ctxs.dedup();
    for &ctx in &ctxs {
        in_ctx(ctx, || ok(real::cuCtxSynchronize()))
            .and_then(|r| r)
            .map_err(|rc| format!("its context did not synchronise ({rc})"))?;
    }
    let synced = Instant::now();
    let total: u64 = blocks.iter().map(|b| b.mapped).sum();
    let copied = with_arena(|arena| -> Result<MovedOut, String> {
        let (ready, pinning) = (arena.len(), Instant::now());
        in_ctx(first.ctx, || grow(arena, total))
            .and_then(|r| r)
            .map_err(|rc| format!("no pinned host memory for {total} bytes ({rc})"))?;
        let pinned = (arena.len() - ready) as u64 * CHUNK;
        let pinning = pinning.elapsed();
        PINNED_IN.store(first.ctx, Ordering::Release);
        let mut places = Vec::with_capacity(blocks.len());
        let mut at = 0;
        for b in &blocks {
            in_ctx(b.ctx, || ok(copy(arena, at, b.base, b.mapped, true)))
                .and_then(|r| r)
                .map_err(|rc| format!("a copy to the host failed ({rc})"))?;
            places.push((b.base, at));
            at += b.mapped;
        }
        Ok((places, pinned, pinning))
    });
    let (places, pinned, pinning) = copied?;
    let copied = Instant::now();
    for b in &blocks {
        if let Some(h) = b.handle {
            let _ = in_ctx(b.ctx, || backing::unmap_release(b, h));
            backing::set_handle(b.base, None);
        }
    }
    *PLACES.lock() = places;
    log::info!(
        "CUDA_OVERSUBSCRIBE: VMM move out: {} blocks, {} copied in {} ms (after {} ms of synchronising{}), released in {} ms",
        blocks.len(),
        crate::log::fmt_bytes(total),
        copied
            .duration_since(synced)
            .saturating_sub(pinning)
            .as_millis(),
        synced.duration_since(t0).as_millis(),
        if pinned > 0 {
            format!(
                " and {} ms pinning {} of the arena",
                pinning.as_millis(),
                crate::log::fmt_bytes(pinned)
            )
        } else {
            String::new()
        },
        copied.elapsed().as_millis()
    );
    let mut per_card: Vec<([u8; 16], u64)> = Vec::new();
    for b in &blocks {
        let card = crate::cuda::driver::uuid(b.dev).unwrap_or(fallback);
        match per_card.iter_mut().find(|(c, _)| *c == card) {
            Some((_, n)) => *n += b.mapped,
            None => per_card.push((card, b.mapped)),
        }
    }
    Ok(per_card)
}

/// Brings every moved-out block back at its address. On an error the
/// blocks brought back by this call go out again (released, their host
/// copy still in the arena), so it can be tried again later.
pub(super) fn move_back() -> Result<(), CUresult> {
    let t0 = Instant::now();
    let places = PLACES.lock().clone();
    let mut done: Vec<(Backed, (CUmemGenericAllocationHandle, bool))> = Vec::new();
    let result = with_arena(|arena| {
        for &(base, at) in &places {
            let Some(b) = backing::find(base).filter(|b| b.handle.is_none()) else {
                continue;
            };
            in_ctx(b.ctx, || {
                let made = backing::create_map(b.base, b.mapped, b.dev)?;
                done.push((b, made));
                ok(copy(arena, at, b.base, b.mapped, false))
            })
            .and_then(|r| r)?;
        }
        Ok(())
    });
    if let Err(rc) = result {
        for (b, (h, _)) in &done {
            let _ = in_ctx(b.ctx, || backing::unmap_release(b, *h));
        }
        return Err(rc);
    }
    for (b, made) in &done {
        backing::set_handle(b.base, Some(*made));
    }
    PLACES.lock().clear();
    if done.is_empty() {
        return Ok(());
    }
    log::info!(
        "CUDA_OVERSUBSCRIBE: VMM move back: {} blocks, {} created, mapped and copied in {} ms",
        done.len(),
        crate::log::fmt_bytes(done.iter().map(|(b, _)| b.mapped).sum()),
        t0.elapsed().as_millis()
    );
    Ok(())
}

/// How a restore's move went.
pub(super) enum Back {
    Done,
    /// The checkpoint restore was refused: on driver 580 that is final.
    Refused(CUresult),
    /// The unlock after the checkpoint restore failed.
    Unlock(CUresult),
    /// No room for the VMM blocks after all: unlike a refused checkpoint
    /// restore this can be retried (nothing was lost; the host copy stays).
    NoRoom(CUresult),
}

/// The restore's move: the checkpoint's first (if one was taken), then
/// the VMM blocks.
pub(super) fn bring_back() -> Back {
    if CHECKPOINTED.load(Ordering::Acquire) {
        if let Err(rc) = checkpoint::restore() {
            return Back::Refused(rc);
        }
        if let Err(rc) = checkpoint::unlock() {
            return Back::Unlock(rc);
        }
        CHECKPOINTED.store(false, Ordering::Release);
    }
    match move_back() {
        Ok(()) => Back::Done,
        Err(rc) => Back::NoRoom(rc),
    }
}
