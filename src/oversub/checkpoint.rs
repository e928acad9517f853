//! The driver's checkpoint API, applied by this process to itself
//! (docs/oversubscription.md, section 1, has the facts and sources).
#![forbid(unsafe_code)]

use std::ffi::c_int;

use crate::cuda::real;
use crate::cuda::sys::{CUresult, CheckpointLockArgs};
use crate::ffi::{In, Out};

/// `CUprocessState` values.
pub const RUNNING: c_int = 0;
pub const FAILED: c_int = 3;

fn own_pid() -> c_int {
    std::process::id() as c_int
}

fn ok(rc: CUresult) -> Result<(), CUresult> {
    if rc.is_ok() { Ok(()) } else { Err(rc) }
}

/// Locks this process's CUDA calls, waiting up to `timeout_ms` for calls
/// in flight and submitted work (on a timeout it stays running).
pub fn lock(timeout_ms: u32) -> Result<(), CUresult> {
    let args = CheckpointLockArgs {
        timeout_ms,
        ..Default::default()
    };
    ok(real::cuCheckpointProcessLock(own_pid(), In::from(&args)))
}

/// Moves this process's device memory to the host (locked → checkpointed).
pub fn checkpoint() -> Result<(), CUresult> {
    ok(real::checkpoint_process(own_pid()))
}

/// Moves it back (checkpointed → locked); the card must have room.
pub fn restore() -> Result<(), CUresult> {
    ok(real::restore_process(own_pid()))
}

/// Lets calls through again (locked → running).
pub fn unlock() -> Result<(), CUresult> {
    ok(real::unlock_process(own_pid()))
}

/// The driver's view of this process (`CUprocessState`).
pub fn state() -> Option<c_int> {
    let mut s: c_int = -1;
    real::cuCheckpointProcessGetState(own_pid(), Out::from(&mut s))
        .is_ok()
        .then_some(s)
}
