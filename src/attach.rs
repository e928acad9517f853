//! This process's attachment to the container's region: its slot, and the
//! map from its CUDA ordinals to the region's UUID-keyed device entries.
//!
//! The slot is claimed at `cuInit` (or first use). When none can be had
//! (all 1024 held by live processes), CUDA is refused: a process that is
//! not counted must not run. The watcher keeps the slot alive
//! ([`Attach::tick`]): it beats, notices a slot taken from it, and notices
//! a region file that shrank or was re-created (see `tamper.rs`).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use vgpu_shm::procinfo::monotonic_ms;
use vgpu_shm::{
    DeviceInfo, EntryIndex, Limits, ProcId, ProcView, Region, ShmError, SlotIndex, format_uuid,
};

use crate::config::{Config, DeviceNumber};
use crate::cuda::sys::CudaOrdinal;
use crate::lock::{Listed, Lock, Name, keep};
use crate::nvml::client;
use crate::nvml::sys::NvmlIndex;
use crate::{numbering, process};

const NO_SLOT: usize = usize::MAX;
/// CUDA ordinals whose device entry we cache.
const ORDINALS: usize = 64;
/// A failed claim is tried again at most this often: each try scans every
/// slot under the region's lock.
const CLAIM_RETRY_MS: u64 = 1_000;

/// What the layers above this one do when the slot changes hands (set by
/// `init.rs`, so that this file needs neither the watcher nor the quota).
#[derive(Clone, Copy)]
pub struct OnSlot {
    /// A slot was claimed: it beats from now on (starts the watcher).
    pub claimed: fn(),
    /// Counts again, in slot `slot` of a region (a new slot, a private
    /// copy), what this process holds.
    pub refill: fn(&Region, SlotIndex),
}

pub struct Attach {
    pub region: Region,
    config: Config,
    pub(crate) on_slot: OnSlot,
    slot: AtomicUsize,
    /// One claim at a time.
    claiming: Lock<()>,
    /// Who our slot says we are, as claimed (a forked child: nobody yet).
    me: Lock<Option<ProcId>>,
    last_claim_ms: AtomicU64,
    claim_error: Lock<Option<String>>,
    /// CUDA ordinal -> device entry index + 1 (0: not looked up yet).
    ordinals: [AtomicUsize; ORDINALS],
    /// Entries this process registered, with the limits then in force: what
    /// a private copy of the region needs (`tamper.rs`).
    pub(crate) known: Lock<Vec<(EntryIndex, DeviceInfo, Limits)>>,
    /// One switch to a private copy at a time (`tamper.rs`).
    pub(crate) switching: Lock<()>,
}

impl Attach {
    pub fn new(region: Region, config: Config, on_slot: OnSlot) -> Attach {
        Attach {
            region,
            config,
            on_slot,
            slot: AtomicUsize::new(NO_SLOT),
            claiming: Lock::new((), keep),
            me: Lock::new(None, |me| *me = None),
            last_claim_ms: AtomicU64::new(0),
            claim_error: Lock::new(None, keep),
            ordinals: [const { AtomicUsize::new(0) }; ORDINALS],
            known: Lock::new(Vec::new(), keep),
            switching: Lock::new((), keep),
        }
    }

    /// Our slot, claimed on first use (and again in a forked child). None
    /// when no slot can be had: callers refuse CUDA then.
    pub fn slot(&self) -> Option<SlotIndex> {
        if let Some(s) = self.slot_index() {
            return Some(s);
        }
        let full = {
            let _one_claimer = self.claiming.lock();
            if let Some(s) = self.slot_index() {
                return Some(s);
            }
            let now = monotonic_ms();
            let last = self.last_claim_ms.load(Ordering::Acquire);
            if last != 0 && now.saturating_sub(last) < CLAIM_RETRY_MS {
                return None;
            }
            self.last_claim_ms.store(now, Ordering::Release);
            match self.claim() {
                Ok(i) => return Some(i),
                Err(full) => full,
            }
        };
        // Every slot is held; owners in other pid namespaces are the
        // driver's to judge, asked outside our locks.
        if full && self.reclaim_dead() > 0 {
            let _one_claimer = self.claiming.lock();
            return self.slot_index().or_else(|| self.claim().ok());
        }
        None
    }

