//! The simulated CUDA driver API: device memory, host memory, copies.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_uint, c_void};
use std::sync::atomic::Ordering;

use crate::cuda::*;
use crate::ffi::*;
use crate::local::*;
use crate::state::{self, phys_alloc, phys_free, shared};
// ---- memory --------------------------------------------------------------

/// Takes `bytes` on the current context's device and records the address.
fn alloc_on_current(dptr: *mut Dptr, bytes: usize) -> CUresult {
    let mut l = local();
    let (ctx, dev) = tri!(current(&l));
    if dptr.is_null() || bytes == 0 {
        return INVALID_VALUE;
    }
    alloc_in(&mut l, dptr, bytes as u64, dev, ctx)
}

fn alloc_in(l: &mut Local, dptr: *mut Dptr, bytes: u64, dev: usize, ctx: usize) -> CUresult {
    if !phys_alloc(dev, bytes) {
        return OUT_OF_MEMORY;
    }
    let addr = l.new_addr(dev, bytes);
    l.allocs.insert(addr, Alloc { dev, bytes, ctx });
    put(dptr, addr);
    SUCCESS
}

fn free_addr(p: Dptr) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    if p == 0 {
        return SUCCESS;
    }
    l.data.remove(&p);
    match l.allocs.remove(&p) {
        Some(a) => {
            phys_free(a.dev, a.bytes);
            SUCCESS
        }
        None => INVALID_VALUE,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut Dptr, bytes: usize) -> CUresult {
    alloc_on_current(dptr, bytes)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut Dptr,
    bytes: usize,
    _flags: c_uint,
) -> CUresult {
    alloc_on_current(dptr, bytes)
}

