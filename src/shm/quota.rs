//! Reserve-then-check over the slot counters: no lock, never an overcommit.
//!
//! A request is first added to the requester's own counter, then every
//! slot is summed. Both steps are `SeqCst`, so of two racing requests at
//! least one sees the other's addition: both may be refused, but never both
//! granted past the limit.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use crate::Region;
use crate::index::{EntryIndex, SlotIndex};
use crate::layout::Kind;
use crate::procinfo::{monotonic_ms, my_pidns, pid_exists};
use crate::slots::STALE_MS;

/// The answer to a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// The bytes are counted in the slot.
    Granted,
    /// Nothing was reserved.
    Denied {
        /// The device's memory limit.
        limit: u64,
        /// The container's usage without the request.
        used: u64,
        /// The bytes asked for.
        asked: u64,
    },
}

/// Which slots a sum covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owners {
    /// Every claimed slot, dead or alive: what the quota check must count
    /// until a reclaim has run.
    All,
    /// Slots whose owner may still live (its pid exists, for our own
    /// namespace; a fresh heartbeat, for others): what a view
    /// (nvidia-smi) should show.
    Live,
}

impl Region {
    /// Reserves `bytes` of `kind` on device `dev` for slot `slot`.
    pub fn reserve(&self, slot: SlotIndex, dev: EntryIndex, kind: Kind, bytes: u64) -> Reservation {
        let limit = self.device(dev).mem_limit.load(Ordering::SeqCst);
        let counter = &self.slot(slot).usage[dev.get()][kind as usize];
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
    pub fn unreserve(&self, slot: SlotIndex, dev: EntryIndex, kind: Kind, bytes: u64) {
        sub_saturating(&self.slot(slot).usage[dev.get()][kind as usize], bytes);
    }

    /// Adds bytes without a check: memory this process already holds,
    /// counted again in a new slot.
    pub fn add_usage(&self, slot: SlotIndex, dev: EntryIndex, kind: Kind, bytes: u64) {
        self.slot(slot).usage[dev.get()][kind as usize].fetch_add(bytes, Ordering::SeqCst);
    }

    /// Sets a counter outright: context overhead measured from NVML.
    pub fn set_usage(&self, slot: SlotIndex, dev: EntryIndex, kind: Kind, bytes: u64) {
        self.slot(slot).usage[dev.get()][kind as usize].store(bytes, Ordering::SeqCst);
    }

    /// Bytes slot `slot` holds on device `dev`, by kind.
    pub fn slot_usage(&self, slot: SlotIndex, dev: EntryIndex, kind: Kind) -> u64 {
        self.slot(slot).usage[dev.get()][kind as usize].load(Ordering::SeqCst)
    }

    /// Bytes slot `slot` holds on device `dev`, all kinds.
    pub fn slot_total(&self, slot: SlotIndex, dev: EntryIndex) -> u64 {
        self.slot(slot).usage[dev.get()]
            .iter()
            .fold(0u64, |acc, c| acc.saturating_add(c.load(Ordering::SeqCst)))
    }

    /// The container's usage of device `dev`.
    pub fn device_usage(&self, dev: EntryIndex, owners: Owners) -> u64 {
        let (my_ns, now) = match owners {
            Owners::Live => (my_pidns(), monotonic_ms()),
            Owners::All => (0, 0),
        };
        let mut total = 0u64;
        for i in SlotIndex::first(self.slot_hwm()) {
            let slot = self.slot(i);
            let pid = slot.pid.load(Ordering::SeqCst);
            if pid == 0 || (owners == Owners::Live && !self.may_live(i, my_ns, now)) {
                continue;
            }
            total = total.saturating_add(self.slot_total(i, dev));
        }
        total
    }

    /// A cheap liveness guess for views: `kill(pid, 0)` in our own
    /// namespace, the heartbeat elsewhere.
    pub fn may_live(&self, slot: SlotIndex, my_ns: u64, now: u64) -> bool {
        let s = self.slot(slot);
        if s.pidns.load(Ordering::Acquire) == my_ns {
            return pid_exists(s.pid.load(Ordering::Acquire));
        }
        self.heartbeat_age_ms(slot, now)
            .is_none_or(|age| age < STALE_MS)
    }
}

fn sub_saturating(counter: &AtomicU64, bytes: u64) {
    let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
        Some(v.saturating_sub(bytes))
    });
}
