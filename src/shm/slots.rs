//! Process slots: claim, release, and reclaim the slots of dead processes.
//!
//! Slots have fixed indices and are never moved or compacted: a live
//! process's counters stay where every other process sums them. Claim and
//! reclaim run under the region lock; the counters themselves are atomics
//! that only their owner adds to.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Region;
use crate::error::ShmError;
use crate::layout::{MAX_SLOTS, ProcSlot};
use crate::lock::RegionGuard;
use crate::procinfo::{Liveness, ProcId, liveness};

impl Region {
    /// Claims a slot for `me`. A slot already held by the same process
    /// (same pid and start time: an `exec`ed image) is reset and reused.
    /// Dead processes' slots are reclaimed here only when no slot is free:
    /// the driver may still be freeing their memory, so the allocation
    /// path reclaims them once it has checked (see `reclaim_dead_unless`).
    pub fn claim_slot(&self, me: &ProcId) -> Result<usize, ShmError> {
        let guard = self.lock()?;
        if (0..MAX_SLOTS).all(|i| self.slot(i).pid.load(Ordering::Acquire) != 0) {
            self.reclaim_dead_locked(&guard, me.pidns, |_| false);
        }
        let hwm = self.slot_hwm();
        let reuse = (0..hwm).find(|&i| {
            let s = self.slot(i);
            s.pid.load(Ordering::Acquire) == me.pid
                && s.start_time.load(Ordering::Acquire) == me.start_time
        });
        let free = || (0..MAX_SLOTS).find(|&i| self.slot(i).pid.load(Ordering::Acquire) == 0);
        let Some(index) = reuse.or_else(free) else {
            return Err(ShmError::SlotsFull {
                path: self.path().to_path_buf(),
            });
        };
        let slot = self.slot(index);
        clear_counters(slot);
        slot.host_pid.store(0, Ordering::Relaxed);
        slot.start_time.store(me.start_time, Ordering::Relaxed);
        slot.pidns.store(me.pidns, Ordering::Relaxed);
        // In the initial pid namespace NVML reports our own pid.
        if me.pidns == crate::procinfo::INIT_PIDNS {
            slot.host_pid.store(me.pid, Ordering::Relaxed);
        }
        slot.claimed_unix_s.store(unix_now(), Ordering::Relaxed);
        slot.pid.store(me.pid, Ordering::Release);
        if index >= hwm {
            self.header()
                .slot_hwm
                .store(index as u32 + 1, Ordering::Release);
        }
        Ok(index)
    }

    /// Gives a slot back (normal process exit): counters first, then the pid.
    pub fn release_slot(&self, index: usize) {
        let slot = self.slot(index);
        clear_counters(slot);
        slot.pid.store(0, Ordering::Release);
    }

    /// Frees the slots of dead processes so their memory returns to the
    /// quota. Returns how many were reclaimed.
    pub fn reclaim_dead(&self, my_ns: u64) -> Result<u32, ShmError> {
        self.reclaim_dead_unless(my_ns, |_| false)
    }

    /// As [`Region::reclaim_dead`], but keeps a dead process's slot while
    /// `still_held(host_pid)` says the driver still holds its memory (it
    /// frees a killed process's memory moments after the process is gone).
    pub fn reclaim_dead_unless(
        &self,
        my_ns: u64,
        still_held: impl Fn(i32) -> bool,
    ) -> Result<u32, ShmError> {
        let guard = self.lock()?;
        Ok(self.reclaim_dead_locked(&guard, my_ns, still_held))
    }

    fn reclaim_dead_locked(
        &self,
        _guard: &RegionGuard<'_>,
        my_ns: u64,
        still_held: impl Fn(i32) -> bool,
    ) -> u32 {
        let mut reclaimed = 0;
        for i in 0..self.slot_hwm() {
            let slot = self.slot(i);
            let pid = slot.pid.load(Ordering::Acquire);
            if pid == 0 {
                continue;
            }
            let owner = liveness(
                pid,
                slot.start_time.load(Ordering::Acquire),
                slot.pidns.load(Ordering::Acquire),
                my_ns,
            );
            if owner != Liveness::Dead {
                continue;
            }
            let host_pid = slot.host_pid.load(Ordering::Acquire);
            let now = monotonic_ms();
            let since = match slot.dead_since_ms.load(Ordering::Acquire) {
                0 => {
                    slot.dead_since_ms.store(now, Ordering::Release);
                    now
                }
                t => t,
            };
            let held = if host_pid > 0 {
                still_held(host_pid)
            } else {
                now.saturating_sub(since) < UNKNOWN_PID_GRACE_MS
            };
            if !held {
                self.release_slot(i);
                reclaimed += 1;
            }
        }
        if reclaimed > 0 {
            self.header()
                .reclaims
                .fetch_add(u64::from(reclaimed), Ordering::Relaxed);
        }
        reclaimed
    }

    /// Indices of the slots that currently have an owner.
    pub fn occupied_slots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.slot_hwm()).filter(|&i| self.slot(i).pid.load(Ordering::Acquire) != 0)
    }
}

/// How long the slot of a dead process whose host pid was never learnt
/// is kept, in case the driver is still freeing its memory.
pub const UNKNOWN_PID_GRACE_MS: u64 = 2_000;

fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec that we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1000 + ts.tv_nsec as u64 / 1_000_000
}

fn clear_counters(slot: &ProcSlot) {
    for per_device in &slot.usage {
        for counter in per_device {
            counter.store(0, Ordering::Release);
        }
    }
    for util in &slot.sm_util {
        util.store(0, Ordering::Relaxed);
    }
    slot.dead_since_ms.store(0, Ordering::Relaxed);
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
