//! CUDA ordinals to the region's device entries, under any
//! `CUDA_VISIBLE_DEVICES`: entries are keyed by the UUID the driver reports
//! for the ordinal.
#![forbid(unsafe_code)]

use vgpu_shm::{DeviceInfo, EntryIndex};

use super::driver;
use super::real;
use super::sys::*;
use crate::attach::Attach;
use crate::ffi::Out;

/// What the driver says about ordinal `dev`.
fn info(dev: CUdevice) -> Option<DeviceInfo> {
    let uuid = driver::uuid(dev)?;
    let mut total = 0usize;
    let total_ok = real::cuDeviceTotalMem_v2(Out::from(&mut total), dev).is_ok();
    let mut sms = 0;
    let _ = real::cuDeviceGetAttribute(Out::from(&mut sms), ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    Some(DeviceInfo {
        uuid,
        total_mem: if total_ok { total as u64 } else { 0 },
        sm_count: sms.max(0) as u32,
    })
}

/// The device entry of ordinal `dev`.
pub fn entry(attach: &Attach, dev: CUdevice) -> Option<EntryIndex> {
    attach.device(dev, || info(dev))
}

/// The device entry and ordinal of the current context's device.
pub fn current_entry(attach: &Attach) -> Option<(EntryIndex, CUdevice)> {
    let dev = driver::current_ordinal()?;
    Some((entry(attach, dev)?, dev))
}
