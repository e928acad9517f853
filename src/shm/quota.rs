//! Reserve-then-check over the slot counters: no lock, never an overcommit.
//!
//! A request is first added to the requester's own counter, then every
//! slot is summed. Both steps are `SeqCst`, so of two racing requests at
//! least one sees the other's addition: both may be refused, but never both
//! granted past the limit.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use crate::Region;
use crate::layout::Kind;
use crate::procinfo::pid_exists;

/// The answer to a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    Granted,
    /// Nothing was reserved. `used` is the container's usage without the
    /// request.
    Denied {
        limit: u64,
        used: u64,
        asked: u64,
    },
}

/// Which slots a sum covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owners {
    /// Every claimed slot, dead or alive: what the quota check must count
    /// until a reclaim has run.
    All,
    /// Slots whose pid still exists: what a view (nvidia-smi) should show.
    Live,
}

impl Region {
    /// Reserves `bytes` of `kind` on device `dev` for slot `slot`.
    pub fn reserve(&self, slot: usize, dev: usize, kind: Kind, bytes: u64) -> Reservation {
        let limit = self.device(dev).mem_limit.load(Ordering::SeqCst);
        let counter = &self.slot(slot).usage[dev][kind as usize];
        if limit != 0 && bytes > limit {
            let used = self.device_usage(dev, Owners::All);
            return Reservation::Denied {
                limit,
                used,
                asked: bytes,
            };
        }
        counter.fetch_add(bytes, Ordering::SeqCst);
        if limit == 0 {
            return Reservation::Granted;
        }
        let used = self.device_usage(dev, Owners::All);
        if used <= limit {
            return Reservation::Granted;
        }
        sub_saturating(counter, bytes);
        Reservation::Denied {
            limit,
            used: used.saturating_sub(bytes),
            asked: bytes,
        }
    }

    /// Returns bytes reserved earlier (a free, or a failed allocation).
    pub fn unreserve(&self, slot: usize, dev: usize, kind: Kind, bytes: u64) {
        sub_saturating(&self.slot(slot).usage[dev][kind as usize], bytes);
    }

    /// Sets a counter outright: context overhead measured from NVML.
    pub fn set_usage(&self, slot: usize, dev: usize, kind: Kind, bytes: u64) {
        self.slot(slot).usage[dev][kind as usize].store(bytes, Ordering::SeqCst);
    }

    /// Bytes slot `slot` holds on device `dev`, by kind.
    pub fn slot_usage(&self, slot: usize, dev: usize, kind: Kind) -> u64 {
        self.slot(slot).usage[dev][kind as usize].load(Ordering::SeqCst)
    }

    /// Bytes slot `slot` holds on device `dev`, all kinds.
    pub fn slot_total(&self, slot: usize, dev: usize) -> u64 {
        self.slot(slot).usage[dev]
            .iter()
            .fold(0u64, |acc, c| acc.saturating_add(c.load(Ordering::SeqCst)))
    }

    /// The container's usage of device `dev`.
    pub fn device_usage(&self, dev: usize, owners: Owners) -> u64 {
        let mut total = 0u64;
        for i in 0..self.slot_hwm() {
            let slot = self.slot(i);
            let pid = slot.pid.load(Ordering::SeqCst);
            if pid == 0 || (owners == Owners::Live && !pid_exists(pid)) {
                continue;
            }
            total = total.saturating_add(self.slot_total(i, dev));
        }
        total
    }
}

fn sub_saturating(counter: &AtomicU64, bytes: u64) {
    let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
        Some(v.saturating_sub(bytes))
    });
}
