//! The limiter's side of one device entry in this process: whether an SM
//! limit is in force there, as the region said at the last look, and the
//! GPU time bought from the device's bucket and not yet spent, and how
//! this process judged the device's last windows (`probes.rs`). One of
//! these is part of each `process::DeviceState`, so a forked child starts
//! them afresh.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// The limiter's state for one device entry.
pub struct DeviceCredit {
    /// An SM limit is in force on the device (refreshed at each new
    /// context and each watcher tick): a launch reads no shared memory
    /// until it buys time.
    enforced: AtomicBool,
    /// GPU-ns bought and not yet spent. Launches spend it without touching
    /// the shared bucket or the clock.
    credit: AtomicI64,
    /// How this process judged the device's windows.
    pub(super) turns: DeviceTurns,
}

/// This process's judging of one device's windows (`judge.rs`).
pub(super) struct DeviceTurns {
    /// Whether the last window judged opened beside another.
    pub(super) late: AtomicBool,
    /// Whether the last window judged had another's inside it.
    pub(super) nested: AtomicBool,
    /// Whether the last window judged in full ran on from a clear start
    /// (a window during which the turns moved, as the one after a move
    /// mostly is, keeps it: `judge::Reason::Moved`).
    pub(super) ran_on: AtomicBool,
    /// Windows judged in a row whose probes all ran beside another
    /// context (`turns::next_streak`).
    pub(super) covered: AtomicU32,
    /// The last period judged. Probes of it or before that finish late
    /// are dropped: the window was judged without them.
    pub(super) judged: AtomicU64,
}

impl DeviceTurns {
    const fn new() -> DeviceTurns {
        DeviceTurns {
            late: AtomicBool::new(false),
            nested: AtomicBool::new(false),
            ran_on: AtomicBool::new(false),
            covered: AtomicU32::new(0),
            judged: AtomicU64::new(0),
        }
    }

    fn reset(&self) {
        self.late.store(false, Ordering::Relaxed);
        self.nested.store(false, Ordering::Relaxed);
        self.ran_on.store(false, Ordering::Relaxed);
        self.covered.store(0, Ordering::Relaxed);
        self.judged.store(0, Ordering::Relaxed);
    }

    /// The last period judged.
    pub(super) fn judged(&self) -> u64 {
        self.judged.load(Ordering::Relaxed)
    }
}

impl DeviceCredit {
    /// No limit known, nothing bought.
    pub const fn new() -> DeviceCredit {
        DeviceCredit {
            enforced: AtomicBool::new(false),
            credit: AtomicI64::new(0),
            turns: DeviceTurns::new(),
        }
    }

    /// Nothing bought (a forked child's): the limit is looked up again.
    pub fn reset(&self) {
        self.enforced.store(false, Ordering::Release);
        self.credit.store(0, Ordering::Relaxed);
        self.turns.reset();
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

    /// Whether `cost` GPU-ns of credit are there to spend.
    pub(super) fn holds(&self, cost: i64) -> bool {
        self.credit.load(Ordering::Relaxed) >= cost
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
