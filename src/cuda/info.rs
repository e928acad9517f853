//! `cuInit` and the virtual view: `cuMemGetInfo_v2` and
//! `cuDeviceTotalMem_v2` report the limit as total and the container's
//! usage as used. NULL out-pointers are accepted, as the driver accepts them.
#![forbid(unsafe_code)]

use std::ffi::c_uint;

use super::device;
use super::real;
use super::sys::*;
use crate::ffi::Out;
use crate::{init, view, watcher};

pub fn cu_init(flags: c_uint) -> CUresult {
    let rt = init::runtime();
    if rt.refused.is_some() {
        // The reason was logged once, naming the variable.
        return CUresult::ERROR_INVALID_VALUE;
    }
    if let Some(attach) = &rt.attach {
        // A process that cannot be counted must not run: fail closed.
        if attach.slot().is_none() {
            log::error!(
                "{}; cuInit returns CUDA_ERROR_OUT_OF_MEMORY: a process the quota cannot count must not use the GPU",
                attach
                    .claim_error()
                    .unwrap_or_else(|| "no process slot".into())
            );
            return CUresult::ERROR_OUT_OF_MEMORY;
        }
        // NVML comes up on the watcher while the driver initialises.
        watcher::start(attach);
    }
    let rc = real::cuInit(flags);
    if let Some(name) = &rt.config.test_hold_lock {
        crate::fork::hold_for_test(name);
    }
    rc
}

pub fn mem_get_info(free_out: Out<usize>, total_out: Out<usize>) -> CUresult {
    // The program's pointers pass through unchanged, NULLs included: the
    // driver's answer to them is the answer.
    let rc = real::cuMemGetInfo_v2(free_out, total_out);
    if !rc.is_ok() || (free_out.is_null() && total_out.is_null()) {
        return rc;
    }
    let Some(attach) = init::attach() else {
        return rc;
    };
    let Some((dev, _)) = device::current_entry(attach) else {
        return rc;
    };
    let physical_free = match free_out.get() {
        Some(free) => free,
        None => {
            let (mut free, mut total) = (0usize, 0usize);
            if !real::cuMemGetInfo_v2(Out::from(&mut free), Out::from(&mut total)).is_ok() {
                return rc;
            }
            free
        }
    };
    if let Some(v) = view::of(attach, dev, physical_free as u64) {
        free_out.put(v.free as usize);
        total_out.put(v.total as usize);
    }
    rc
}

pub fn device_total_mem(bytes: Out<usize>, dev: CUdevice) -> CUresult {
    let rc = real::cuDeviceTotalMem_v2(bytes, dev);
    if rc.is_ok()
        && !bytes.is_null()
        && let Some(attach) = init::attach()
        && let Some(entry) = device::entry(attach, dev)
        && attach.intact()
    {
        let limit = attach.region.device(entry).mem_limit();
        if limit != 0 {
            bytes.put(limit as usize);
        }
    }
    rc
}
