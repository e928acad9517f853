//! Process slots: claim, release, and reclaim the slots of dead processes.
//!
//! Slots have fixed indices and are never moved or compacted: a live
//! process's counters stay where every other process sums them. Claim and
//! reclaim run under the region lock; the counters themselves are atomics
//! that only their owner adds to.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Region;
use crate::error::ShmError;
use crate::index::{EntryIndex, SlotIndex};
use crate::layout::{MAX_SLOTS, ProcSlot, SLOT_HOST_PID_VERIFIED};
use crate::lock::RegionGuard;
use crate::procinfo::{INIT_PIDNS, Liveness, Owner, ProcId, ProcView, liveness, monotonic_ms};

/// How long the slot of a dead process whose host pid was never learnt
/// is kept, in case the driver is still freeing its memory.
pub const UNKNOWN_PID_GRACE_MS: u64 = 2_000;
/// A slot whose owner no `/proc` here can see is the driver's to judge
/// once its heartbeat is this old (the owner beats every 100 ms).
pub const STALE_MS: u64 = 3_000;
/// An unseen owner's slot still counts as being judged for this long
/// after its heartbeat reached [`STALE_MS`]: the judging poll that
/// crossed it may have found no driver list (a restart's first
/// allocation was refused just past 3 s under load, its predecessor's
/// slot unjudged).
pub const VERDICT_MARGIN_MS: u64 = 1_000;
/// A heartbeat this old has stopped (owners beat every 100 ms).
pub const BEAT_STOPPED_MS: u64 = 500;
/// How often a live owner beats (its watcher's tick).
pub const BEAT_MS: u64 = 100;

/// The heartbeat word: the owner's pid (low 24 bits) above 40 bits of
/// CLOCK_MONOTONIC ms, so a beat left by a previous owner of the slot
/// (or never written, by a library older than 1.1) is not taken for one.
const BEAT_MS_BITS: u32 = 40;
const BEAT_MS_MASK: u64 = (1 << BEAT_MS_BITS) - 1;

fn beat_tag(pid: i32) -> u64 {
    u64::from(pid as u32 & 0xff_ffff)
}

impl Region {
    /// Claims a slot for `me`, whose host pid the kernel gave as
    /// `host_pid` (None: unknown; in the initial namespace it is the pid).
    /// A slot already held by the same process (same pid, start time and
    /// namespace: an `exec`ed image) is reset and reused. Dead processes'
    /// slots are reclaimed here only when no slot is free: the driver may
    /// still be freeing their memory, so the allocation path reclaims them
    /// once it has asked NVML (see [`Region::reclaim_dead`]).
    pub fn claim_slot_as(&self, me: &ProcId, host_pid: Option<i32>) -> Result<SlotIndex, ShmError> {
        let guard = self.lock()?;
        if SlotIndex::first(MAX_SLOTS).all(|i| self.slot(i).pid.load(Ordering::Acquire) != 0) {
            self.reclaim_dead_locked(&guard, &ProcView::current(), None);
        }
        let hwm = self.slot_hwm();
        let reuse = SlotIndex::first(hwm).find(|&i| {
            let s = self.slot(i);
            s.pid.load(Ordering::Acquire) == me.pid
                && s.start_time.load(Ordering::Acquire) == me.start_time
                && s.pidns.load(Ordering::Acquire) == me.pidns
        });
        let free =
            || SlotIndex::first(MAX_SLOTS).find(|&i| self.slot(i).pid.load(Ordering::Acquire) == 0);
        let Some(index) = reuse.or_else(free) else {
            return Err(ShmError::SlotsFull {
                path: self.path().to_path_buf(),
            });
        };
        self.fill_slot(index, me, host_pid);
        if index.get() >= hwm {
            self.header()
                .slot_hwm
                .store(index.get() as u32 + 1, Ordering::Release);
        }
        Ok(index)
    }

    /// [`Region::claim_slot_as`] with no host pid from the kernel.
    pub fn claim_slot(&self, me: &ProcId) -> Result<SlotIndex, ShmError> {
        self.claim_slot_as(me, None)
    }

