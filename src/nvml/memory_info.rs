//! NVML memory info through the virtual view, so nvidia-smi inside the
//! container shows the quota as the card's memory.
#![forbid(unsafe_code)]

use std::ffi::c_char;

use vgpu_shm::{DeviceInfo, parse_uuid};

use super::real;
use super::sys::*;
use crate::ffi::Out;
use crate::{init, view};

/// The region entry for an NVML device handle.
fn entry(
    device: NvmlDevice,
    total: u64,
) -> Option<(&'static crate::attach::Attach, vgpu_shm::EntryIndex)> {
    let attach = init::attach()?;
    let mut text = [0 as c_char; 96];
    if !real::uuid_of(device, &mut text).is_ok() {
        return None;
    }
    let bytes: Vec<u8> = text
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let uuid = parse_uuid(std::str::from_utf8(&bytes).ok()?)?;
    let mut index = NvmlIndex::default();
    let index = real::nvmlDeviceGetIndex(device, Out::from(&mut index))
        .is_ok()
        .then_some(index);
    let info = DeviceInfo {
        uuid,
        total_mem: total,
        sm_count: 0,
    };
    Some((attach, attach.device_by_uuid(index, &info)?))
}

pub fn memory_info(device: NvmlDevice, memory: Out<Memory>) -> NvmlReturn {
    let rc = real::nvmlDeviceGetMemoryInfo(device, memory);
    let Some(m) = memory.get().filter(|_| rc.is_ok()) else {
        return rc;
    };
    if let Some((attach, dev)) = entry(device, m.total)
        && let Some(v) = view::of(attach, dev, m.free)
    {
        memory.put(Memory {
            total: v.total,
            free: v.free,
            used: v.used,
        });
    }
    rc
}

pub fn memory_info_v2(device: NvmlDevice, memory: Out<MemoryV2>) -> NvmlReturn {
    let rc = real::nvmlDeviceGetMemoryInfo_v2(device, memory);
    let Some(m) = memory.get().filter(|_| rc.is_ok()) else {
        return rc;
    };
    if let Some((attach, dev)) = entry(device, m.total)
        && let Some(v) = view::of(attach, dev, m.free)
    {
        // The driver's reservation is outside the container's quota.
        memory.put(MemoryV2 {
            version: m.version,
            total: v.total,
            reserved: 0,
            free: v.free,
            used: v.used,
        });
    }
    rc
}
