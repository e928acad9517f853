//! Keeping the HAMi part true from vgpu's own part, without a lock on any
//! hot path. vgpu's slots never move (a live process's counters stay where
//! everyone sums them); HAMi's are packed at the front, because monitors
//! read `procs[0..proc_num]`. So HAMi's slots are a mirror, rewritten by one
//! process of the container (elected through `Header::hami_writer`, on its
//! watcher's cadence) from the live vgpu slots:
//! - a process keeps its HAMi position while it lives; a dead one's is
//!   filled by a new process, or by the last one moved down, and
//!   `proc_num` shrinks before the slots past it are cleared and grows only
//!   after the new slots are written, so a monitor never counts a slot
//!   being filled;
//! - each slot is written under its seqlock (odd while writing), and only
//!   when a figure changed;
//! - only slots whose owner may live count ([`Region::may_live`], as for
//!   nvidia-smi's view): a dead process drops out at the next pass;
//! - device index `d` of HAMi's arrays is the device's number in the
//!   container (`DeviceEntry::hami_index`, assigned once per device);
//! - limits go both ways, narrowing only: a HAMi `limit`/`sm_limit` that
//!   differs from what vgpu last wrote there was written by a monitor, and
//!   becomes the device's limit if it is tighter; one that would widen or
//!   remove it (0, -1, an SM limit of 0 or 100) is overwritten with vgpu's.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use super::fill::{clear, sm_from_hami, sm_to_hami};
use super::layout::{
    HAMI_DEVICES, HAMI_PROCS, HAMI_STATUS_RUNNING, HAMI_UUID_LEN, HamiProc, HamiRegion,
};
use crate::error::ShmError;
use crate::index::{EntryIndex, SlotIndex};
use crate::layout::{DeviceEntry, Kind};
use crate::procinfo::{monotonic_ms, my_pidns};
use crate::{Region, format_uuid};

/// What one pass of [`Region::mirror_hami`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mirrored {
    /// Processes now in the HAMi part (`proc_num`).
    pub procs: usize,
    /// HAMi slots rewritten because a figure changed.
    pub written: usize,
    /// Limits taken from the HAMi part (a monitor wrote them).
    pub limits_taken: usize,
}

/// One HAMi slot's figures, as the mirror wants them.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Image {
    pid: i32,
    hostpid: i32,
    /// Per HAMi device: (context, data, total, monitorused, sm_util).
    dev: [[u64; 5]; HAMI_DEVICES],
}

impl Region {
    /// Device entry `dev`'s index in the HAMi part, once assigned.
    pub fn hami_index(&self, dev: EntryIndex) -> Option<usize> {
        let v = self.device(dev).hami_index.load(Ordering::Acquire) as usize;
        v.checked_sub(1).filter(|&i| i < HAMI_DEVICES)
    }

    /// Gives device entry `dev` its index in the HAMi part, once (under the
    /// region lock): `preferred` (the container's number for the device)
    /// when no other device has it, else the lowest free index. None when
    /// the region has no HAMi part or every index is taken.
    pub fn assign_hami_index(
        &self,
        dev: EntryIndex,
        preferred: Option<usize>,
    ) -> Result<Option<usize>, ShmError> {
        let Some(h) = self.hami() else {
            return Ok(None);
        };
        if let Some(i) = self.hami_index(dev) {
            return Ok(Some(i));
        }
        let _guard = self.lock()?;
        if let Some(i) = self.hami_index(dev) {
            return Ok(Some(i));
        }
        let uuid = format_uuid(&self.device(dev).uuid());
        let free = |i: usize| {
            let name = h.uuid(i);
            !EntryIndex::all().any(|e| e != dev && self.hami_index(e) == Some(i))
                && (name.is_empty() || name == uuid)
        };
        let Some(index) = preferred
            .filter(|&i| i < HAMI_DEVICES && free(i))
            .or_else(|| (0..HAMI_DEVICES).find(|&i| free(i)))
        else {
            return Ok(None);
        };
        // What the index holds now counts as vgpu's own writing when it
        // says "no limit"; a limit there (a monitor's, or one HAMi-core
        // stored) is taken at the next pass: limits in the region win.
        let d = self.device(dev);
        d.hami_limit_seen.store(0, Ordering::Release);
        let sm = h.sm_limit[index].load(Ordering::Acquire);
        let neutral = sm_from_hami(sm) == 0;
        d.hami_sm_seen
            .store(if neutral { sm } else { 0 }, Ordering::Release);
        d.hami_index.store(index as u32 + 1, Ordering::Release);
        Ok(Some(index))
    }

