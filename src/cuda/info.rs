//! `cuInit` and the virtual view: `cuMemGetInfo_v2` and
//! `cuDeviceTotalMem_v2` report the limit as total and the container's
//! usage as used. NULL out-pointers are accepted, as the driver accepts them.

use std::ffi::c_uint;

use super::device;
use super::sys::*;
use crate::ffi::put;
use crate::interpose::real::Lib;
use crate::{init, view, watcher};

crate::interpose::table::hooks! {
    lib: Lib::Cuda, missing: CUresult::ERROR_NOT_FOUND;
    fn cuInit(flags: c_uint) -> CUresult => cu_init;
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult => mem_get_info;
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult => device_total_mem;
}

fn cu_init(flags: c_uint) -> CUresult {
    let rt = init::runtime();
    if rt.refused.is_some() {
        // The reason was logged once, naming the variable.
        return CUresult::ERROR_INVALID_VALUE;
    }
    if rt.attach.is_some() {
        // NVML comes up on the watcher while the driver initialises.
        watcher::start();
    }
    match real::cuInit() {
        // SAFETY: the program's argument passes through unchanged.
        Some(f) => unsafe { f(flags) },
        None => CUresult::ERROR_NOT_FOUND,
    }
}

fn mem_get_info(free_out: *mut usize, total_out: *mut usize) -> CUresult {
    let Some(f) = real::cuMemGetInfo_v2() else {
        return CUresult::ERROR_NOT_FOUND;
    };
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both out-pointers are our locals.
    let rc = unsafe { f(&mut free, &mut total) };
    if rc.is_ok() {
        if let Some(attach) = init::attach()
            && let Some((dev, _)) = device::current_entry(attach)
            && let Some(v) = view::of(attach, dev, free as u64)
        {
            free = v.free as usize;
            total = v.total as usize;
        }
        put(free_out, free);
        put(total_out, total);
    }
    rc
}

fn device_total_mem(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let Some(f) = real::cuDeviceTotalMem_v2() else {
        return CUresult::ERROR_NOT_FOUND;
    };
    let mut total = 0usize;
    // SAFETY: the out-pointer is our local.
    let rc = unsafe { f(&mut total, dev) };
    if rc.is_ok() {
        if let Some(attach) = init::attach()
            && let Some(entry) = device::entry(attach, dev)
        {
            let limit = attach.region.device(entry).limits().mem;
            if limit != 0 {
                total = limit as usize;
            }
        }
        put(bytes, total);
    }
    rc
}
