//! The simulated CUDA driver API: initialisation, devices, and the helpers
//! every other part of it uses. Contexts are in context.rs, memory in
//! memory.rs and vmm.rs, launches in launch.rs, streams and events in
//! stream.rs, graphs in graph.rs.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use crate::ffi::*;
use crate::local::{Local, current_ctx, local};
use crate::state::{MAX_DEV, shared};

pub type Dptr = u64;
pub type Handle = *mut c_void;

pub fn h(id: usize) -> Handle {
    id as Handle
}

pub fn ready(l: &Local) -> Result<(), CUresult> {
    if l.initialized {
        Ok(())
    } else {
        Err(NOT_INITIALIZED)
    }
}

/// Physical device behind a CUDA ordinal of this process.
pub fn physical(l: &Local, ordinal: c_int) -> Result<usize, CUresult> {
    ready(l)?;
    usize::try_from(ordinal)
        .ok()
        .and_then(|o| l.visible.get(o).copied())
        .ok_or(INVALID_DEVICE)
}

pub fn ordinal_of(l: &Local, dev: usize) -> c_int {
    l.visible
        .iter()
        .position(|&d| d == dev)
        .map_or(-1, |o| o as c_int)
}

/// The current context and its device.
pub fn current(l: &Local) -> Result<(usize, usize), CUresult> {
    ready(l)?;
    let ctx = current_ctx().ok_or(INVALID_CONTEXT)?;
    let c = l.ctxs.get(&ctx).ok_or(INVALID_CONTEXT)?;
    Ok((ctx, c.dev))
}

pub fn visible_devices(ndev: usize) -> Vec<usize> {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => v
            .split(',')
            .map_while(|t| t.trim().parse::<usize>().ok())
            .take_while(|&d| d < ndev)
            .collect(),
        Err(_) => (0..ndev).collect(),
    }
}

pub fn device_uuid(dev: usize) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..4].copy_from_slice(&0x5151_6d67u32.to_be_bytes());
    u[4] = 0x90;
    u[15] = dev as u8;
    u
}

// ---- initialisation and devices ------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    let ndev = shared().ndev.load(Ordering::Relaxed) as usize;
    // No entry yet: a process takes one with its first context or memory.
    let mut l = local();
    if !l.initialized {
        l.visible = visible_devices(ndev);
        l.initialized = true;
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    if put(v, 13000) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    let l = local();
    tri!(ready(&l));
    if put(n, l.visible.len() as c_int) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

/// Every two simulated GPUs can reach each other's memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: c_int,
    peer: c_int,
) -> CUresult {
    let l = local();
    tri!(physical(&l, dev));
    tri!(physical(&l, peer));
    if put(can, c_int::from(dev != peer)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(d: *mut c_int, ordinal: c_int) -> CUresult {
    let l = local();
    tri!(physical(&l, ordinal));
    if put(d, ordinal) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, d: c_int) -> CUresult {
    let l = local();
    let dev = tri!(physical(&l, d));
    if put_str(name, len.max(0) as usize, &format!("Simulated GPU {dev}")) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, d: c_int) -> CUresult {
    let l = local();
    let dev = tri!(physical(&l, d));
    let total = shared().dev[dev].total.load(Ordering::Relaxed);
    if put(bytes, total as usize) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, d: c_int) -> CUresult {
    let mut big = 0usize;
    // SAFETY: `big` is a local the callee writes.
    let rc = unsafe { cuDeviceTotalMem_v2(&mut big, d) };
    if rc == SUCCESS && !put(bytes, big.min(c_uint::MAX as usize) as c_uint) {
        return INVALID_VALUE;
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], d: c_int) -> CUresult {
    let l = local();
    let dev = tri!(physical(&l, d));
    if put(uuid, device_uuid(dev)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], d: c_int) -> CUresult {
    // SAFETY: same contract as the _v2 entry point.
    unsafe { cuDeviceGetUuid_v2(uuid, d) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, d: c_int) -> CUresult {
    let l = local();
    let dev = tri!(physical(&l, d));
    let value = match attr {
        1 => 1024,                                                    // max threads per block
        13 => 1_980_000,                                              // clock rate, kHz
        16 => shared().dev[dev].sms.load(Ordering::Relaxed) as c_int, // multiprocessor count
        75 => 9,                                                      // compute capability major
        76 => 0,                                                      // minor
        // Virtual memory management, unless `SIM_GPU_NO_VMM=1`.
        102 => c_int::from(std::env::var_os("SIM_GPU_NO_VMM").is_none_or(|v| v != "1")),
        _ => 0,
    };
    if put(v, value) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

// ---- misc ------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(rc: CUresult, out: *mut *const c_char) -> CUresult {
    let s: &'static [u8] = match rc {
        SUCCESS => b"no error\0",
        INVALID_VALUE => b"invalid argument\0",
        OUT_OF_MEMORY => b"out of memory\0",
        NOT_INITIALIZED => b"initialization error\0",
        NOT_READY => b"device not ready\0",
        _ => b"unknown error\0",
    };
    if put(out, s.as_ptr() as *const c_char) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(v: *mut c_int, _attr: c_int, _f: Handle) -> CUresult {
    if put(v, 0) { SUCCESS } else { INVALID_VALUE }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    _f: Handle,
    _bs: c_int,
    _sm: usize,
) -> CUresult {
    if put(n, 1) { SUCCESS } else { INVALID_VALUE }
}

/// Devices a stream-ordered launch could run on (for graph.rs).
pub fn current_device() -> Result<(usize, usize), CUresult> {
    current(&local())
}

const _: () = assert!(MAX_DEV <= 16);
