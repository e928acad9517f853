//! Older region files, made into layout 2.x without losing what they hold.
//!
//! - vgpu's layout 1.x (`VGPUSHM` at offset 0): while a live process holds
//!   a slot in it, it is used as it is ([`Format::VgpuLegacy`]): processes
//!   of the old library keep sharing one quota with the new ones, and node
//!   monitors do not see the container yet. Once none does, the first
//!   process to attach upgrades it in place: the new part is written
//!   whole behind the old one before the old one is overwritten by HAMi's
//!   layout, so a process killed half-way leaves a file the next one
//!   finishes (`open.rs`). Limits, policies and learnt context costs move
//!   with their devices. Old processes that mapped the file without a slot
//!   notice the new `region_id` before they touch it (`private.rs`).
//! - HAMi-core's layout 1.2: adopted in place when no HAMi-core process
//!   maps it any more (read from `/proc/<pid>/maps` of the pids in its
//!   slots): its HAMi part stays (limits, UUIDs, priority, what the monitor
//!   wrote), its dead slots are cleared, and the vgpu part gets one device
//!   entry per UUID, with that device's limits. While HAMi-core processes
//!   still map it, it is refused with its limits, which then bind the
//!   refused process alone, and left untouched.
//!
//! [`Format::VgpuLegacy`]: crate::Format::VgpuLegacy

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;

use memmap2::MmapOptions;

use crate::error::{HamiLimit, Refusal, ShmError};
use crate::file::zero_range;
use crate::format::Locked;
use crate::hami::fill;
use crate::hami::layout::{HAMI_DEVICES, HAMI_PROCS, HAMI_SIZE, HamiRegion};
use crate::index::EntryIndex;
use crate::layout::{
    FILE_SIZE, LEGACY_SIZE, ORIGIN_HAMI_CORE, ORIGIN_VGPU_1, REGION_SIZE, VGPU_OFFSET,
};
use crate::lock::RegionGuard;

use crate::procinfo::{Liveness, ProcView, liveness, monotonic_ms};
use crate::region::{Region, Shape, initialise, map};
use crate::slots::STALE_MS;
use crate::{DeviceInfo, Limits, parse_uuid, space};

/// A ready layout 1.x file: used as it is while live processes hold
/// slots in it, else upgraded.
pub(crate) fn legacy(l: &Locked<'_>, guard: &RegionGuard<'_>) -> Result<Region, ShmError> {
    let old = map(l.file, l.path, Shape::LEGACY)?;
    old.settle_boot(guard, crate::procinfo::boot_id());
    if in_use(&old) {
        return Ok(old);
    }
    let kept: Vec<(EntryIndex, DeviceInfo, Limits, Option<u64>)> = EntryIndex::all()
        .filter(|&i| old.device(i).is_used())
        .map(|i| {
            let d = old.device(i);
            let info = DeviceInfo {
                uuid: d.uuid(),
                total_mem: d.total_mem(),
                sm_count: d.sm_count.load(Ordering::Relaxed),
            };
            (i, info, d.limits(), d.context_bytes())
        })
        .collect();
    let reclaims = old.header().reclaims.load(Ordering::Relaxed);
    drop(old);
    if grow(l.file, FILE_SIZE as u64).is_err() {
        // No room for the new layout: keep using the old one.
        let _ = l.file.set_len(LEGACY_SIZE as u64);
        return map(l.file, l.path, Shape::LEGACY);
    }
    let region = map(l.file, l.path, Shape::CURRENT)?;
    for (index, info, limits, context) in &kept {
        region.put_device(*index, info, *limits);
        if let Some(bytes) = context {
            region.device(*index).set_context_bytes(*bytes);
        }
    }
    let h = region.header();
    h.reclaims.store(reclaims, Ordering::Relaxed);
    h.origin.store(ORIGIN_VGPU_1, Ordering::Relaxed);
    initialise(h);
    // The new part is whole: the old one can go.
    zero_range(l.file, 0, HAMI_SIZE as u64).map_err(|e| ShmError::io(l.path, "write", e))?;
    if let Some(hami) = region.hami() {
        fill::initialise(hami);
    }
    let mut region = region;
    region.created = true;
    Ok(region)
}

/// Whether a live process holds a slot (an owner that cannot be judged
/// counts as live, unless its heartbeat is stale).
fn in_use(r: &Region) -> bool {
    let view = ProcView::current();
    let now = monotonic_ms();
    r.occupied_slots()
        .any(|i| match liveness(&r.owner(i), &view) {
            Liveness::Alive => true,
            Liveness::Dead => false,
            Liveness::Unknown => r.heartbeat_age_ms(i, now).is_none_or(|age| age < STALE_MS),
        })
}

