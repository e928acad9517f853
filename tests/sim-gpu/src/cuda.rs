//! The simulated CUDA driver API: devices, contexts, memory, modules,
//! launches, streams and events. Graphs are in graph.rs.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use crate::ffi::*;
use crate::local::{Alloc, KernelNode, Local, Stream, current_ctx, local, set_current};
use crate::state::{self, MAX_DEV, now_ns, phys_alloc, phys_free, run_kernel, shared, sleep_until};

pub type Dptr = u64;
type Handle = *mut c_void;

fn h(id: usize) -> Handle {
    id as Handle
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(rc) => return rc,
        }
    };
}

fn ready(l: &Local) -> Result<(), CUresult> {
    if l.initialized {
        Ok(())
    } else {
        Err(NOT_INITIALIZED)
    }
}

/// Physical device behind a CUDA ordinal of this process.
fn physical(l: &Local, ordinal: c_int) -> Result<usize, CUresult> {
    ready(l)?;
    usize::try_from(ordinal)
        .ok()
        .and_then(|o| l.visible.get(o).copied())
        .ok_or(INVALID_DEVICE)
}

fn ordinal_of(l: &Local, dev: usize) -> c_int {
    l.visible
        .iter()
        .position(|&d| d == dev)
        .map_or(-1, |o| o as c_int)
}

/// The current context and its device.
fn current(l: &Local) -> Result<(usize, usize), CUresult> {
    ready(l)?;
    let ctx = current_ctx().ok_or(INVALID_CONTEXT)?;
    let c = l.ctxs.get(&ctx).ok_or(INVALID_CONTEXT)?;
    Ok((ctx, c.dev))
}

fn visible_devices(ndev: usize) -> Vec<usize> {
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
        _ => 0,
    };
    if put(v, value) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

// ---- contexts ------------------------------------------------------------

fn create_context(l: &mut Local, dev: usize, primary: bool) -> Result<usize, CUresult> {
    let overhead = shared().dev[dev].ctx_overhead.load(Ordering::Relaxed);
    if !phys_alloc(dev, overhead) {
        return Err(OUT_OF_MEMORY);
    }
    state::me().contexts[dev].fetch_add(1, Ordering::AcqRel);
    Ok(l.new_context(dev, primary))
}

fn destroy_context(l: &mut Local, ctx: usize) {
    let Some(c) = l.ctxs.remove(&ctx) else { return };
    let overhead = shared().dev[c.dev].ctx_overhead.load(Ordering::Relaxed);
    phys_free(c.dev, overhead);
    let _ = state::me().contexts[c.dev].fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        Some(n.saturating_sub(1))
    });
    let owned = |a: &Alloc| a.ctx == ctx;
    for a in l.allocs.values().filter(|a| owned(a)) {
        phys_free(a.dev, a.bytes);
    }
    for a in l.handles.values().filter(|a| owned(a)) {
        phys_free(a.dev, a.bytes);
    }
    l.allocs.retain(|_, a| a.ctx != ctx);
    l.handles.retain(|_, a| a.ctx != ctx);
    l.streams.retain(|_, s| s.ctx != ctx);
    crate::local::drop_from_stack(ctx);
}