    /// Shows NVML's used memory of slot `slot`'s process on device `dev`.
    pub fn set_nvml_used(&self, slot: SlotIndex, dev: EntryIndex, bytes: u64) {
        self.slot(slot).nvml_used[dev.get()].store(bytes, Ordering::Relaxed);
    }

    /// NVML's used memory of slot `slot`'s process on device `dev`, as last
    /// shown.
    pub fn nvml_used(&self, slot: SlotIndex, dev: EntryIndex) -> u64 {
        self.slot(slot).nvml_used[dev.get()].load(Ordering::Relaxed)
    }

    /// One pass of the mirror (module docs); only the elected writer calls
    /// it. A region without a HAMi part does nothing.
    pub fn mirror_hami(&self) -> Mirrored {
        self.mirror(None)
    }

    /// The writer's last pass as its process `pid` exits: the same,
    /// without that process.
    pub fn mirror_hami_leaving(&self, pid: i32) -> Mirrored {
        self.mirror(Some(pid))
    }

    fn mirror(&self, leaving: Option<i32>) -> Mirrored {
        let Some(h) = self.hami() else {
            return Mirrored::default();
        };
        let mut out = Mirrored::default();
        let mut entry_of: [Option<EntryIndex>; HAMI_DEVICES] = [None; HAMI_DEVICES];
        for e in EntryIndex::all().filter(|&e| self.device(e).is_used()) {
            let Some(d) = self.hami_index(e) else {
                continue;
            };
            entry_of[d] = Some(e);
            write_uuid(h, d, &format_uuid(&self.device(e).uuid()));
            out.limits_taken += sync_limits(h, d, self.device(e));
        }
        if let Some(top) = entry_of.iter().rposition(Option::is_some) {
            h.device_num.fetch_max(top as u64 + 1, Ordering::AcqRel);
        }
        let (my_ns, now) = (my_pidns(), monotonic_ms());
        let live: Vec<SlotIndex> = self
            .occupied_slots()
            .filter(|&i| self.may_live(i, my_ns, now) && Some(self.pid(i)) != leaving)
            .collect();
        let order = self.placement(h, &live);
        let old = usize::try_from(h.proc_num.load(Ordering::Acquire))
            .unwrap_or(0)
            .min(HAMI_PROCS);
        let n = order.len();
        if n < old {
            h.proc_num.store(n as i32, Ordering::Release);
            for p in &h.procs[n..old] {
                clear(p);
            }
        }
        for (k, &slot) in order.iter().enumerate() {
            let image = self.image(slot, &entry_of);
            if write(&h.procs[k], &image) {
                out.written += 1;
            }
        }
        if n >= old {
            h.proc_num.store(n as i32, Ordering::Release);
        }
        out.procs = n;
        out
    }

    /// Where each live slot goes in the HAMi part: where it already is,
    /// else into a hole, else at the end; then holes are filled from the
    /// end.
    fn placement(&self, h: &HamiRegion, live: &[SlotIndex]) -> Vec<SlotIndex> {
        let old = usize::try_from(h.proc_num.load(Ordering::Acquire))
            .unwrap_or(0)
            .min(HAMI_PROCS);
        let mut placed = vec![false; live.len()];
        let mut order: Vec<Option<SlotIndex>> = h.procs[..old]
            .iter()
            .map(|p| {
                let pid = p.pid.load(Ordering::Acquire);
                let host = p.hostpid.load(Ordering::Acquire);
                let at = live.iter().enumerate().position(|(j, &s)| {
                    let o = self.owner(s);
                    !placed[j] && pid != 0 && o.pid == pid && (host == 0 || o.host_pid == host)
                })?;
                placed[at] = true;
                Some(live[at])
            })
            .collect();
        let mut newcomers = live
            .iter()
            .zip(&placed)
            .filter(|(_, p)| !**p)
            .map(|(s, _)| *s);
        for hole in order.iter_mut().filter(|o| o.is_none()) {
            *hole = newcomers.next();
        }
        order.extend(newcomers.map(Some));
        // Holes left: the last ones move down into them.
        while let Some(hole) = order.iter().position(Option::is_none) {
            let last = order.pop().flatten();
            if hole < order.len() {
                order[hole] = last;
            }
        }
        order.into_iter().flatten().take(HAMI_PROCS).collect()
    }

    /// What HAMi slot of vgpu slot `slot` should hold.
    fn image(&self, slot: SlotIndex, entry_of: &[Option<EntryIndex>; HAMI_DEVICES]) -> Image {
        let o = self.owner(slot);
        let mut image = Image {
            pid: o.pid,
            hostpid: o.host_pid,
            ..Image::default()
        };
        for (d, e) in entry_of.iter().enumerate() {
            let Some(e) = *e else { continue };
            let context = self.slot_usage(slot, e, Kind::Context);
            let total = self.slot_total(slot, e);
            image.dev[d] = [
                context,
                total.saturating_sub(context),
                total,
                self.nvml_used(slot, e),
                u64::from(self.sm_util(slot, e).min(100)),
            ];
        }
        image
    }
}

