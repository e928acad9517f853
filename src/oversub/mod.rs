//! Memory oversubscription (`CUDA_OVERSUBSCRIBE=true`): idle processes are
//! suspended whole to host memory with the driver's checkpoint API and
//! restored on their next CUDA call. Never unified memory, never page by
//! page (docs/oversubscription.md).
//!
//! - `admission`: an allocation within the quota that the card cannot
//!   hold waits (`VGPU_OVERSUBSCRIBE_WAIT_MS`) while room is made, then
//!   fails with `CUDA_ERROR_OUT_OF_MEMORY`, saying the card is full
//! - `suspend`: the watcher's part: publish this process on the node's
//!   board, suspend it when it is the idlest process on a card someone
//!   waits for
//! - `restore`: restore it when one of its threads calls CUDA (that call
//!   waits for room up to `VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS`, then
//!   fails with `CUDA_ERROR_OUT_OF_MEMORY`, the process still suspended)
//! - `policy`: which idle process goes first (pure)
//! - `turns`: turns for busy processes when nobody is idle: who gives
//!   its turn, who is next in line (pure); `line`: its driver part
//! - `checkpoint`: the driver's checkpoint API, on this process itself
//! - `blocked`: threads of a suspended process that wait inside the driver
//!   (calls that never reach a hook), for the watcher to restore it
//! - `free_probe`: NVML's free memory, asked without blocking the watcher
//! - `room`: whether a card has room for a restore, on this process's own
//!   figure only (the board can make a restore wait, within bounds, never
//!   hurry it; pure); `restore_room`: the figures it judges, gathered
//!   from NVML and the board
//! - `state`: what they share: the process's state, counters, settings
//!   and board entry; `handover`: what a suspension hands its restore
//!   (the cards, the watcher's beat, the waiting allocations)
//!
//! The process is its own actor: its watcher thread locks, checkpoints,
//! restores and unlocks it (a process may drive the API on itself, as
//! DMTCP's CUDA plugin does). If the watcher is gone, the thread that
//! wants to run restores the process itself. A process without the flag
//! never touches any of this: every hook pays one relaxed load.
#![forbid(unsafe_code)]

mod admission;
mod arena;
pub mod backing;
mod blocked;
mod checkpoint;
mod checkpointing;
mod claim;
mod free_probe;
mod handover;
mod inside;
mod line;
mod mover;
mod policy;
mod restore;
mod restore_room;
mod room;
pub mod shared;
mod state;
mod suspend;
mod turns;

use std::path::Path;
use std::sync::atomic::Ordering;

use vgpu_shm::board::Board;

pub use admission::admit;
pub use inside::Inside;
pub use state::Above;
pub use suspend::{suspended, tick};

use crate::config::{DEFAULT_QUANTUM_MS, DEFAULT_VMM_QUANTUM_MS, Oversub};
use crate::cuda::sys::CUresult;
use crate::lock::Listed;
use state::{ACTIVE, ACTIVITY, HERE, Here, IN_CALL, SETTINGS, Settings};