/// A HAMi-core file (or one whose adoption was cut short, `resumed`):
/// adopted unless HAMi-core processes map it.
pub(crate) fn hami_core(l: &Locked<'_>, resumed: bool) -> Result<Region, ShmError> {
    if resumed {
        zero_range(l.file, VGPU_OFFSET as u64, REGION_SIZE as u64)
            .map_err(|e| ShmError::io(l.path, "write", e))?;
    } else {
        let view = HamiView::map(l.file).map_err(|e| ShmError::io(l.path, "mmap", e))?;
        let users = users(view.region(), l.file);
        if !users.is_empty() {
            return Err(ShmError::Refused {
                path: l.path.to_path_buf(),
                why: Refusal::HamiCoreInUse {
                    pids: users,
                    limits: limits_of(view.region()),
                },
            });
        }
        drop(view);
        if let Err(e) = grow(l.file, FILE_SIZE as u64) {
            // Left as it was.
            let _ = l.file.set_len(l.len);
            return Err(ShmError::no_space(l.path, e));
        }
    }
    let region = map(l.file, l.path, Shape::CURRENT)?;
    let Some(h) = region.hami() else {
        unreachable!("a region of the current shape has a HAMi part")
    };
    fill::reset_procs(h);
    let mut entries = EntryIndex::all();
    for l in limits_of(h) {
        let Some(uuid) = parse_uuid(&l.uuid) else {
            continue;
        };
        let Some(index) = entries.next() else { break };
        let info = DeviceInfo {
            uuid,
            total_mem: 0,
            sm_count: 0,
        };
        let limits = Limits {
            mem: l.mem,
            sm: l.sm,
            policy: crate::CorePolicy::Default,
        };
        region.put_device(index, &info, limits);
        let d = region.device(index);
        d.hami_index.store(l.index as u32 + 1, Ordering::Relaxed);
        d.hami_limit_seen
            .store(h.limit[l.index].load(Ordering::Relaxed), Ordering::Relaxed);
        d.hami_sm_seen.store(
            h.sm_limit[l.index].load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }
    region
        .header()
        .origin
        .store(ORIGIN_HAMI_CORE, Ordering::Relaxed);
    initialise(region.header());
    Ok(region)
}

/// Every device of a HAMi part that has a UUID or a limit.
pub(crate) fn limits_of(h: &HamiRegion) -> Vec<HamiLimit> {
    (0..HAMI_DEVICES)
        .map(|i| HamiLimit {
            index: i,
            uuid: h.uuid(i),
            mem: h.limit[i].load(Ordering::Acquire),
            sm: fill::sm_from_hami(h.sm_limit[i].load(Ordering::Acquire)),
        })
        .filter(|l| !l.uuid.is_empty() || l.mem != 0 || l.sm != 0)
        .collect()
}

/// The pids in `h`'s slots whose process maps `file` (one whose maps
/// cannot be read, but which exists, counts as a user).
fn users(h: &HamiRegion, file: &File) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = file.metadata() else {
        return Vec::new();
    };
    let dev = meta.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let needle_dev = format!("{major:02x}:{minor:02x}");
    let ino = meta.ino().to_string();
    let n = usize::try_from(h.proc_num.load(Ordering::Acquire))
        .unwrap_or(0)
        .min(HAMI_PROCS);
    let mut pids: Vec<i32> = h.procs[..n]
        .iter()
        .map(|p| p.pid.load(Ordering::Acquire))
        .filter(|&pid| pid > 0 && pid != std::process::id() as i32)
        .filter(|&pid| maps_file(pid, &needle_dev, &ino))
        .collect();
    pids.dedup();
    pids
}

fn maps_file(pid: i32, dev: &str, ino: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
        Ok(maps) => maps.lines().any(|line| {
            let mut f = line.split_whitespace().skip(3);
            f.next() == Some(dev) && f.next() == Some(ino)
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(_) => crate::procinfo::pid_exists(pid),
    }
}

/// Makes `file` `len` bytes long with its blocks allocated.
fn grow(file: &File, len: u64) -> io::Result<()> {
    file.set_len(len)?;
    space::reserve_existing(file, len)
}

/// A read-only view of a HAMi part, for judging it before any change.
struct HamiView(memmap2::Mmap);

impl HamiView {
    fn map(file: &File) -> io::Result<HamiView> {
        // SAFETY: a read-only shared mapping of HAMI_SIZE bytes of a file at
        // least that long (checked by `classify`); others may write it, which
        // is why it is only read through atomics.
        let m = unsafe { MmapOptions::new().len(HAMI_SIZE).map(file)? };
        Ok(HamiView(m))
    }

    fn region(&self) -> &HamiRegion {
        // SAFETY: HAMI_SIZE bytes, page-aligned, borrowed from self;
        // HamiRegion is repr(C) atomics only; atomic loads of read-only
        // pages are plain loads on x86-64.
        unsafe { &*(self.0.as_ptr() as *const HamiRegion) }
    }
}
