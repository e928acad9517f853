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
//!   waits for, restore it when one of its threads calls CUDA (that call
//!   waits for room up to `VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS`, then
//!   fails with `CUDA_ERROR_OUT_OF_MEMORY`, the process still suspended)
//! - `policy`: who goes first (pure)
//! - `checkpoint`: the driver's checkpoint API, on this process itself
//! - `blocked`: threads of a suspended process that wait inside the driver
//!   (calls that never reach a hook), for the watcher to restore it
//! - `free_probe`: NVML's free memory, asked without blocking the watcher
//! - `room`: whether a card has room for a restore, on this process's own
//!   figure only (the board can make a restore wait, within bounds, never
//!   hurry it)
//!
//! The process is its own actor: its watcher thread locks, checkpoints,
//! restores and unlocks it (a process may drive the API on itself, as
//! DMTCP's CUDA plugin does). If the watcher is gone, the thread that
//! wants to run restores the process itself. A process without the flag
//! never touches any of this: every hook pays one relaxed load.
#![forbid(unsafe_code)]

mod admission;
mod blocked;
mod checkpoint;
mod free_probe;
mod policy;
mod room;
mod suspend;

use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use vgpu_shm::board::{Board, BoardEntry};

pub use admission::admit;
pub use suspend::{suspended, tick};

use crate::attach::Attach;
use crate::config::Oversub;
use crate::cuda::sys::CUresult;

/// Oversubscription is on in this process.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// CUDA calls through our hooks so far: the watcher reads idleness off it.
static ACTIVITY: AtomicU64 = AtomicU64::new(0);
/// Synchronisations and copies in flight (a process waiting in one is busy).
static IN_CALL: AtomicU64 = AtomicU64::new(0);

/// This process's memory is on the card.
const RUNNING: u8 = 0;
/// Its memory is on the host; its hooks restore it first.
const SUSPENDED: u8 = 1;
/// A restore is under way.
const RESTORING: u8 = 2;
/// A checkpoint or restore failed for good: its CUDA calls fail.
const FAILED: u8 = 3;
/// The watcher is inside the checkpoint (tens of seconds for tens of GiB
/// on an H200): callers wait for it, never restore meanwhile.
const SUSPENDING: u8 = 4;
static STATE: AtomicU8 = AtomicU8::new(RUNNING);

/// What oversubscription needs from the layers above it, installed by
/// `init` when it turns oversubscription on (as `attach::OnSlot` is), so
/// that this module calls nothing above it.
#[derive(Clone, Copy)]
pub struct Above {
    /// The attachment, if anything is enforced: a restore a hook asked
    /// for beats the region slot while it waits.
    pub attach: fn() -> Option<&'static Attach>,
    /// Wakes the watcher thread (a restore is wanted).
    pub kick: fn(),
}

struct Settings {
    above: Above,
    wait_ms: u64,
    restore_wait_ms: u64,
    idle_ns: u64,
    host_limit: u64,
    test_watcher_stop: bool,
    /// How long other restores' claims may hold a restore up.
    claim_bound: std::time::Duration,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// This process's place on the node's board.
struct Here {
    board: Board,
    entry: usize,
    pid: u32,
}

impl Here {
    fn entry(&self) -> &BoardEntry {
        self.board.entry(self.entry)
    }
}

static HERE: OnceLock<Option<Here>> = OnceLock::new();

/// Turns oversubscription on for this process (init, with the flag).
pub fn start(cfg: &Oversub, above: Above) {
    let host_limit = cfg
        .host_limit
        .unwrap_or_else(|| half_of_ram(Path::new("/proc/meminfo")));
    let _ = SETTINGS.set(Settings {
        above,
        wait_ms: cfg.wait_ms,
        restore_wait_ms: cfg.restore_wait_ms,
        idle_ns: cfg.idle_ms.saturating_mul(1_000_000),
        host_limit,
        test_watcher_stop: cfg.test_watcher_stop,
        claim_bound: cfg
            .test_claim_bound_ms
            .map_or(room::CLAIM_BOUND, std::time::Duration::from_millis),
    });
    let pid = std::process::id();
    let here = Board::open(&cfg.dir).and_then(|board| {
        let entry = board.claim(pid, crate::clock::monotonic_ns())?;
        Ok(Here { board, entry, pid })
    });
    match here {
        Ok(h) => {
            log::info!(
                "CUDA_OVERSUBSCRIBE: idle after {} ms, allocations wait up to {} ms for room and restores up to {} ms, host memory for suspended state up to {}, board {} entry {}",
                cfg.idle_ms,
                cfg.wait_ms,
                cfg.restore_wait_ms,
                crate::log::fmt_bytes(host_limit),
                h.board.path().display(),
                h.entry
            );
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
    enter().map_err(|rc| rc.0)
}

/// Oversubscription is on in this process.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

fn settings() -> &'static Settings {
    SETTINGS.get_or_init(|| Settings {
        above: Above {
            attach: || None,
            kick: || {},
        },
        wait_ms: Oversub::default().wait_ms,
        restore_wait_ms: Oversub::default().restore_wait_ms,
        idle_ns: Oversub::default().idle_ms * 1_000_000,
        host_limit: 0,
        test_watcher_stop: false,
        claim_bound: room::CLAIM_BOUND,
    })
}

/// This process's board entry (None in a forked child: it is never
/// suspended, since the entry is its parent's).
fn here() -> Option<&'static Here> {
    HERE.get()?.as_ref().filter(|h| h.pid == std::process::id())
}

/// Runs before every CUDA hook: counts the call, and restores this process
/// first if it is suspended. Err: the call's answer (no room to restore
/// within the bound, or the restore failed for good).
#[inline(always)]
pub fn enter() -> Result<(), CUresult> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return Ok(());
    }
    entered()
}

/// Out of line: inlined, its stack frame was set up on every hook, with
/// oversubscription off too.
#[cold]
#[inline(never)]
fn entered() -> Result<(), CUresult> {
    ACTIVITY.fetch_add(1, Ordering::Relaxed);
    if STATE.load(Ordering::Acquire) == RUNNING {
        return Ok(());
    }
    suspend::resume()
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
