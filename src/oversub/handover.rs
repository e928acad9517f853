//! What a suspension and its restore hand each other, and what both
//! watch: the host copy's cards, the watcher's beat, when the process
//! last called CUDA, the allocations waiting for room, and a slot
//! heartbeat across a long call. Here, below suspend.rs, restore.rs and
//! admission.rs, so that each of them imports it rather than another.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::attach::Attach;
use crate::lock::{Listed, Lock, Name, keep};

/// The watcher's last tick.
pub(super) static BEAT: AtomicU64 = AtomicU64::new(0);
/// When the process last called CUDA, as the watcher saw it.
pub(super) static LAST_ACTIVE: AtomicU64 = AtomicU64::new(0);
/// Allocations of this process waiting for room now (admission.rs).
pub(super) static WAITING: AtomicU64 = AtomicU64::new(0);
/// What the process held on each card when it was suspended: what its
/// restore brings back there.
pub(super) static SAVED: Lock<Vec<([u8; 16], u64)>> = Lock::new(Vec::new(), keep);

/// This module's lock, for the fork handlers (`fork.rs`).
pub(super) fn locks() -> [Listed; 1] {
    [(Name::of("oversub.saved"), &SAVED)]
}

/// Runs `call` (a checkpoint: 25 s for 46 GiB on an H200) while a
/// helper thread beats the region slot every half second, as the watcher
/// would: in a pid namespace a slot without a heartbeat looks dead to its
/// neighbours after 3 s. (The beat touches neither CUDA nor NVML.)
pub(super) fn beating<R>(attach: Option<&Attach>, call: impl FnOnce() -> R) -> R {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let beat = std::thread::Builder::new()
            .name("vgpu-beat".into())
            .spawn_scoped(s, || {
                while !done.load(Ordering::Acquire) {
                    if let Some(a) = attach {
                        a.tick();
                    }
                    std::thread::park_timeout(Duration::from_millis(500));
                }
            });
        let r = call();
        done.store(true, Ordering::Release);
        if let Ok(t) = beat {
            t.thread().unpark();
        }
        r
    })
}
