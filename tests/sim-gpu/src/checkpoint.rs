//! The driver's checkpoint API (`cuCheckpointProcess*`, driver 570+), for
//! a process acting on itself, the way vgpu uses it:
//! - Lock: every other entry point of the process blocks (at `local()`)
//!   until Unlock; queued work is finished first.
//! - Checkpoint: the process's device memory leaves the card (NVML no
//!   longer lists it) and its contents go to a host file beside the state
//!   file (`state::ckpt_path`), which the next claimer of the entry or
//!   `reclaim_dead` removes if the process dies, as the kernel frees a
//!   dead process's memory.
//! - Restore: the memory is taken on the card again and the contents read
//!   back. When it does not fit: OUT_OF_MEMORY, still checkpointed, and
//!   from then on every restore answers 304 (OPERATING_SYSTEM), as driver
//!   580 does (run 28 on the H200: 8 tries over 8 s with the card empty):
//!   a refused restore loses the process.
//! - Unlock: calls flow again.
//!
//! Another process's pid gets CUDA_ERROR_NOT_SUPPORTED: the simulation
//! models the self-driven case only. `SIM_GPU_CKPT_FAIL=restore` makes a
//! restore fail for good (state FAILED), as an uncorrectable error would.
//! `SIM_GPU_CKPT_FAIL=checkpoint` makes a checkpoint fail (still locked),
//! and `checkpoint-unlock` the unlock after it too, leaving the process
//! locked for good. `SIM_GPU_CKPT_MS` makes a checkpoint take that long (46.7 GiB took 25 s
//! on an H200, run 19), during which the other checkpoint calls fail at
//! once, as the real driver's restore did (304).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::ffi::*;
use crate::local::local_ungated;
use crate::state::{self, MAX_DEV};

pub const RUNNING: c_int = 0;
pub const LOCKED: c_int = 1;
pub const CHECKPOINTED: c_int = 2;
pub const FAILED: c_int = 3;
/// A checkpoint is under way (not a driver state: `GetState` says LOCKED).
const CHECKPOINTING: c_int = -1;

const ILLEGAL_STATE: CUresult = 401;
const OPERATING_SYSTEM: CUresult = 304;
const UNKNOWN: CUresult = 999;

struct Gate {
    state: c_int,
    /// A restore was refused for room: no restore succeeds any more.
    refused: bool,
    /// Device memory and contexts per device while checkpointed.
    used: [u64; MAX_DEV],
    contexts: [u32; MAX_DEV],
}

static GATE: Mutex<Gate> = Mutex::new(Gate {
    state: RUNNING,
    refused: false,
    used: [0; MAX_DEV],
    contexts: [0; MAX_DEV],
});
static OPEN: Condvar = Condvar::new();

fn gate() -> MutexGuard<'static, Gate> {
    crate::local::fork_safe();
    GATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The gate, held across `fork` by the fork handlers (`local.rs`): every
/// entry point takes it a moment, and a child that inherited it held by
/// another thread would block at its first call.
pub struct GateHeld {
    _guard: MutexGuard<'static, Gate>,
}

/// (Not through `gate()`: a fork handler must not register the handlers.)
pub fn hold_gate_for_fork() -> GateHeld {
    GateHeld {
        _guard: GATE.lock().unwrap_or_else(PoisonError::into_inner),
    }
}

/// Blocks the caller while the process is locked or checkpointed (every
/// entry point but these goes through here).
pub fn wait_open() {
    let mut g = gate();
    while g.state != RUNNING {
        g = OPEN.wait(g).unwrap_or_else(PoisonError::into_inner);
    }
}