    /// Claims a slot (the caller holds `claiming`); `Err(true)` when every
    /// slot is held.
    fn claim(&self) -> Result<SlotIndex, bool> {
        if !self.intact() {
            return Err(false);
        }
        let me = ProcId::current();
        let view = ProcView::current();
        let mut claimed = self.region.claim_slot_as(&me, view.host_pid);
        if matches!(claimed, Err(ShmError::Tampered { .. })) && self.still_ours() {
            claimed = self.region.claim_slot_as(&me, view.host_pid);
        }
        match claimed {
            Ok(i) => {
                *self.me.lock() = Some(me);
                *self.claim_error.lock() = None;
                // In the initial namespace the kernel's host pid is NVML's
                // too. Elsewhere NVML may show us by our pid in our own
                // namespace (driver 580): hostpid.rs asks NVML itself.
                if view.host_pid == Some(me.pid) {
                    process::set_host_pid(me.pid as u32);
                }
                self.slot.store(i.get(), Ordering::Release);
                // It beats from now on, whatever path claimed it.
                (self.on_slot.claimed)();
                Ok(i)
            }
            Err(e) => {
                *self.claim_error.lock() = Some(e.to_string());
                Err(matches!(e, ShmError::SlotsFull { .. }))
            }
        }
    }

    /// Why the last claim failed.
    pub fn claim_error(&self) -> Option<String> {
        self.claim_error.lock().clone()
    }

    /// The slot index, without claiming one.
    pub(crate) fn slot_index(&self) -> Option<SlotIndex> {
        SlotIndex::new(self.slot.load(Ordering::Acquire))
    }

    pub(crate) fn me(&self) -> Option<ProcId> {
        *self.me.lock()
    }

    /// The watcher's tick: the file is still ours, so is the slot, and we
    /// are alive.
    pub fn tick(&self) {
        if !self.still_ours() {
            return;
        }
        let (Some(i), Some(me)) = (self.slot_index(), self.me()) else {
            return;
        };
        let o = self.region.owner(i);
        if (o.pid, o.start_time, o.pidns) == (me.pid, me.start_time, me.pidns) {
            self.region.beat(i, me.pid);
            return;
        }
        // Reclaimed by a process that judged us dead (we were frozen past
        // the heartbeat's limit, holding no memory NVML could see).
        log::warn!(
            "region {}: slot {i} was reclaimed from this live process; claiming another",
            self.region.path().display()
        );
        let _one_claimer = self.claiming.lock();
        self.slot.store(NO_SLOT, Ordering::Release);
        if let Ok(n) = self.claim() {
            (self.on_slot.refill)(&self.region, n);
        }
    }

    /// Host pids the driver lists on any device of the region; None when
    /// NVML cannot tell.
    fn driver_pids(&self) -> Option<Vec<u32>> {
        if !client::init() {
            return None;
        }
        // The UUIDs are read first: NVML's calls are syscalls, after which
        // the region file must be checked again (tamper.rs).
        if !self.intact() {
            return None;
        }
        let uuids: Vec<[u8; 16]> = EntryIndex::all()
            .map(|d| self.region.device(d))
            .filter(|d| d.is_used())
            .map(|d| d.uuid())
            .collect();
        let mut all = Vec::new();
        for uuid in &uuids {
            let nd = client::device(uuid)?;
            all.extend(client::processes(nd).ok()?.into_iter().map(|(p, _)| p));
        }
        Some(all)
    }

    /// Frees the slots of dead processes; returns how many. Asks NVML
    /// first (never under the region lock): a dead process's memory may
    /// still be held, and owners in other pid namespaces are the driver's
    /// to judge.
    pub fn reclaim_dead(&self) -> u32 {
        let driver = self.driver_pids();
        match self
            .region
            .reclaim_dead(&ProcView::current(), driver.as_deref())
        {
            Ok(n) => n,
            // Said once, when the next check swaps in a private copy.
            Err(ShmError::Tampered { .. }) => 0,
            Err(e) => {
                crate::warn_once!("{e}");
                0
            }
        }
    }

