//! One virtual view of a limited device, the same through
//! `cuMemGetInfo_v2`, `cuDeviceTotalMem_v2` and `nvmlDeviceGetMemoryInfo`:
//! total = the limit, used = the container's usage, free = what is left of
//! the limit, never more than the card really has free.
#![forbid(unsafe_code)]

use vgpu_shm::{EntryIndex, Owners};

use crate::attach::Attach;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    pub total: u64,
    pub used: u64,
    pub free: u64,
}

/// The view of device entry `dev`, or None when it has no memory limit.
pub fn of(attach: &Attach, dev: EntryIndex, physical_free: u64) -> Option<View> {
    if !attach.intact() {
        return None;
    }
    let limit = attach.region.device(dev).mem_limit();
    if limit == 0 {
        return None;
    }
    let used = attach.region.device_usage(dev, Owners::Live);
    Some(View {
        total: limit,
        used,
        free: limit.saturating_sub(used).min(physical_free),
    })
}