fn ctx_create(pctx: *mut Handle, d: c_int) -> CUresult {
    let mut l = local();
    let dev = tri!(physical(&l, d));
    if pctx.is_null() {
        return INVALID_VALUE;
    }
    let ctx = tri!(create_context(&mut l, dev, false));
    crate::local::push_current(ctx);
    put(pctx, h(ctx));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut Handle, _flags: c_uint, d: c_int) -> CUresult {
    ctx_create(pctx, d)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(pctx: *mut Handle, _flags: c_uint, d: c_int) -> CUresult {
    ctx_create(pctx, d)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut Handle,
    _params: *mut c_void,
    _n: c_int,
    _flags: c_uint,
    d: c_int,
) -> CUresult {
    ctx_create(pctx, d)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut Handle,
    _params: *mut c_void,
    _flags: c_uint,
    d: c_int,
) -> CUresult {
    ctx_create(pctx, d)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    if !l.ctxs.contains_key(&(ctx as usize)) || l.ctxs[&(ctx as usize)].primary {
        return INVALID_CONTEXT;
    }
    destroy_context(&mut l, ctx as usize);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy(ctx: Handle) -> CUresult {
    // SAFETY: same contract as the _v2 entry point.
    unsafe { cuCtxDestroy_v2(ctx) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut Handle) -> CUresult {
    let l = local();
    tri!(ready(&l));
    if put(pctx, h(current_ctx().unwrap_or(0))) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    let l = local();
    tri!(ready(&l));
    if !ctx.is_null() && !l.ctxs.contains_key(&(ctx as usize)) {
        return INVALID_CONTEXT;
    }
    set_current((!ctx.is_null()).then_some(ctx as usize));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    let l = local();
    tri!(ready(&l));
    if !l.ctxs.contains_key(&(ctx as usize)) {
        return INVALID_CONTEXT;
    }
    crate::local::push_current(ctx as usize);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent(ctx: Handle) -> CUresult {
    // SAFETY: same contract as the _v2 entry point.
    unsafe { cuCtxPushCurrent_v2(ctx) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut Handle) -> CUresult {
    let l = local();
    tri!(ready(&l));
    let Some(c) = crate::local::pop_current() else {
        return INVALID_CONTEXT;
    };
    put(pctx, h(c));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut Handle) -> CUresult {
    // SAFETY: same contract as the _v2 entry point.
    unsafe { cuCtxPopCurrent_v2(pctx) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(d: *mut c_int) -> CUresult {
    let l = local();
    let (_, dev) = tri!(current(&l));
    if put(d, ordinal_of(&l, dev)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(d: *mut c_int, ctx: Handle) -> CUresult {
    let l = local();
    tri!(ready(&l));
    let ctx = if ctx.is_null() {
        current_ctx().unwrap_or(0)
    } else {
        ctx as usize
    };
    let Some(c) = l.ctxs.get(&ctx) else {
        return INVALID_CONTEXT;
    };
    if put(d, ordinal_of(&l, c.dev)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

fn ctx_sync(ctx: usize) -> CUresult {
    let end = {
        let l = local();
        tri!(ready(&l));
        l.streams
            .values()
            .filter(|s| s.ctx == ctx)
            .map(|s| s.last_end)
            .max()
            .unwrap_or(0)
    };
    sleep_until(end);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    let ctx = {
        let l = local();
        tri!(current(&l)).0
    };
    ctx_sync(ctx)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: Handle) -> CUresult {
    if ctx.is_null() {
        // SAFETY: no arguments.
        return unsafe { cuCtxSynchronize() };
    }
    ctx_sync(ctx as usize)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, d: c_int) -> CUresult {
    let mut l = local();
    let dev = tri!(physical(&l, d));
    if pctx.is_null() {
        return INVALID_VALUE;
    }
    let ctx = match l.primary[dev] {
        Some((ctx, n)) => {
            l.primary[dev] = Some((ctx, n + 1));
            ctx
        }
        None => {
            let ctx = tri!(create_context(&mut l, dev, true));
            l.primary[dev] = Some((ctx, 1));
            ctx
        }
    };
    put(pctx, h(ctx));
    SUCCESS
}

fn primary_release(d: c_int, reset: bool) -> CUresult {
    let mut l = local();
    let dev = tri!(physical(&l, d));
    match l.primary[dev] {
        Some((ctx, n)) if reset || n <= 1 => {
            destroy_context(&mut l, ctx);
            l.primary[dev] = None;
            SUCCESS
        }
        Some((ctx, n)) => {
            l.primary[dev] = Some((ctx, n - 1));
            SUCCESS
        }
        None if reset => SUCCESS,
        None => INVALID_CONTEXT,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(d: c_int) -> CUresult {
    primary_release(d, false)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(d: c_int) -> CUresult {
    primary_release(d, false)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(d: c_int) -> CUresult {
    primary_release(d, true)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(d: c_int) -> CUresult {
    primary_release(d, true)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    d: c_int,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    let l = local();
    let dev = tri!(physical(&l, d));
    put(flags, 0);
    put(active, c_int::from(l.primary[dev].is_some()));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(d: c_int, _flags: c_uint) -> CUresult {
    let l = local();
    tri!(physical(&l, d));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags(d: c_int, flags: c_uint) -> CUresult {
    // SAFETY: same contract as the _v2 entry point.
    unsafe { cuDevicePrimaryCtxSetFlags_v2(d, flags) }
}

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
pub unsafe extern "C" fn cuMemcpyHtoD_v2(_dst: Dptr, _src: *const c_void, _n: usize) -> CUresult {
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, _src: Dptr, n: usize) -> CUresult {
    zero(dst as *mut u8, n);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8_v2(_dst: Dptr, _v: u8, _n: usize) -> CUresult {
    SUCCESS
}

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
    _ptr: Dptr,
    _bytes: usize,
    _off: usize,
    handle: u64,
    _f: u64,
) -> CUresult {
    if local().handles.contains_key(&(handle as usize)) {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(_ptr: Dptr, _bytes: usize) -> CUresult {
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

// ---- modules, launches, streams, events ----------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Handle, image: *const c_void) -> CUresult {
    let mut l = local();
    tri!(current(&l));
    if image.is_null() || module.is_null() {
        return INVALID_VALUE;
    }
    let id = l.new_id();
    l.modules.insert(id, Vec::new());
    put(module, h(id));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut Handle,
    module: Handle,
    name: *const c_char,
) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    let Some(name) = c_str(name) else {
        return INVALID_VALUE;
    };
    if !l.modules.contains_key(&(module as usize)) {
        return INVALID_HANDLE;
    }
    let id = l.new_id();
    l.funcs.insert(id, name);
    if let Some(fs) = l.modules.get_mut(&(module as usize)) {
        fs.push(id);
    }
    put(f, h(id));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(module: Handle) -> CUresult {
    let mut l = local();
    match l.modules.remove(&(module as usize)) {
        Some(fs) => {
            for f in fs {
                l.funcs.remove(&f);
            }
            SUCCESS
        }
        None => INVALID_HANDLE,
    }
}

/// How long a launch of `func` over `grid` runs on `dev`.
pub fn kernel_duration(
    l: &Local,
    func: usize,
    grid: [u32; 3],
    params: *mut *mut c_void,
    dev: usize,
) -> Option<u64> {
    let name = l.funcs.get(&func)?;
    let blocks = grid.iter().map(|&g| u64::from(g.max(1))).product::<u64>();
    let d = &shared().dev[dev];
    let waves = blocks.div_ceil(u64::from(d.sms.load(Ordering::Relaxed)));
    Some(match name.as_str() {
        "vgpu_spin" => kernel_arg_u64(params, 0).unwrap_or(0).saturating_mul(waves),
        "vgpu_empty" => 100,
        _ => d.block_ns.load(Ordering::Relaxed).saturating_mul(waves),
    })
}

/// Runs (or, on a capturing stream, records) one kernel launch.
pub fn launch(
    func: Handle,
    grid: [u32; 3],
    block: [u32; 3],
    stream: Handle,
    params: *mut *mut c_void,
) -> CUresult {
    let mut l = local();
    let (ctx, dev) = tri!(current(&l));
    let Some(dur) = kernel_duration(&l, func as usize, grid, params, dev) else {
        return INVALID_HANDLE;
    };
    let s = l.resolve_stream(stream as usize, ctx);
    let node = KernelNode {
        func: func as usize,
        grid,
        block,
        dur,
    };
    let capture = l.streams.get(&s).and_then(|st| st.capture);
    if let Some(graph) = capture {
        let id = l.new_id();
        l.nodes.insert(id, node);
        l.graphs.entry(graph).or_default().push(id);
        return SUCCESS;
    }
    let end = run_kernel(dev, dur);
    match l.streams.get_mut(&s) {
        Some(st) => st.last_end = st.last_end.max(end),
        None => return INVALID_HANDLE,
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shmem: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    launch(f, [gx, gy, gz], [bx, by, bz], stream, params)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shmem: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
) -> CUresult {
    launch(f, [gx, gy, gz], [bx, by, bz], stream, params)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params) }
}

/// `CUlaunchConfig`, as far as the simulator reads it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shmem: c_uint,
    pub stream: Handle,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    cfg: *const LaunchConfig,
    f: Handle,
    params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    let Some(c) = get(cfg) else {
        return INVALID_VALUE;
    };
    launch(f, c.grid, c.block, c.stream, params)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    cfg: *const LaunchConfig,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuLaunchKernelEx(cfg, f, params, extra) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ps: *mut Handle, _flags: c_uint) -> CUresult {
    let mut l = local();
    let (ctx, _) = tri!(current(&l));
    let id = l.new_id();
    l.streams.insert(
        id,
        Stream {
            ctx,
            last_end: 0,
            capture: None,
        },
    );
    if put(ps, h(id)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: Handle) -> CUresult {
    if local().streams.remove(&(s as usize)).is_some() {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

fn stream_end(s: Handle) -> Result<u64, CUresult> {
    let l = local();
    let (ctx, _) = current(&l)?;
    let s = l.resolve_stream(s as usize, ctx);
    l.streams
        .get(&s)
        .map(|st| st.last_end)
        .ok_or(INVALID_HANDLE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(s: Handle) -> CUresult {
    sleep_until(tri!(stream_end(s)));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(s: Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuStreamSynchronize(s) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery(s: Handle) -> CUresult {
    if tri!(stream_end(s)) <= now_ns() {
        SUCCESS
    } else {
        NOT_READY
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery_ptsz(s: Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuStreamQuery(s) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx(s: Handle, pctx: *mut Handle) -> CUresult {
    let l = local();
    let (ctx, _) = tri!(current(&l));
    let sid = l.resolve_stream(s as usize, ctx);
    let Some(st) = l.streams.get(&sid) else {
        return INVALID_HANDLE;
    };
    if put(pctx, h(st.ctx)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(pe: *mut Handle, _flags: c_uint) -> CUresult {
    let mut l = local();
    tri!(current(&l));
    let id = l.new_id();
    l.events.insert(id, Default::default());
    if put(pe, h(id)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(e: Handle) -> CUresult {
    if local().events.remove(&(e as usize)).is_some() {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(e: Handle, s: Handle) -> CUresult {
    let mut l = local();
    let (ctx, _) = tri!(current(&l));
    let sid = l.resolve_stream(s as usize, ctx);
    let Some(st) = l.streams.get(&sid) else {
        return INVALID_HANDLE;
    };
    if st.capture.is_some() {
        return SUCCESS;
    }
    let ts = st.last_end.max(now_ns());
    match l.events.get_mut(&(e as usize)) {
        Some(ev) => {
            ev.ts = Some(ts);
            SUCCESS
        }
        None => INVALID_HANDLE,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord_ptsz(e: Handle, s: Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuEventRecord(e, s) }
}

fn event_ts(e: Handle) -> Result<Option<u64>, CUresult> {
    local()
        .events
        .get(&(e as usize))
        .map(|ev| ev.ts)
        .ok_or(INVALID_HANDLE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(e: Handle) -> CUresult {
    match tri!(event_ts(e)) {
        Some(ts) if ts > now_ns() => NOT_READY,
        _ => SUCCESS,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(e: Handle) -> CUresult {
    if let Some(ts) = tri!(event_ts(e)) {
        sleep_until(ts);
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, a: Handle, b: Handle) -> CUresult {
    let (Some(ta), Some(tb)) = (tri!(event_ts(a)), tri!(event_ts(b))) else {
        return INVALID_HANDLE;
    };
    if tb > now_ns() {
        return NOT_READY;
    }
    if put(ms, (tb as f64 - ta as f64) as f32 / 1e6) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, a: Handle, b: Handle) -> CUresult {
    // SAFETY: same contract as the v1 entry point.
    unsafe { cuEventElapsedTime(ms, a, b) }
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