pub const PITCH_ALIGN: usize = 512;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut Dptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    if pitch.is_null() || !matches!(elem, 4 | 8 | 16) {
        return INVALID_VALUE;
    }
    let p = width.div_ceil(PITCH_ALIGN) * PITCH_ALIGN;
    let rc = alloc_on_current(dptr, p.saturating_mul(height));
    if rc == SUCCESS {
        put(pitch, p);
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(p: Dptr) -> CUresult {
    free_addr(p)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut Dptr, bytes: usize, _s: Handle) -> CUresult {
    alloc_on_current(dptr, bytes)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut Dptr,
    bytes: usize,
    s: Handle,
) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuMemAllocAsync(dptr, bytes, s) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut Dptr,
    bytes: usize,
    pool: Handle,
    _s: Handle,
) -> CUresult {
    let mut l = local();
    let (ctx, cur_dev) = tri!(current(&l));
    let Some(&dev) = l.pools.get(&(pool as usize)) else {
        return INVALID_VALUE;
    };
    if dptr.is_null() || bytes == 0 {
        return INVALID_VALUE;
    }
    let _ = cur_dev;
    alloc_in(&mut l, dptr, bytes as u64, dev, ctx)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut Dptr,
    bytes: usize,
    pool: Handle,
    s: Handle,
) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuMemAllocFromPoolAsync(dptr, bytes, pool, s) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(p: Dptr, _s: Handle) -> CUresult {
    free_addr(p)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(p: Dptr, _s: Handle) -> CUresult {
    free_addr(p)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let l = local();
    let (_, dev) = tri!(current(&l));
    state::reclaim_dead();
    let t = shared().dev[dev].total.load(Ordering::Relaxed);
    put(free, t.saturating_sub(state::phys_used(dev)) as usize);
    put(total, t as usize);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytes: usize,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: calloc returns zeroed memory or NULL; ownership passes to the caller.
    let p = unsafe { libc::calloc(1, bytes.max(1)) };
    if p.is_null() {
        return OUT_OF_MEMORY;
    }
    put(pp, p);
    SUCCESS
}

/// Host memory is the card's in the simulator: registering it (vgpu's
/// host arena, oversub/mover.rs) checks the arguments, and takes
/// `SIM_GPU_PIN_MS_PER_GIB` ms a GiB (default 0; the H100 pins 3-7 GB/s).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    if p.is_null() || bytes == 0 {
        return INVALID_VALUE;
    }
    let per_gib = std::env::var("SIM_GPU_PIN_MS_PER_GIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    if per_gib > 0 {
        let ms = per_gib.saturating_mul(bytes as u64) >> 30;
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    if p.is_null() { INVALID_VALUE } else { SUCCESS }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    d: *mut Dptr,
    p: *mut c_void,
    _f: c_uint,
) -> CUresult {
    if put(d, p as Dptr) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    // SAFETY: p came from cuMemHostAlloc (calloc) or is NULL.
    unsafe { libc::free(p) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: Dptr, src: *const c_void, n: usize) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    if n == 0 {
        return SUCCESS;
    }
    if src.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller passes `n` readable bytes at `src`, as to the driver.
    let bytes = unsafe { std::slice::from_raw_parts(src as *const u8, n) };
    if crate::data::write(&mut l, dst, bytes) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: Dptr, n: usize) -> CUresult {
    let l = local();
    tri!(ready(&l));
    if n == 0 {
        return SUCCESS;
    }
    if dst.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller passes `n` writable bytes at `dst`, as to the driver.
    let out = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, n) };
    if crate::data::read(&l, src, out) {
        SUCCESS
    } else {
        zero(dst as *mut u8, n);
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: Dptr,
    src: *const c_void,
    n: usize,
    _s: Handle,
) -> CUresult {
    // SAFETY: same contract as the synchronous copy (done at once here).
    unsafe { cuMemcpyHtoD_v2(dst, src, n) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: Dptr,
    n: usize,
    _s: Handle,
) -> CUresult {
    // SAFETY: same contract as the synchronous copy (done at once here).
    unsafe { cuMemcpyDtoH_v2(dst, src, n) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: Dptr, v: u8, n: usize) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    if n == 0 || crate::data::fill(&mut l, dst, v, n) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

/// The allocation or VMM mapping holding `p`: (base, size, VMM, its
/// context: none for a mapping). A VMM mapping answers its mapped size,
/// as the driver does (docs/vmm-facts.md fact 5).
fn range_of(p: Dptr) -> Option<(Dptr, u64, bool, usize)> {
    let l = local();
    let hit = |base: u64, bytes: u64| p >= base && p < base + bytes;
    l.allocs
        .iter()
        .find(|&(&b, a)| hit(b, a.bytes))
        .map(|(&b, a)| (b, a.bytes, false, a.ctx))
        .or_else(|| {
            l.mapped
                .iter()
                .find(|&(&b, &(_, n))| hit(b, n))
                .map(|(&b, &(_, n))| (b, n, true, 0))
        })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut Dptr,
    size: *mut usize,
    p: Dptr,
) -> CUresult {
    let Some((b, n, _, _)) = range_of(p) else {
        return 500; // CUDA_ERROR_NOT_FOUND
    };
    put(base, b);
    put(size, n as usize);
    SUCCESS
}

/// The range attributes (11: start, 12: size) of the block or mapping
/// holding `p`, as `cuMemGetAddressRange_v2` answers; 1 (context): its
/// context, NULL for VMM memory; 10 (legacy IPC capable): 1 for
/// cuMemAlloc's blocks, 0 for VMM memory, as the driver answers
/// (docs/vmm-facts.md fact 5). Others: not supported here.
fn pointer_attribute(data: *mut c_void, attribute: i32, p: Dptr) -> CUresult {
    let Some((b, n, vmm, ctx)) = range_of(p) else {
        return INVALID_VALUE;
    };
    let ok = match attribute {
        1 => put(data.cast::<Handle>(), h(ctx)),
        10 => put(data.cast::<i32>(), i32::from(!vmm)),
        11 => put(data.cast::<Dptr>(), b),
        12 => put(data.cast::<usize>(), n as usize),
        _ => return NOT_SUPPORTED,
    };
    if ok { SUCCESS } else { INVALID_VALUE }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: i32,
    p: Dptr,
) -> CUresult {
    pointer_attribute(data, attribute, p)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: u32,
    attributes: *const i32,
    data: *mut *mut c_void,
    p: Dptr,
) -> CUresult {
    for i in 0..n as usize {
        let (Some(a), Some(d)) = (get_at(attributes, i), get_at(data.cast_const(), i)) else {
            return INVALID_VALUE;
        };
        let rc = pointer_attribute(d, a, p);
        if rc != SUCCESS {
            return rc;
        }
    }
    SUCCESS
}

/// Legacy IPC: cuMemAlloc's blocks only; VMM memory answers
/// CUDA_ERROR_INVALID_VALUE, as the driver does.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(h: *mut [u8; 64], p: Dptr) -> CUresult {
    match range_of(p) {
        Some((b, _, false, _)) => {
            let mut v = [0u8; 64];
            v[..8].copy_from_slice(&b.to_le_bytes());
            if put(h, v) { SUCCESS } else { INVALID_VALUE }
        }
        _ => INVALID_VALUE,
    }
}
