//! This process's own checkpoint, taken for a suspension (`suspend.rs`):
//! whether a child process can read NVML's free memory (what the restore
//! needs), the lock and the checkpoint, what follows a failed one (the
//! unlock, or the process failed where it stays locked), and the wait
//! before the next try.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use super::checkpoint;
use super::handover::beating;
use super::restore::fail;
use super::state::{Here, STATE, SUSPENDING};
use crate::attach::Attach;
use crate::clock;

/// How long the lock waits for calls in flight before giving up.
const LOCK_TIMEOUT_MS: u32 = 1000;

/// Whether a child process reads NVML's free memory on `card` (what a
/// checkpointed restore needs): one child at most every 10 s where none
/// answers; one that answered stands for 60 s. Says why not, once.
pub(super) fn a_child_reads_nvml(attach: &Attach, card: &[u8; 16]) -> bool {
    static FRESH_FAILED: AtomicU64 = AtomicU64::new(0);
    static FRESH_OK: AtomicU64 = AtomicU64::new(0);
    let now = clock::monotonic_ns();
    let failed = FRESH_FAILED.load(Ordering::Relaxed);
    let ok = FRESH_OK.load(Ordering::Relaxed);
    if ok != 0 && now.saturating_sub(ok) < 60_000_000_000 {
        return true;
    }
    if (failed != 0 && now.saturating_sub(failed) < 10_000_000_000)
        || beating(Some(attach), || {
            crate::nvml::fresh::free_memory(card, crate::nvml::fresh::ANSWER_WAIT)
        })
        .is_none()
    {
        if failed == 0 || now.saturating_sub(failed) >= 10_000_000_000 {
            FRESH_FAILED.store(now.max(1), Ordering::Relaxed);
        }
        crate::warn_once!(
            "CUDA_OVERSUBSCRIBE: a child process could not read NVML's free memory on {} within {} s, which a restore needs: this process is not suspended (asked again in 10 s)",
            vgpu_shm::format_uuid(card),
            crate::nvml::fresh::ANSWER_WAIT.as_secs()
        );
        return false;
    }
    FRESH_OK.store(now.max(1), Ordering::Relaxed);
    true
}

/// When this process's last checkpoint failed (0: none has).
static CHECKPOINT_FAILED_NS: AtomicU64 = AtomicU64::new(0);
/// How long after a failed checkpoint the process is not checkpointed
/// again: each try locks its calls, and a checkpoint that fails every
/// time was tried 66 times in 3 s beside one waiting allocation on the
/// simulated GPU.
const CHECKPOINT_RETRY_NS: u64 = 10_000_000_000;

/// Err where this process's last checkpoint failed less than
/// [`CHECKPOINT_RETRY_NS`] ago.
pub(super) fn not_failed_lately() -> Result<(), String> {
    let failed = CHECKPOINT_FAILED_NS.load(Ordering::Relaxed);
    let since = clock::monotonic_ns().saturating_sub(failed);
    if failed != 0 && since < CHECKPOINT_RETRY_NS {
        return Err(format!(
            "its last checkpoint failed {:.1} s ago (tried again {} s after)",
            since as f64 / 1e9,
            CHECKPOINT_RETRY_NS / 1_000_000_000
        ));
    }
    Ok(())
}

/// Locks and checkpoints this process. Err: why not (empty: the process
/// failed, already said).
pub(super) fn lock_and_checkpoint(attach: &Attach, h: &Here) -> Result<(), String> {
    if let Err(rc) = checkpoint::lock(LOCK_TIMEOUT_MS) {
        return Err(format!(
            "the lock was not taken within {LOCK_TIMEOUT_MS} ms ({rc})"
        ));
    }
    // Not SUSPENDED before the checkpoint is done and SAVED says what to
    // restore: a caller that took the watcher's silence during a 25 s
    // checkpoint for its death restored a half-checkpointed process with
    // nothing saved, and the driver failed it (run 19).
    STATE.store(SUSPENDING, Ordering::Release);
    if let Err(rc) = beating(Some(attach), checkpoint::checkpoint) {
        CHECKPOINT_FAILED_NS.store(clock::monotonic_ns().max(1), Ordering::Relaxed);
        if checkpoint::state() == Some(checkpoint::FAILED) {
            fail(
                h,
                format!("the checkpoint failed ({rc}) and the driver marks the process failed"),
            );
            return Err(String::new());
        }
        if let Err(unlock_rc) = checkpoint::unlock().or_else(|_| checkpoint::unlock())
            && checkpoint::state() != Some(checkpoint::RUNNING)
        {
            // Still locked (tried twice), every later CUDA call of the
            // process would wait for good: its hooked calls fail instead
            // (one already inside the driver stays blocked).
            fail(
                h,
                format!(
                    "the checkpoint failed ({rc}) and the process could not be unlocked ({unlock_rc})"
                ),
            );
            return Err(String::new());
        }
        return Err(format!("the checkpoint failed ({rc})"));
    }
    Ok(())
}