    /// The device entry of CUDA ordinal `ordinal`; `info` is asked only the
    /// first time, to register the device with the limits for its number
    /// in the container (`numbering.rs`), which NVML may be asked for.
    pub fn device(
        &self,
        ordinal: CudaOrdinal,
        info: impl FnOnce() -> Option<DeviceInfo>,
    ) -> Option<EntryIndex> {
        let n = usize::try_from(ordinal.0).ok()?;
        if let Some(cached) = self
            .ordinals
            .get(n)
            .and_then(|c| c.load(Ordering::Acquire).checked_sub(1))
        {
            return EntryIndex::new(cached);
        }
        if !self.intact() {
            return None;
        }
        let info = info()?;
        let number = self.number_of(&info.uuid, || client::index_of(&info.uuid));
        let index = self.register(self.config.limits_for(number), &info)?;
        if let Some(c) = self.ordinals.get(n) {
            c.store(index.get() + 1, Ordering::Release);
        }
        Some(index)
    }

    /// The device entry of a GPU seen through NVML (`index` is NVML's,
    /// when it said). Registers it when the environment has limits for it,
    /// so that nvidia-smi shows the quota before any CUDA process ran.
    pub fn device_by_uuid(
        &self,
        index: Option<NvmlIndex>,
        info: &DeviceInfo,
    ) -> Option<EntryIndex> {
        if !self.intact() {
            return None;
        }
        if let Some(i) = self.region.find_device(&info.uuid) {
            return Some(i);
        }
        let wanted = self.config.limits_for(self.number_of(&info.uuid, || index));
        if wanted.mem == 0 && wanted.sm == 0 {
            return None;
        }
        self.register(wanted, info)
    }

    /// The container's number for the device `uuid` (asking NVML when
    /// `NVIDIA_VISIBLE_DEVICES` does not say): its index in the HAMi part.
    pub fn device_number(&self, uuid: &[u8; 16]) -> Option<DeviceNumber> {
        numbering::number_of(&self.config, uuid, || client::index_of(uuid))
    }

    /// The container's number for the device `uuid`, where it matters:
    /// with no `_N` in the environment every device gets the same limits,
    /// and NVML is not asked.
    fn number_of(
        &self,
        uuid: &[u8; 16],
        nvml_index: impl FnOnce() -> Option<NvmlIndex>,
    ) -> Option<DeviceNumber> {
        if !self.config.has_per_device_limits() {
            return None;
        }
        let number = numbering::number_of(&self.config, uuid, nvml_index);
        if number.is_none() {
            crate::warn_once!(
                "which of the container's devices {} is cannot be told (NVML unavailable, and NVIDIA_VISIBLE_DEVICES lists no UUIDs): it gets the least of the limits the environment sets for any device",
                format_uuid(uuid)
            );
        }
        number
    }

    fn register(&self, wanted: Limits, info: &DeviceInfo) -> Option<EntryIndex> {
        let mut registered = self.region.register_device(info, wanted);
        if matches!(registered, Err(ShmError::Tampered { .. })) && self.still_ours() {
            registered = self.region.register_device(info, wanted);
        }
        match registered {
            Ok(reg) => {
                if reg.conflict {
                    crate::warn_once!(
                        "the environment asks for limits (memory {} bytes, SM {}%) on {} that differ from those already in region {} (memory {} bytes, SM {}%); the region's apply",
                        wanted.mem,
                        wanted.sm,
                        format_uuid(&info.uuid),
                        self.region.path().display(),
                        reg.limits.mem,
                        reg.limits.sm
                    );
                }
                let mut known = self.known.lock();
                known.retain(|(i, _, _)| *i != reg.index);
                known.push((reg.index, *info, reg.limits));
                Some(reg.index)
            }
            Err(e) => {
                crate::warn_once!("{e}: device {} is not limited", format_uuid(&info.uuid));
                None
            }
        }
    }

    /// In a forked child: the parent's slot is not ours.
    /// In a forked child (its locks given back already): the parent's
    /// slot is not its own.
    pub fn reset_in_child(&self) {
        self.slot.store(NO_SLOT, Ordering::Release);
        self.last_claim_ms.store(0, Ordering::Release);
    }

    /// This attachment's locks, outermost first (`claiming` and
    /// `switching` are held while the region's is taken, and all three
    /// while the others are).
    pub fn locks(&'static self) -> [Listed; 6] {
        [
            (Name::of("attach.claiming"), &self.claiming),
            (Name::of("attach.switching"), &self.switching),
            (Name::of("region"), self.region.fork_lock()),
            (Name::of("attach.me"), &self.me),
            (Name::of("attach.claim_error"), &self.claim_error),
            (Name::of("attach.known"), &self.known),
        ]
    }
}
