//! The simulated CUDA driver API: virtual memory management, arrays and
//! memory pools.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_int, c_uint, c_void};

use crate::cuda::*;
use crate::ffi::*;
use crate::local::*;
use crate::state::{phys_alloc, phys_free};
// ---- VMM, arrays, pools ------------------------------------------------------

pub const MEM_LOCATION_DEVICE: c_int = 1;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    bytes: usize,
    prop: *const [c_int; 4],
    _flags: u64,
) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    let Some(p) = get(prop) else {
        return INVALID_VALUE;
    };
    if p[2] != MEM_LOCATION_DEVICE || handle.is_null() || bytes == 0 {
        return INVALID_VALUE;
    }
    let dev = tri!(physical(&l, p[3]));
    let ctx = current_ctx().unwrap_or(0);
    if !phys_alloc(dev, bytes as u64) {
        return OUT_OF_MEMORY;
    }
    let id = l.new_id();
    l.handles.insert(
        id,
        Alloc {
            dev,
            bytes: bytes as u64,
            ctx,
        },
    );
    put(handle, id as u64);
    SUCCESS
}

fn release_handle(id: usize) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    match l.handles.remove(&id) {
        Some(a) => {
            phys_free(a.dev, a.bytes);
            // Still mapped: its contents stay readable until unmapped.
            if !l.mapped.values().any(|&(h, _)| h == id) {
                l.hdata.remove(&id);
            }
            SUCCESS
        }
        None => INVALID_VALUE,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    release_handle(handle as usize)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut Dptr,
    bytes: usize,
    _align: usize,
    _addr: Dptr,
    _f: u64,
) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    let a = l.new_addr(0, bytes as u64);
    l.reserved.insert(a, bytes as u64);
    if put(ptr, a) { SUCCESS } else { INVALID_VALUE }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressFree(ptr: Dptr, _bytes: usize) -> CUresult {
    if local().reserved.remove(&ptr).is_some() {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: Dptr,
    bytes: usize,
    _off: usize,
    handle: u64,
    _f: u64,
) -> CUresult {
    let mut l = local();
    let id = handle as usize;
    if !l.handles.contains_key(&id) {
        return INVALID_HANDLE;
    }
    let end = ptr.saturating_add(bytes as u64);
    if bytes == 0 || l.mapped.iter().any(|(&a, &(_, n))| a < end && ptr < a + n) {
        return INVALID_VALUE;
    }
    l.mapped.insert(ptr, (id, bytes as u64));
    SUCCESS
}

/// Detaches every mapping inside `ptr..ptr+bytes`; a handle released
/// while mapped loses its contents now.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: Dptr, bytes: usize) -> CUresult {
    let mut l = local();
    let end = ptr.saturating_add(bytes as u64);
    let gone: Vec<(u64, usize)> = l
        .mapped
        .iter()
        .filter(|&(&a, _)| a >= ptr && a < end)
        .map(|(&a, &(h, _))| (a, h))
        .collect();
    for (a, h) in gone {
        l.mapped.remove(&a);
        if !l.handles.contains_key(&h) && !l.mapped.values().any(|&(m, _)| m == h) {
            l.hdata.remove(&h);
        }
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    _ptr: Dptr,
    _bytes: usize,
    _desc: *const c_void,
    _n: usize,
) -> CUresult {
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    g: *mut usize,
    _prop: *const c_void,
    _opt: c_int,
) -> CUresult {
    if put(g, 2 << 20) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

/// Bytes per element of a CUarray_format (16 for formats the simulator does
/// not model: block-compressed and video formats).
pub fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 16,
    }
}

fn array_bytes(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> u64 {
    (w.max(1) as u64)
        .saturating_mul(h.max(1) as u64)
        .saturating_mul(d.max(1) as u64)
        .saturating_mul(format_bytes(format))
        .saturating_mul(u64::from(channels.max(1)))
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3dDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

fn array_create(handle: *mut Handle, bytes: u64) -> CUresult {
    let mut l = local();
    let (ctx, dev) = tri!(current(&l));
    if handle.is_null() {
        return INVALID_VALUE;
    }
    if !phys_alloc(dev, bytes) {
        return OUT_OF_MEMORY;
    }
    let id = l.new_id();
    l.handles.insert(id, Alloc { dev, bytes, ctx });
    put(handle, h(id));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(arr: *mut Handle, desc: *const ArrayDesc) -> CUresult {
    let Some(d) = get(desc) else {
        return INVALID_VALUE;
    };
    array_create(arr, array_bytes(d.width, d.height, 1, d.format, d.channels))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    arr: *mut Handle,
    desc: *const Array3dDesc,
) -> CUresult {
    let Some(d) = get(desc) else {
        return INVALID_VALUE;
    };
    array_create(
        arr,
        array_bytes(d.width, d.height, d.depth, d.format, d.channels),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    arr: *mut Handle,
    desc: *const Array3dDesc,
    levels: c_uint,
) -> CUresult {
    let Some(d) = get(desc) else {
        return INVALID_VALUE;
    };
    let bytes = (0..levels.max(1))
        .map(|lv| {
            array_bytes(
                d.width >> lv,
                d.height >> lv,
                d.depth >> lv,
                d.format,
                d.channels,
            )
        })
        .fold(0u64, u64::saturating_add);
    array_create(arr, bytes)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(arr: Handle) -> CUresult {
    release_handle(arr as usize)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(arr: Handle) -> CUresult {
    release_handle(arr as usize)
}

fn device_pool(pool: *mut Handle, d: c_int) -> CUresult {
    let mut l = local();
    let dev = tri!(physical(&l, d));
    let id = match l.pools.iter().find(|&(_, &pd)| pd == dev) {
        Some((&id, _)) => id,
        None => {
            let id = l.new_id();
            l.pools.insert(id, dev);
            id
        }
    };
    if put(pool, h(id)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut Handle, d: c_int) -> CUresult {
    device_pool(pool, d)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut Handle, d: c_int) -> CUresult {
    device_pool(pool, d)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut Handle, props: *const [c_int; 4]) -> CUresult {
    let mut l = local();
    let Some(p) = get(props) else {
        return INVALID_VALUE;
    };
    if p[2] != MEM_LOCATION_DEVICE {
        return INVALID_VALUE;
    }
    let dev = tri!(physical(&l, p[3]));
    let id = l.new_id();
    l.pools.insert(id, dev);
    if put(pool, h(id)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    if local().pools.remove(&(pool as usize)).is_some() {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(_pool: Handle, _keep: usize) -> CUresult {
    SUCCESS
}
