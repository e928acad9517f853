//! The settings of the policies that need more than a number: how
//! oversubscription behaves (`VGPU_OVERSUBSCRIBE_*`) and whether a
//! limited container takes turns beside others (`VGPU_SM_TURNS`).

use std::path::PathBuf;

use super::parse::parse_bool;

/// `VGPU_SM_TURNS`: whether a limited container takes turns beside others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turns {
    /// Turns unless the node's SM board shows room to pace (the default).
    Auto,
    /// Always turns beside others (`true`: before the board).
    Always,
    /// Never: paced beside others too (`false`), whatever they sum to.
    Never,
}

/// `auto` (Some(None)), `true` or `false` (and the usual spellings of the
/// two); None for anything else.
fn parse_auto(v: &str) -> Option<Option<bool>> {
    match v.trim().to_ascii_lowercase().as_str() {
        "auto" => Some(None),
        other => parse_bool(other).map(Some),
    }
}

impl Turns {
    /// `auto`, `true` or `false` (and the usual spellings of the two).
    pub fn parse(v: &str) -> Option<Turns> {
        parse_auto(v).map(|on| match on {
            None => Turns::Auto,
            Some(true) => Turns::Always,
            Some(false) => Turns::Never,
        })
    }
}

/// `VGPU_OVERSUBSCRIBE_VMM`: whether large `cuMemAlloc_v2` blocks are
/// served from the driver's virtual memory management, so that a
/// suspension moves them itself at bus speed (docs/oversubscription.md,
/// 2b).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vmm {
    /// Where every GPU the process sees supports virtual memory
    /// management (the default).
    Auto,
    /// Always (`true`).
    Always,
    /// Never (`false`): the checkpoint API moves everything.
    Never,
}

impl Vmm {
    /// `auto`, `true` or `false` (and the usual spellings of the two).
    pub fn parse(v: &str) -> Option<Vmm> {
        parse_auto(v).map(|on| match on {
            None => Vmm::Auto,
            Some(true) => Vmm::Always,
            Some(false) => Vmm::Never,
        })
    }
}

/// Oversubscription settings (docs/oversubscription.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Oversub {
    /// `VGPU_OVERSUBSCRIBE_WAIT_MS`: how long an allocation the card
    /// cannot hold waits for room before `CUDA_ERROR_OUT_OF_MEMORY`.
    pub wait_ms: u64,
    /// `VGPU_OVERSUBSCRIBE_RESTORE_WAIT_MS`: how long a suspended process's
    /// CUDA call waits for room to restore it before it returns
    /// `CUDA_ERROR_OUT_OF_MEMORY` (the process stays suspended).
    pub restore_wait_ms: u64,
    /// `VGPU_OVERSUBSCRIBE_IDLE_MS`: how long a process must have made no
    /// CUDA call before it may be suspended.
    pub idle_ms: u64,
    /// `VGPU_OVERSUBSCRIBE_QUANTUM_MS`: how long a busy process keeps the
    /// card while others wait for it before it gives its turn (0: it
    /// never gives one). None: the default for how its switches move
    /// memory ([`default_quantum_ms`]).
    pub quantum_ms: Option<u64>,
    /// `VGPU_OVERSUBSCRIBE_HOST_LIMIT`: bytes of suspended state the node
    /// may hold on the host (None: half of the node's memory).
    pub host_limit: Option<u64>,
    /// `VGPU_OVERSUBSCRIBE_DIR`: the directory of the node's board, shared
    /// by every oversubscribed container on the node (default: root's
    /// `/run/vgpu-oversub`, others' `/tmp/vgpu-oversub`).
    pub dir: PathBuf,
    /// `VGPU_OVERSUBSCRIBE_VMM`.
    pub vmm: Vmm,
    /// `VGPU_TEST_WATCHER_STOP=1`: the watcher ends after its first
    /// suspension, as a dead actor would (tests only).
    pub test_watcher_stop: bool,
    /// `VGPU_TEST_CLAIM_BOUND_MS`: how long other restores' claims may
    /// hold a restore up (tests only; 120 s otherwise).
    pub test_claim_bound_ms: Option<u64>,
    /// `VGPU_TEST_ARENA_KEEP_MS`: how long the VMM host arena stays
    /// pinned after the last request for it (tests only; 30 s otherwise).
    pub test_arena_keep_ms: Option<u64>,
}

/// The default quantum: switching costs at most 5 % of the time for a
/// 43 GiB job at the switch rate measured on the H100 (2.2 GB/s out,
/// 3.4 GB/s back): 19 x 46.2 GB x (1/2.2 + 1/3.4) s = 657 s
/// (docs/oversubscription.md, "Turns").
pub const DEFAULT_QUANTUM_MS: u64 = 660_000;

/// The default quantum where blocks are VMM-backed: the same 5 %
/// at the VMM switches' slowest rates after the first (45.7 GB/s out,
/// 38.1 GB/s back, run 107), with the context's checkpoint going too
/// (1.0 s out, 0.8 s back, run 105): 19 x (46.2 GB x (1/45.7 + 1/38.1)
/// s + 1.8 s) = 76 s (docs/oversubscription.md, "Turns").
pub const DEFAULT_VMM_QUANTUM_MS: u64 = 80_000;

/// The default quantum for switches that move blocks by VMM copies
/// (`by_copies`) or by the checkpoint API (docs/oversubscription.md
/// derives both).
pub fn default_quantum_ms(by_copies: bool) -> u64 {
    if by_copies {
        DEFAULT_VMM_QUANTUM_MS
    } else {
        DEFAULT_QUANTUM_MS
    }
}

impl Default for Oversub {
    fn default() -> Oversub {
        Oversub {
            wait_ms: 30_000,
            restore_wait_ms: 600_000,
            idle_ms: 2_000,
            quantum_ms: None,
            host_limit: None,
            dir: vgpu_shm::board::default_dir(),
            vmm: Vmm::Auto,
            test_watcher_stop: false,
            test_claim_bound_ms: None,
            test_arena_keep_ms: None,
        }
    }
}
