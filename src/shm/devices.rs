//! The device table: one entry per physical GPU, keyed by UUID, so processes
//! with different `CUDA_VISIBLE_DEVICES` still share one quota per card.

use std::sync::atomic::Ordering;

use crate::Region;
use crate::error::ShmError;
use crate::layout::{DeviceEntry, MAX_DEVICES};

/// What a process knows about a device when it first registers it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    pub uuid: [u8; 16],
    pub total_mem: u64,
    pub sm_count: u32,
}

/// Limits a process would like a device to have (from its environment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Bytes, 0 = none.
    pub mem: u64,
    /// Percent, 0 = none.
    pub sm: u32,
    /// 0 default, 1 force, 2 disable.
    pub policy: u32,
}

impl DeviceEntry {
    pub fn uuid(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (o, b) in out.iter_mut().zip(&self.uuid) {
            *o = b.load(Ordering::Acquire);
        }
        out
    }

    pub fn limits(&self) -> Limits {
        Limits {
            mem: self.mem_limit.load(Ordering::Acquire),
            sm: self.sm_limit.load(Ordering::Acquire),
            policy: self.policy.load(Ordering::Acquire),
        }
    }

    pub fn is_used(&self) -> bool {
        self.in_use.load(Ordering::Acquire) != 0
    }
}

impl Region {
    /// Writes entry `index` outright, without the lock: for a private copy
    /// of a region, which keeps this process's entry indices.
    pub fn put_device(&self, index: usize, info: &DeviceInfo, limits: Limits) {
        let d = self.device(index);
        for (slot, b) in d.uuid.iter().zip(info.uuid) {
            slot.store(b, Ordering::Relaxed);
        }
        d.total_mem.store(info.total_mem, Ordering::Relaxed);
        d.sm_count.store(info.sm_count, Ordering::Relaxed);
        d.mem_limit.store(limits.mem, Ordering::Relaxed);
        d.sm_limit.store(limits.sm, Ordering::Relaxed);
        d.policy.store(limits.policy, Ordering::Relaxed);
        d.rate_scale_milli.store(1000, Ordering::Relaxed);
        d.in_use.store(1, Ordering::Release);
    }
}

/// The outcome of [`Region::register_device`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    pub index: usize,
    /// The limits now in force (the region's, where it already had some).
    pub limits: Limits,
    /// The region already held limits that differ from the ones asked for.
    pub conflict: bool,
}

impl Region {
    /// The entry for `uuid`, without taking the lock.
    pub fn find_device(&self, uuid: &[u8; 16]) -> Option<usize> {
        (0..MAX_DEVICES).find(|&i| {
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
                let Some(i) = (0..MAX_DEVICES).find(|&i| !self.device(i).is_used()) else {
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
            d.policy.store(wanted.policy, Ordering::Release);
        }
        Ok(Registered {
            index,
            limits: d.limits(),
            conflict,
        })
    }
}
