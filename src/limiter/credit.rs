//! The limiter's side of one device entry in this process: whether an SM
//! limit is in force there, as the region said at the last look, and the
//! GPU time bought from the device's bucket and not yet spent. One of
//! these is part of each `process::DeviceState`.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// The limiter's state for one device entry.
pub struct DeviceCredit {
    /// An SM limit is in force on the device (refreshed at each new
    /// context and each watcher tick): a launch reads no shared memory
    /// until it buys time.
    enforced: AtomicBool,
    /// GPU-ns bought and not yet spent. Launches spend it without touching
    /// the shared bucket or the clock.
    credit: AtomicI64,
}

impl DeviceCredit {
    /// No limit known, nothing bought.
    pub const fn new() -> DeviceCredit {
        DeviceCredit {
            enforced: AtomicBool::new(false),
            credit: AtomicI64::new(0),
        }
    }

    /// Nothing bought (a forked child's): the limit is looked up again.
    pub fn reset(&self) {
        self.enforced.store(false, Ordering::Release);
        self.credit.store(0, Ordering::Relaxed);
    }

    /// Whether an SM limit was in force at the last look.
    pub fn enforced(&self) -> bool {
        self.enforced.load(Ordering::Relaxed)
    }

    pub(super) fn set_enforced(&self, on: bool) {
        self.enforced.store(on, Ordering::Release);
    }

    /// Spends `cost` GPU-ns of credit; false (nothing spent) when there is
    /// not that much.
    pub(super) fn spend(&self, cost: i64) -> bool {
        if self.credit.fetch_sub(cost, Ordering::Relaxed) >= cost {
            return true;
        }
        self.credit.fetch_add(cost, Ordering::Relaxed);
        false
    }

    /// Adds GPU-ns bought from the bucket and not spent.
    pub(super) fn add(&self, ns: i64) {
        self.credit.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Default for DeviceCredit {
    fn default() -> DeviceCredit {
        DeviceCredit::new()
    }
}