/// Whether `pid` names the caller; Err: the answer for another pid.
fn own(pid: c_int) -> Result<(), CUresult> {
    if pid == std::process::id() as c_int {
        Ok(())
    } else if pid > 0 && std::path::Path::new(&format!("/proc/{pid}")).exists() {
        Err(NOT_SUPPORTED)
    } else {
        Err(INVALID_VALUE)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessLock(pid: c_int, _args: *mut c_void) -> CUresult {
    tri!(own(pid));
    {
        let mut g = gate();
        if g.state != RUNNING {
            return ILLEGAL_STATE;
        }
        g.state = LOCKED;
    }
    // In-flight calls finish (they hold the tables), then queued work.
    let pending: Vec<(usize, u64)> = {
        let l = local_ungated();
        l.streams
            .values()
            .filter_map(|s| Some((l.ctxs.get(&s.ctx)?.dev, s.last_seq)))
            .filter(|&(_, seq)| seq != 0)
            .collect()
    };
    for (dev, seq) in pending {
        crate::queue::wait(dev, seq);
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessCheckpoint(pid: c_int, _args: *mut c_void) -> CUresult {
    tri!(own(pid));
    let mut g = gate();
    if g.state != LOCKED {
        return ILLEGAL_STATE;
    }
    let slow = std::env::var("SIM_GPU_CKPT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = slow {
        g.state = CHECKPOINTING;
        drop(g);
        std::thread::sleep(std::time::Duration::from_millis(ms));
        g = gate();
        g.state = LOCKED;
    }
    if fails("checkpoint") {
        return UNKNOWN;
    }
    let mut l = local_ungated();
    let path = state::ckpt_path(state::my_entry());
    if write_image(&path, &l.data).is_err() {
        let _ = std::fs::remove_file(&path);
        return UNKNOWN;
    }
    l.data.clear();
    let me = state::me();
    for dev in 0..MAX_DEV {
        g.used[dev] = me.used[dev].swap(0, Ordering::SeqCst);
        g.contexts[dev] = me.contexts[dev].swap(0, Ordering::AcqRel);
    }
    g.state = CHECKPOINTED;
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessRestore(pid: c_int, _args: *mut c_void) -> CUresult {
    tri!(own(pid));
    let mut g = gate();
    if g.state != CHECKPOINTED {
        return ILLEGAL_STATE;
    }
    if g.refused {
        return OPERATING_SYSTEM;
    }
    for dev in 0..MAX_DEV {
        if g.used[dev] != 0 && !state::phys_alloc(dev, g.used[dev]) {
            for d in 0..dev {
                state::phys_free(d, g.used[d]);
            }
            g.refused = true;
            return OUT_OF_MEMORY;
        }
    }
    let path = state::ckpt_path(state::my_entry());
    let image = match read_image(&path) {
        Some(i) if std::env::var("SIM_GPU_CKPT_FAIL").as_deref() != Ok("restore") => i,
        _ => {
            g.state = FAILED;
            return UNKNOWN;
        }
    };
    let _ = std::fs::remove_file(&path);
    let mut l = local_ungated();
    l.data.extend(image);
    let me = state::me();
    for dev in 0..MAX_DEV {
        me.contexts[dev].fetch_add(g.contexts[dev], Ordering::AcqRel);
        g.used[dev] = 0;
        g.contexts[dev] = 0;
    }
    g.state = LOCKED;
    SUCCESS
}

/// Whether `SIM_GPU_CKPT_FAIL` asks this call to fail: `checkpoint` for
/// the checkpoint, `checkpoint-unlock` for it and the unlock after it.
fn fails(call: &str) -> bool {
    let asked = std::env::var("SIM_GPU_CKPT_FAIL").unwrap_or_default();
    match call {
        "checkpoint" => asked == "checkpoint" || asked == "checkpoint-unlock",
        _ => asked == call,
    }
}

/// Writes the process's device memory to `path`: each block's base and
/// length, then its bytes, straight from the blocks (a whole image built
/// first held a second and third copy of a process's GiBs: oversubscription
/// tests in parallel lanes then crowded the CI host's memory).
fn write_image(path: &std::path::Path, data: &HashMap<u64, Vec<u8>>) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (base, bytes) in data {
        f.write_all(&base.to_le_bytes())?;
        f.write_all(&(bytes.len() as u64).to_le_bytes())?;
        f.write_all(bytes)?;
    }
    f.flush()
}

/// The blocks [`write_image`] wrote, each read straight into its own
/// buffer; None if the file is missing, cut short or malformed.
fn read_image(path: &std::path::Path) -> Option<Vec<(u64, Vec<u8>)>> {
    let file = std::fs::File::open(path).ok()?;
    let mut left = file.metadata().ok()?.len();
    let mut f = std::io::BufReader::new(file);
    let mut out = Vec::new();
    while left > 0 {
        let mut head = [0u8; 16];
        f.read_exact(&mut head).ok()?;
        let (base, len) = head.split_at(8);
        let base = u64::from_le_bytes(base.try_into().ok()?);
        let len = u64::from_le_bytes(len.try_into().ok()?);
        left = left.checked_sub(16)?.checked_sub(len)?;
        let mut bytes = vec![0u8; usize::try_from(len).ok()?];
        f.read_exact(&mut bytes).ok()?;
        out.push((base, bytes));
    }
    Some(out)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessUnlock(pid: c_int, _args: *mut c_void) -> CUresult {
    tri!(own(pid));
    let mut g = gate();
    if g.state != LOCKED {
        return ILLEGAL_STATE;
    }
    if fails("checkpoint-unlock") {
        return UNKNOWN;
    }
    g.state = RUNNING;
    OPEN.notify_all();
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessGetState(pid: c_int, out: *mut c_int) -> CUresult {
    tri!(own(pid));
    let state = match gate().state {
        CHECKPOINTING => LOCKED,
        s => s,
    };
    if put(out, state) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessGetRestoreThreadId(
    pid: c_int,
    tid: *mut c_int,
) -> CUresult {
    tri!(own(pid));
    // The main thread stands in for the driver's restore thread.
    if put(tid, pid) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}