    /// Puts `me` in slot `index` outright, without the lock: for a private
    /// copy of a region, which keeps this process's slot index.
    pub fn claim_slot_at(&self, index: SlotIndex, me: &ProcId, host_pid: Option<i32>) {
        self.fill_slot(index, me, host_pid);
        let hwm = &self.header().slot_hwm;
        hwm.fetch_max(index.get() as u32 + 1, Ordering::AcqRel);
    }

    fn fill_slot(&self, index: SlotIndex, me: &ProcId, host_pid: Option<i32>) {
        let slot = self.slot(index);
        clear_counters(slot);
        slot.start_time.store(me.start_time, Ordering::Relaxed);
        slot.pidns.store(me.pidns, Ordering::Relaxed);
        let host = host_pid.or((me.pidns == INIT_PIDNS).then_some(me.pid));
        slot.host_pid.store(host.unwrap_or(0), Ordering::Relaxed);
        let flags = if host.is_some() {
            SLOT_HOST_PID_VERIFIED
        } else {
            0
        };
        slot.flags.store(flags, Ordering::Relaxed);
        slot.claimed_unix_s.store(unix_now(), Ordering::Relaxed);
        slot.heartbeat_ms
            .store(beat_word(me.pid, monotonic_ms()), Ordering::Relaxed);
        slot.pid.store(me.pid, Ordering::Release);
    }

    /// Gives a slot back: counters first, then the pid.
    pub fn release_slot(&self, index: SlotIndex) {
        let slot = self.slot(index);
        clear_counters(slot);
        slot.host_pid.store(0, Ordering::Relaxed);
        slot.flags.store(0, Ordering::Relaxed);
        slot.heartbeat_ms.store(0, Ordering::Relaxed);
        slot.pid.store(0, Ordering::Release);
    }

    /// The owner of slot `index` says it is alive (its watcher, each tick).
    pub fn beat(&self, index: SlotIndex, pid: i32) {
        self.slot(index)
            .heartbeat_ms
            .store(beat_word(pid, monotonic_ms()), Ordering::Release);
    }

    /// How long ago slot `index`'s owner last beat, at `now` (ms); None
    /// when its owner never beat (a library older than 1.1 wrote it). A
    /// beat from the future (another clock) counts as stale.
    pub fn heartbeat_age_ms(&self, index: SlotIndex, now: u64) -> Option<u64> {
        let s = self.slot(index);
        let word = s.heartbeat_ms.load(Ordering::Acquire);
        if word == 0 || word >> BEAT_MS_BITS != beat_tag(s.pid.load(Ordering::Acquire)) {
            return None;
        }
        let at = word & BEAT_MS_MASK;
        let now = now & BEAT_MS_MASK;
        Some(if at > now + 1_000 {
            STALE_MS
        } else {
            now.saturating_sub(at)
        })
    }

    /// Records the host pid NVML (`verified` false) or the kernel gave.
    pub fn set_host_pid(&self, index: SlotIndex, host_pid: i32, verified: bool) {
        let s = self.slot(index);
        let flags = if verified { SLOT_HOST_PID_VERIFIED } else { 0 };
        s.flags.store(flags, Ordering::Release);
        s.host_pid.store(host_pid, Ordering::Release);
    }

    /// The pid NVML reports for slot `index`'s owner, while known.
    pub fn host_pid(&self, index: SlotIndex) -> Option<u32> {
        Some(self.slot(index).host_pid.load(Ordering::Acquire))
            .filter(|&p| p > 0)
            .map(|p| p as u32)
    }

    /// Slot `index`'s owner's pid in its own namespace (0: a free slot).
    pub fn pid(&self, index: SlotIndex) -> i32 {
        self.slot(index).pid.load(Ordering::Acquire)
    }

    /// Shows slot `index`'s SM utilisation of device `dev`, in percent.
    pub fn set_sm_util(&self, index: SlotIndex, dev: EntryIndex, percent: u32) {
        self.slot(index).sm_util[dev.get()].store(percent, Ordering::Relaxed);
    }

