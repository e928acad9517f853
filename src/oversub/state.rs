//! The state the oversubscription modules share: this process's state
//! (running, suspended, ...), its counters, its settings and its place on
//! the node's board. Data only, so that the modules depend on it and not
//! on each other's parent.
#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64};

use vgpu_shm::board::{Board, BoardEntry};

use crate::attach::Attach;
use crate::config::{Oversub, Vmm};

/// Oversubscription is on in this process.
pub(super) static ACTIVE: AtomicBool = AtomicBool::new(false);
/// CUDA calls through our hooks so far: the watcher reads idleness off it.
pub(super) static ACTIVITY: AtomicU64 = AtomicU64::new(0);
/// Synchronisations and copies in flight (a process waiting in one is busy).
pub(super) static IN_CALL: AtomicU64 = AtomicU64::new(0);

/// This process's memory is on the card.
pub(super) const RUNNING: u8 = 0;
/// Its memory is on the host; its hooks restore it first.
pub(super) const SUSPENDED: u8 = 1;
/// A restore is under way.
pub(super) const RESTORING: u8 = 2;
/// A checkpoint or restore failed for good: its CUDA calls fail.
pub(super) const FAILED: u8 = 3;
/// The watcher is inside the checkpoint (tens of seconds for tens of GiB
/// on an H200): callers wait for it, never restore meanwhile.
pub(super) const SUSPENDING: u8 = 4;
pub(super) static STATE: AtomicU8 = AtomicU8::new(RUNNING);

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

pub(super) struct Settings {
    pub(super) above: Above,
    pub(super) wait_ms: u64,
    pub(super) restore_wait_ms: u64,
    pub(super) idle_ns: u64,
    /// `VGPU_OVERSUBSCRIBE_QUANTUM_MS` (0: this process gives no turns;
    /// None: the default, [`Settings::quantum_ms`]).
    pub(super) quantum_ms: Option<u64>,
    pub(super) host_limit: u64,
    pub(super) test_watcher_stop: bool,
    /// `VGPU_OVERSUBSCRIBE_VMM` ([`Settings::vmm`]).
    pub(super) vmm: Vmm,
    /// How long other restores' claims may hold a restore up.
    pub(super) claim_bound: std::time::Duration,
    /// How long the VMM host arena stays pinned after the last request
    /// for it (mover.rs).
    pub(super) arena_keep: std::time::Duration,
}

impl Settings {
    /// Whether this process's large blocks are VMM-backed: set so, or on
    /// auto where every GPU it sees supports virtual memory management.
    pub(super) fn vmm(&self) -> bool {
        match self.vmm {
            Vmm::Always => true,
            Vmm::Never => false,
            Vmm::Auto => every_gpu_has_vmm(),
        }
    }
}

/// Whether every GPU the process sees supports virtual memory
/// management; asked of the driver once libcuda is loaded and answers
/// (never loading it: an NVML hook may get here first), and said once.
/// (A VMM-backed block is mapped for every GPU that can reach its own,
/// backing.rs, as peer access would not reach it.)
fn every_gpu_has_vmm() -> bool {
    static ALL: OnceLock<bool> = OnceLock::new();
    if let Some(&all) = ALL.get() {
        return all;
    }
    if !crate::interpose::real::loaded(crate::interpose::real::Lib::Cuda) {
        return false;
    }
    let Some(n) = crate::cuda::driver::device_count().filter(|&n| n > 0) else {
        return false;
    };
    // (Decided only on the driver's answers for every GPU: one it did not
    // give is asked again later.)
    let mut lacking = None;
    for d in (0..n).filter_map(|i| i32::try_from(i).ok().map(crate::cuda::sys::CudaOrdinal)) {
        match crate::cuda::driver::has_vmm(d) {
            Some(true) => {}
            Some(false) => {
                lacking = Some(d);
                break;
            }
            None => return false,
        }
    }
    *ALL.get_or_init(|| {
        match lacking {
            None => log::info!(
                "VGPU_OVERSUBSCRIBE_VMM=auto: {n} GPU(s), each with virtual memory management: large blocks are VMM-backed, moved by this process's own copies at the bus's speed"
            ),
            Some(d) => log::info!(
                "VGPU_OVERSUBSCRIBE_VMM=auto: GPU {d} has no virtual memory management: large blocks are ordinary ones, moved by the checkpoint API"
            ),
        }
        lacking.is_none()
    })
}

pub(super) static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// A claim of another process on the board counts this long at most
/// against a restore's room (room.rs; `VGPU_TEST_CLAIM_BOUND_MS` sets
/// another in tests).
pub const CLAIM_BOUND: std::time::Duration = std::time::Duration::from_secs(120);

/// This process's place on the node's board.
pub(super) struct Here {
    pub(super) board: Board,
    pub(super) entry: usize,
    pub(super) pid: u32,
}

impl Here {
    pub(super) fn entry(&self) -> &BoardEntry {
        self.board.entry(self.entry)
    }

    /// Host memory a suspension of this process may take: the host bound
    /// (`VGPU_OVERSUBSCRIBE_HOST_LIMIT`) less the others' suspended state.
    pub(super) fn host_room(&self) -> u64 {
        settings()
            .host_limit
            .saturating_sub(self.board.host_bytes(Some(self.entry)))
    }
}

pub(super) static HERE: OnceLock<Option<Here>> = OnceLock::new();

pub(super) fn settings() -> &'static Settings {
    SETTINGS.get_or_init(|| Settings {
        above: Above {
            attach: || None,
            kick: || {},
        },
        wait_ms: Oversub::default().wait_ms,
        restore_wait_ms: Oversub::default().restore_wait_ms,
        idle_ns: Oversub::default().idle_ms * 1_000_000,
        quantum_ms: None,
        host_limit: 0,
        test_watcher_stop: false,
        vmm: Vmm::Never,
        claim_bound: CLAIM_BOUND,
        arena_keep: std::time::Duration::from_secs(30),
    })
}

/// This process's board entry (None in a forked child: it is never
/// suspended, since the entry is its parent's).
pub(super) fn here() -> Option<&'static Here> {
    HERE.get()?.as_ref().filter(|h| h.pid == std::process::id())
}
