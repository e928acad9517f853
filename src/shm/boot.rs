//! A region on persistent storage outlives a reboot. Nothing of the old
//! boot's state is true in the new one: its processes are gone, and its
//! bucket times are on a `CLOCK_MONOTONIC` that restarted. So a region
//! records the boot that last used it, and the first process of another
//! boot resets the slots and the buckets (limits and learnt context costs
//! stay: they are configuration and knowledge, not state).
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::Region;
use crate::layout::{Header, MAX_SLOTS};
use crate::lock::RegionGuard;

fn recorded(h: &Header) -> [u64; 2] {
    [
        h.boot_id[0].load(Ordering::Acquire),
        h.boot_id[1].load(Ordering::Acquire),
    ]
}

fn record(h: &Header, id: [u64; 2]) {
    h.boot_id[0].store(id[0], Ordering::Release);
    h.boot_id[1].store(id[1], Ordering::Release);
}

impl Region {
    /// Under the lock, at attach: resets state left by another boot, and
    /// records this boot. A region with no boot recorded (written by a
    /// library older than 1.1, whose processes may be alive) is only
    /// stamped. Returns whether it reset anything.
    pub(crate) fn settle_boot(&self, _guard: &RegionGuard<'_>, now: Option<[u64; 2]>) -> bool {
        let Some(now) = now else { return false };
        let h = self.header();
        let was = recorded(h);
        if was == now {
            return false;
        }
        let other_boot = was != [0, 0];
        if other_boot {
            for i in crate::SlotIndex::first(MAX_SLOTS) {
                if self.slot(i).pid.load(Ordering::Acquire) != 0 {
                    self.release_slot(i);
                }
            }
            h.slot_hwm.store(0, Ordering::Release);
            for d in &h.devices {
                d.tat_ns.store(0, Ordering::Release);
                d.leader.store(0, Ordering::Release);
                d.util_milli.store(0, Ordering::Release);
                d.rate_scale_milli.store(1000, Ordering::Release);
                // Times of the last boot's clock: they could lie in this
                // one's future.
                d.turn_shared_ns.store(0, Ordering::Release);
                d.alone_ns.store(0, Ordering::Release);
                d.paced_ns.store(0, Ordering::Release);
                d.rest_beside_ns.store(0, Ordering::Release);
                d.limited_beside_ns.store(0, Ordering::Release);
            }
        }
        record(h, now);
        other_boot
    }
}