    /// Slot `index`'s SM utilisation of device `dev` as last shown, in
    /// percent.
    pub fn sm_util(&self, index: SlotIndex, dev: EntryIndex) -> u32 {
        self.slot(index).sm_util[dev.get()].load(Ordering::Relaxed)
    }

    /// Adds `ns` of host gap (a synchronisation's return to the next
    /// launch) to slot `index`, counted for device `dev`, the one device
    /// its process uses: a slot counts for the first device it is given.
    pub fn add_host_gap(&self, index: SlotIndex, dev: EntryIndex, ns: u64) {
        let slot = self.slot(index);
        let want = dev.get() as u64 + 1;
        // (Set once: read first, so that each gap is not a write.)
        let counted_for = match slot.gap_device.load(Ordering::Relaxed) {
            0 => slot
                .gap_device
                .compare_exchange(0, want, Ordering::Relaxed, Ordering::Relaxed)
                .map_or_else(|d| d, |_| want),
            d => d,
        };
        if counted_for == want {
            slot.host_gap_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// The host gaps the container's live processes counted for device
    /// `dev` ([`Region::add_host_gap`]), summed: it falls where a process
    /// left, and anyone who maps the region can write it, so readers take
    /// differences saturating and bound them.
    pub fn host_gap_ns(&self, dev: EntryIndex) -> u64 {
        let want = dev.get() as u64 + 1;
        self.occupied_slots()
            .map(|i| self.slot(i))
            .filter(|s| s.gap_device.load(Ordering::Relaxed) == want)
            .fold(0u64, |sum, s| {
                sum.saturating_add(s.host_gap_ns.load(Ordering::Relaxed))
            })
    }

    /// Slot `index`'s owner, as the slot records it.
    pub fn owner(&self, index: SlotIndex) -> Owner {
        let s = self.slot(index);
        Owner {
            pid: s.pid.load(Ordering::Acquire),
            start_time: s.start_time.load(Ordering::Acquire),
            pidns: s.pidns.load(Ordering::Acquire),
            host_pid: s.host_pid.load(Ordering::Acquire),
            host_pid_verified: s.flags.load(Ordering::Acquire) & SLOT_HOST_PID_VERIFIED != 0,
        }
    }

    /// Frees the slots of dead processes so their memory returns to the
    /// quota; returns how many. `driver` lists the host pids NVML shows on
    /// any of the container's devices (None: NVML cannot be asked).
    /// - An owner `/proc` shows dead keeps its slot while the driver lists
    ///   its host pid (it frees a killed process's memory moments later),
    ///   or, when the list here cannot show it (host pid unknown, or a pid
    ///   of its namespace that is another process's now), for
    ///   [`UNKNOWN_PID_GRACE_MS`] and while it still beats (a zombie leader
    ///   whose threads live on), or until its heartbeat is [`STALE_MS`] old.
    /// - An owner no `/proc` here can see is reclaimed once its heartbeat
    ///   is [`STALE_MS`] old and the driver does not list its host pid
    ///   (when NVML gave the owner its pid in its own namespace, this
    ///   namespace's NVML cannot list it, and the heartbeat alone decides).
    ///   Without the driver's list it is kept.
    pub fn reclaim_dead(&self, view: &ProcView, driver: Option<&[u32]>) -> Result<u32, ShmError> {
        let guard = self.lock()?;
        Ok(self.reclaim_dead_locked(&guard, view, driver))
    }

    fn reclaim_dead_locked(
        &self,
        _guard: &RegionGuard<'_>,
        view: &ProcView,
        driver: Option<&[u32]>,
    ) -> u32 {
        let now = monotonic_ms();
        // Read every owner first, then judge them (reading /proc: syscalls,
        // during which the file may be truncated), and touch the mapping
        // again only after checking the file (see private.rs).
        let owners: Vec<(SlotIndex, Owner, Option<u64>)> = SlotIndex::first(self.slot_hwm())
            .map(|i| (i, self.owner(i), self.heartbeat_age_ms(i, now)))
            .filter(|(_, o, _)| o.pid != 0)
            .collect();
        let judged: Vec<_> = owners
            .into_iter()
            .map(|(i, o, beat)| (i, o, beat, liveness(&o, view)))
            .collect();
        if self.check_size().is_err() {
            return 0;
        }
        let listed = |host: i32| host > 0 && driver.is_some_and(|l| l.contains(&(host as u32)));
        let mut reclaimed = 0;
        for (i, owner, beat, verdict) in judged {
            let free = match verdict {
                Liveness::Alive => false,
                Liveness::Dead => {
                    let slot = self.slot(i);
                    let since = match slot.dead_since_ms.load(Ordering::Acquire) {
                        0 => {
                            slot.dead_since_ms.store(now, Ordering::Release);
                            now
                        }
                        t => t,
                    };
                    if owner.host_pid > 0 && owner.nvml_lists_here(view) {
                        !listed(owner.host_pid)
                    } else {
                        // The driver's list cannot show it: a grace, with
                        // its beat stopped too (a leader thread that
                        // exited shows as a zombie while the process's
                        // other threads, its watcher among them, live on
                        // and beat), cut short by a beat stopped as long
                        // as an unseen owner's must be (its memory is
                        // freed by then).
                        (now.saturating_sub(since) >= UNKNOWN_PID_GRACE_MS
                            && beat.is_none_or(|age| age >= BEAT_STOPPED_MS))
                            || beat.is_some_and(|age| age >= STALE_MS)
                    }
                }
                Liveness::Unknown => {
                    driver.is_some()
                        && beat.is_some_and(|age| age >= STALE_MS)
                        && (owner.nvml_pid_is_local() || !listed(owner.host_pid))
                }
            };
            if free {
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

    /// Whether some slot's owner looks gone but is not reclaimable yet: it
    /// is dead and the driver may still hold its memory, or no `/proc`
    /// here sees it and its heartbeat stopped less than [`STALE_MS`] (and
    /// [`VERDICT_MARGIN_MS`]) ago.
    /// An allocation refused meanwhile waits for the verdict (a restarted
    /// container's first context came right after its predecessor exited,
    /// and was refused, run 19). During the first [`BEAT_STOPPED_MS`] of
    /// such a wait (`waited_ms`), an unseen owner's fresh beat counts too:
    /// one that just died looks alive until its beat is that old (a run
    /// restarted at once had its first allocation refused). Reads /proc;
    /// takes no lock.
    pub fn owners_fading(&self, view: &ProcView, waited_ms: u64) -> bool {
        let now = monotonic_ms();
        SlotIndex::first(self.slot_hwm()).any(|i| {
            let owner = self.owner(i);
            if owner.pid == 0 {
                return false;
            }
            match liveness(&owner, view) {
                Liveness::Alive => false,
                Liveness::Dead => true,
                Liveness::Unknown => self.heartbeat_age_ms(i, now).is_some_and(|age| {
                    (BEAT_STOPPED_MS..STALE_MS + VERDICT_MARGIN_MS).contains(&age)
                        || (age < BEAT_STOPPED_MS && waited_ms < BEAT_STOPPED_MS + BEAT_MS)
                }),
            }
        })
    }

    /// Indices of the slots that currently have an owner.
    pub fn occupied_slots(&self) -> impl Iterator<Item = SlotIndex> + '_ {
        SlotIndex::first(self.slot_hwm()).filter(|&i| self.slot(i).pid.load(Ordering::Acquire) != 0)
    }
}

pub(crate) fn beat_word(pid: i32, ms: u64) -> u64 {
    beat_tag(pid) << BEAT_MS_BITS | (ms & BEAT_MS_MASK)
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
    slot.host_gap_ns.store(0, Ordering::Relaxed);
    slot.gap_device.store(0, Ordering::Relaxed);
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