/// Turns oversubscription on for this process (init, with the flag);
/// `priority`: its `CUDA_TASK_PRIORITY` (0 high), its place in turns.
pub fn start(cfg: &Oversub, priority: i32, above: Above) {
    let host_limit = cfg
        .host_limit
        .unwrap_or_else(|| half_of_ram(Path::new("/proc/meminfo")));
    let _ = SETTINGS.set(Settings {
        above,
        wait_ms: cfg.wait_ms,
        restore_wait_ms: cfg.restore_wait_ms,
        idle_ns: cfg.idle_ms.saturating_mul(1_000_000),
        quantum_ms: cfg.quantum_ms,
        host_limit,
        test_watcher_stop: cfg.test_watcher_stop,
        vmm: cfg.vmm,
        claim_bound: cfg
            .test_claim_bound_ms
            .map_or(state::CLAIM_BOUND, std::time::Duration::from_millis),
        arena_keep: cfg
            .test_arena_keep_ms
            .map_or(mover::ARENA_KEEP, std::time::Duration::from_millis),
    });
    let pid = std::process::id();
    let here = Board::open(&cfg.dir).and_then(|board| {
        let entry = board.claim(pid, crate::clock::monotonic_ns())?;
        Ok(Here { board, entry, pid })
    });
    match here {
        Ok(h) => {
            log::info!(
                "CUDA_OVERSUBSCRIBE: idle after {} ms, busy turns of {}, allocations wait up to {} ms for room and restores up to {} ms (and for their turn), host memory for suspended state up to {}, board {} entry {}",
                cfg.idle_ms,
                cfg.quantum_ms.map_or_else(
                    || format!(
                        "{} ms ({} ms where blocks are VMM-backed)",
                        DEFAULT_QUANTUM_MS, DEFAULT_VMM_QUANTUM_MS
                    ),
                    |q| format!("{q} ms")
                ),
                cfg.wait_ms,
                cfg.restore_wait_ms,
                crate::log::fmt_bytes(host_limit),
                h.board.path().display(),
                h.entry
            );
            line::start(&h, priority);
            let _ = HERE.set(Some(h));
        }
        Err(e) => {
            log::error!(
                "CUDA_OVERSUBSCRIBE: {e}; this process is never suspended, and it waits for room without asking others to make it"
            );
            let _ = HERE.set(None);
        }
    }
    ACTIVE.store(true, Ordering::Release);
    // Launches take the hooks' whole path from now on (`duty.rs`).
    crate::duty::set(crate::duty::OVERSUB);
}

/// The gate of the trampolines that functions without a hook get
/// (`interpose/trampoline.rs`; `init` installs it before [`start`]):
/// [`enter`], its answer as a raw code.
pub fn gate() -> Result<(), i32> {
    // Counted as inside only across the check (mover.rs gives these
    // calls a grace instead).
    enter("a function without a hook")
        .map(drop)
        .map_err(|rc| rc.0)
}

/// This module's locks, for the fork handlers (`fork.rs`), outermost
/// first: a caller waiting for its restore holds `oversub.restore_done`
/// while it kicks the watcher (`watcher.thread`); the others are taken
/// alone.
pub fn locks() -> impl Iterator<Item = Listed> {
    restore::locks()
        .into_iter()
        .chain(free_probe::locks())
        .chain(restore_room::locks())
        .chain(suspend::locks())
        .chain(handover::locks())
        .chain(backing::locks())
        .chain(arena::locks())
        .chain(shared::locks())
}

/// `cuMemFree_v2` of `p` if it is a VMM-backed block (None: not one):
/// freed, and no longer shared.
pub fn free_backed(p: crate::cuda::sys::CUdeviceptr) -> Option<CUresult> {
    // (Nothing is VMM-backed without oversubscription: no lock taken.)
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    // (Before the release: a block made at this address next must not
    // find its export.)
    shared::forget(p);
    backing::free(p)
}

/// Oversubscription is on in this process.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Runs before every CUDA hook: counts the call, and restores this process
/// first if it is suspended. Ok: the guard the hook holds while it runs;
/// Err: the call's answer (no room to restore within the bound, or the
/// restore failed for good).
#[inline(always)]
pub fn enter(name: &'static str) -> Result<Inside, CUresult> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return Ok(Inside::none());
    }
    inside::entered(name, restore::resume)
}

/// Runs `call` counted as in flight: a process blocked in a
/// synchronisation or copy is not idle.
pub fn in_call<R>(call: impl FnOnce() -> R) -> R {
    if !ACTIVE.load(Ordering::Relaxed) {
        return call();
    }
    IN_CALL.fetch_add(1, Ordering::AcqRel);
    let r = call();
    IN_CALL.fetch_sub(1, Ordering::AcqRel);
    ACTIVITY.fetch_add(1, Ordering::Relaxed);
    r
}

/// Half of `MemTotal` in a `/proc/meminfo` (the default host limit);
/// 0 (no suspension) when it cannot be read.
fn half_of_ram(meminfo: &Path) -> u64 {
    std::fs::read_to_string(meminfo)
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024 / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_host_limit_is_half_the_ram() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("meminfo");
        std::fs::write(&p, "MemTotal:       16384 kB\nMemFree: 1 kB\n").unwrap();
        assert_eq!(half_of_ram(&p), 8 << 20);
        assert_eq!(half_of_ram(&dir.path().join("missing")), 0);
    }
}