/// Writes `uuid` into `uuids[d]` if it says something else.
fn write_uuid(h: &HamiRegion, d: usize, uuid: &str) {
    if h.uuid(d) == uuid {
        return;
    }
    let bytes = uuid.as_bytes();
    for (i, b) in h.uuids[d].iter().enumerate() {
        let v = if i < HAMI_UUID_LEN - 1 {
            bytes.get(i).copied().unwrap_or(0)
        } else {
            0
        };
        b.store(v, Ordering::Relaxed);
    }
}

/// Brings one device's limits in step; returns how many were taken from
/// the HAMi part.
fn sync_limits(h: &HamiRegion, d: usize, e: &DeviceEntry) -> usize {
    let mem_now = e.mem_limit();
    let mem = sync_one(
        &h.limit[d],
        &e.hami_limit_seen,
        mem_now,
        // A byte count below the present limit (0: none); 0 and -1 would
        // remove the quota, and -1 made cuMemGetInfo report 2^64-1.
        |v| v != 0 && v != u64::MAX && (mem_now == 0 || v < mem_now),
        |v| e.mem_limit.store(v, Ordering::Release),
    );
    let sm_now = e.sm_limit();
    let sm = sync_one(
        &h.sm_limit[d],
        &e.hami_sm_seen,
        sm_to_hami(sm_now),
        |v| {
            let pct = sm_from_hami(v);
            pct != 0 && (sm_now == 0 || pct < sm_now)
        },
        |v| e.sm_limit.store(sm_from_hami(v), Ordering::Release),
    );
    usize::from(mem) + usize::from(sm)
}

/// One limit: `hami` is the HAMi field, `seen` what vgpu last wrote there,
/// `ours` vgpu's value in HAMi's terms. A value a monitor wrote is taken
/// only if it `narrows` the limit; one that would widen or remove it is
/// overwritten with ours (the HAMi part is written by whoever can write
/// the file: a monitor may narrow a container's limits, never lift them).
/// Returns whether the HAMi value was taken.
fn sync_one(
    hami: &AtomicU64,
    seen: &AtomicU64,
    ours: u64,
    narrows: impl Fn(u64) -> bool,
    take: impl Fn(u64),
) -> bool {
    let there = hami.load(Ordering::Acquire);
    let last = seen.load(Ordering::Acquire);
    if there != last && narrows(there) {
        take(there);
        seen.store(there, Ordering::Release);
        return true;
    }
    if there != ours
        && hami
            .compare_exchange(there, ours, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        seen.store(ours, Ordering::Release);
    }
    false
}

/// Writes `image` into `p` under its seqlock if anything differs; returns
/// whether it wrote.
fn write(p: &HamiProc, image: &Image) -> bool {
    if read(p) == *image && p.status.load(Ordering::Relaxed) == HAMI_STATUS_RUNNING {
        return false;
    }
    // Odd: a reader that sees it (or sees it change) reads again.
    let seq = p.seqlock.load(Ordering::Relaxed);
    p.seqlock.store(seq | 1, Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Release);
    p.pid.store(image.pid, Ordering::Relaxed);
    p.hostpid.store(image.hostpid, Ordering::Relaxed);
    p.status.store(HAMI_STATUS_RUNNING, Ordering::Relaxed);
    for (d, v) in image.dev.iter().enumerate() {
        let u = &p.used[d];
        u.context_size.store(v[0], Ordering::Relaxed);
        u.module_size.store(0, Ordering::Relaxed);
        u.data_size.store(v[1], Ordering::Relaxed);
        u.total.store(v[2], Ordering::Relaxed);
        p.monitorused[d].store(v[3], Ordering::Relaxed);
        p.device_util[d].sm_util.store(v[4], Ordering::Relaxed);
    }
    p.seqlock.store((seq | 1) + 1, Ordering::Release);
    true
}

fn read(p: &HamiProc) -> Image {
    let mut image = Image {
        pid: p.pid.load(Ordering::Relaxed),
        hostpid: p.hostpid.load(Ordering::Relaxed),
        ..Image::default()
    };
    for (d, v) in image.dev.iter_mut().enumerate() {
        let u = &p.used[d];
        *v = [
            u.context_size.load(Ordering::Relaxed),
            u.data_size.load(Ordering::Relaxed),
            u.total.load(Ordering::Relaxed),
            p.monitorused[d].load(Ordering::Relaxed),
            p.device_util[d].sm_util.load(Ordering::Relaxed),
        ];
    }
    image
}
