//! The per-process background thread, started with the first context (or
//! at `cuInit` when limits are set, so NVML comes up while the driver
//! does). Every 100 ms, and at once when kicked, it:
//! - beats in this process's slot, and checks the region file is intact
//!   (`Attach::tick`);
//! - resolves this process's host pid (`hostpid`);
//! - measures context overhead on the devices this process uses;
//! - picks up SM limits that appeared in the region;
//! - leads the compute bucket of each limited device it is elected for;
//! - reads what a node monitor wrote into the HAMi part, marks the
//!   container's launches there, and keeps the HAMi part true when it is
//!   elected to (`hami`);
//! - with `CUDA_OVERSUBSCRIBE`, suspends and restores this process
//!   (`oversub`), and does nothing else while it is suspended.
//!
//! It holds no lock of ours across a driver call, makes every NVML call
//! inside a `Guard` (nvml/client.rs), and is restarted lazily in a forked
//! child.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::Thread;
use std::time::Duration;

use crate::attach::Attach;
use crate::limiter::{self, leader::Leader};
use crate::lock::{Listed, Lock, Name};
use crate::nvml::client;
use crate::process;
use crate::quota::overhead;
use crate::{hami, hostpid};

const TICK: Duration = Duration::from_millis(100);
/// Overhead is re-measured at least this often.
const RECONCILE_NS: u64 = 1_000_000_000;

/// The pid that started the thread (a forked child sees another pid).
static STARTED_BY: AtomicU32 = AtomicU32::new(0);
/// The thread, to wake it. A forked child has none until it starts one.
pub static THREAD: Lock<Option<Thread>> = Lock::new(None, |t| *t = None);

/// This module's lock, for the fork handlers (`fork.rs`).
pub fn locks() -> [Listed; 1] {
    [(Name::of("watcher.thread"), &THREAD)]
}

/// Starts the watcher of this process, once.
pub fn start(attach: &'static Attach) {
    let me = std::process::id();
    if STARTED_BY.swap(me, Ordering::AcqRel) == me {
        return;
    }
    match std::thread::Builder::new()
        .name("vgpu-watcher".into())
        .spawn(move || run(attach))
    {
        Ok(h) => *THREAD.lock() = Some(h.thread().clone()),
        Err(e) => {
            crate::warn_once!("cannot start the watcher thread ({e}): overhead is not reconciled")
        }
    }
}

/// Asks for a tick now (a context appeared).
pub fn kick() {
    if let Some(t) = THREAD.lock().as_ref() {
        t.unpark();
    }
}

fn run(attach: &'static Attach) {
    // Beat, and close the gate if a monitor blocks the container, before
    // NVML's initialisation, which can take a while.
    attach.tick();
    hami::observe(attach);
    // Every NVML call below runs in its own Guard (nvml/client.rs).
    client::init();
    let mut leader = Leader::default();
    let mut writer = hami::Writer::default();
    let mut last_reconcile = [0u64; vgpu_shm::MAX_DEVICES];
    loop {
        std::thread::park_timeout(TICK);
        // Oversubscription first: while this process is suspended, nothing
        // else runs (it could call into the locked driver, or NVML, which
        // blocks too) but the heartbeat: its slot, whose memory the
        // container's quota still counts, must not look dead to its
        // neighbours (NVML lists no memory of a suspended process).
        if !crate::oversub::tick(attach) {
            log::warn!("VGPU_TEST_WATCHER_STOP: the watcher thread ends");
            return;
        }
        if crate::oversub::suspended() {
            attach.tick();
            continue;
        }
        attach.tick();
        hami::tick(attach, &mut writer);
        let now = crate::clock::monotonic_ns();
        // Each step below checks the region file first: a truncation is
        // caught microseconds before any access, not a tick later.
        for dev in process::devices_in_use() {
            if !attach.intact() || hostpid::resolve(attach, dev).is_none() {
                continue;
            }
            if let Some(slot) = attach.slot()
                && now.saturating_sub(last_reconcile[dev.get()]) >= RECONCILE_NS / 4
                && overhead::reconcile_now(attach, slot, dev)
            {
                last_reconcile[dev.get()] = now;
            }
        }
        if attach.intact() {
            limiter::refresh(attach, process::devices_in_use());
        }
        for dev in process::devices_in_use() {
            if attach.intact() {
                leader.tick(attach, dev);
            }
        }
    }
}
