//! The device table: one entry per physical GPU, keyed by UUID, so processes
//! with different `CUDA_VISIBLE_DEVICES` still share one quota per card.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::Region;
use crate::error::ShmError;
use crate::index::EntryIndex;
use crate::layout::DeviceEntry;

/// What a process knows about a device when it first registers it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The 16 bytes `cuDeviceGetUuid` returns.
    pub uuid: [u8; 16],
    /// Physical memory, in bytes (0 when unknown).
    pub total_mem: u64,
    /// Streaming multiprocessors (0 when unknown).
    pub sm_count: u32,
}

/// `GPU_CORE_UTILIZATION_POLICY`, as a device entry stores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u32)]
pub enum CorePolicy {
    /// The SM limit is enforced.
    #[default]
    Default = 0,
    /// The SM limit is enforced (HAMi-core's name for "really enforce it").
    Force = 1,
    /// The SM limit is ignored; memory limits still hold.
    Disable = 2,
}

impl CorePolicy {
    /// The policy a stored value means; a value this library does not know
    /// (written by a newer one) enforces the limit.
    pub fn from_raw(raw: u32) -> CorePolicy {
        match raw {
            1 => CorePolicy::Force,
            2 => CorePolicy::Disable,
            _ => CorePolicy::Default,
        }
    }
}

/// Limits a process would like a device to have (from its environment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Bytes, 0 = none.
    pub mem: u64,
    /// Percent, 0 = none.
    pub sm: u32,
    /// What the SM limit means.
    pub policy: CorePolicy,
}

impl DeviceEntry {
    /// The device's UUID.
    pub fn uuid(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (o, b) in out.iter_mut().zip(&self.uuid) {
            *o = b.load(Ordering::Acquire);
        }
        out
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        Limits {
            mem: self.mem_limit.load(Ordering::Acquire),
            sm: self.sm_limit.load(Ordering::Acquire),
            policy: CorePolicy::from_raw(self.policy.load(Ordering::Acquire)),
        }
    }

    /// The memory limit in bytes, 0 for none.
    pub fn mem_limit(&self) -> u64 {
        self.mem_limit.load(Ordering::Acquire)
    }

    /// Whether an SM limit is in force: one is set, or the container has
    /// none and takes the rest beside limited ones ([`Self::sm_percent`]),
    /// and the policy is not `disable`.
    pub fn enforces_sm_limit(&self) -> bool {
        self.sm_percent() != 0
            && CorePolicy::from_raw(self.policy.load(Ordering::Relaxed)) != CorePolicy::Disable
    }

    /// Whether the entry holds a device.
    pub fn is_used(&self) -> bool {
        self.in_use.load(Ordering::Acquire) != 0
    }

    /// The device's physical memory, as registered.
    pub fn total_mem(&self) -> u64 {
        self.total_mem.load(Ordering::Relaxed)
    }

    /// What a new CUDA context costs on this device, as last measured
    /// (None until then).
    pub fn context_bytes(&self) -> Option<u64> {
        Some(self.context_bytes.load(Ordering::Acquire)).filter(|&b| b != 0)
    }

    /// Records what a context was measured to cost.
    pub fn set_context_bytes(&self, bytes: u64) {
        self.context_bytes.store(bytes, Ordering::Release);
    }
}

impl Region {
    /// Writes entry `index` outright, without the lock: for a private copy
    /// of a region, which keeps this process's entry indices.
    pub fn put_device(&self, index: EntryIndex, info: &DeviceInfo, limits: Limits) {
        let d = self.device(index);
        for (slot, b) in d.uuid.iter().zip(info.uuid) {
            slot.store(b, Ordering::Relaxed);
        }
        d.total_mem.store(info.total_mem, Ordering::Relaxed);
        d.sm_count.store(info.sm_count, Ordering::Relaxed);
        d.mem_limit.store(limits.mem, Ordering::Relaxed);
        d.sm_limit.store(limits.sm, Ordering::Relaxed);
        d.policy.store(limits.policy as u32, Ordering::Relaxed);
        d.rate_scale_milli.store(1000, Ordering::Relaxed);
        d.in_use.store(1, Ordering::Release);
    }
}

/// The outcome of [`Region::register_device`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The device's entry.
    pub index: EntryIndex,
    /// The limits now in force (the region's, where it already had some).
    pub limits: Limits,
    /// The region already held limits that differ from the ones asked for.
    pub conflict: bool,
}

impl Region {
    /// The entry for `uuid`, without taking the lock.
    pub fn find_device(&self, uuid: &[u8; 16]) -> Option<EntryIndex> {
        EntryIndex::all().find(|&i| {
            let d = self.device(i);
            d.is_used() && &d.uuid() == uuid
        })
    }

    /// Finds or adds the entry for `info.uuid`. Limits already stored in the
    /// region win (a shell that lost its environment must not escape the
    /// quota); limits the region lacks are filled in from `wanted`.
    pub fn register_device(
        &self,
        info: &DeviceInfo,
        wanted: Limits,
    ) -> Result<Registered, ShmError> {
        let _guard = self.lock()?;
        let index = match self.find_device(&info.uuid) {
            Some(i) => i,
            None => {
                let Some(i) = EntryIndex::all().find(|&i| !self.device(i).is_used()) else {
                    return Err(ShmError::DevicesFull {
                        path: self.path().to_path_buf(),
                    });
                };
                let d = self.device(i);
                for (slot, b) in d.uuid.iter().zip(info.uuid) {
                    slot.store(b, Ordering::Relaxed);
                }
                d.rate_scale_milli.store(1000, Ordering::Relaxed);
                d.in_use.store(1, Ordering::Release);
                i
            }
        };
        let d = self.device(index);
        d.total_mem.store(info.total_mem, Ordering::Relaxed);
        d.sm_count.store(info.sm_count, Ordering::Relaxed);
        let mut conflict = false;
        let mut settle = |field: &std::sync::atomic::AtomicU64, want: u64| {
            let have = field.load(Ordering::Acquire);
            if have == 0 {
                field.store(want, Ordering::Release);
            } else if want != 0 && want != have {
                conflict = true;
            }
        };
        settle(&d.mem_limit, wanted.mem);
        let have_sm = d.sm_limit.load(Ordering::Acquire);
        if have_sm == 0 {
            d.sm_limit.store(wanted.sm, Ordering::Release);
        } else if wanted.sm != 0 && wanted.sm != have_sm {
            conflict = true;
        }
        if d.policy.load(Ordering::Acquire) == 0 {
            d.policy.store(wanted.policy as u32, Ordering::Release);
        }
        Ok(Registered {
            index,
            limits: d.limits(),
            conflict,
        })
    }
}
