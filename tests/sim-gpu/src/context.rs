//! The simulated CUDA driver API: contexts, primary contexts, context
//! synchronisation.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use crate::cuda::*;
use crate::ffi::*;
use crate::local::*;
use crate::state::{self, phys_alloc, phys_free, shared};
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
    let Local { allocs, data, .. } = &mut *l;
    data.retain(|base, _| allocs.contains_key(base));
    l.handles.retain(|_, a| a.ctx != ctx);
    let Local {
        handles,
        hdata,
        mapped,
        ..
    } = &mut *l;
    hdata.retain(|h, _| handles.contains_key(h) || mapped.values().any(|&(m, _)| m == *h));
    let Local {
        handles,
        shared,
        exportable,
        mapped,
        ..
    } = &mut *l;
    shared.retain(|h, _| handles.contains_key(h) || mapped.values().any(|&(m, _)| m == *h));
    exportable.retain(|h| handles.contains_key(h));
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
    let (dev, seq) = {
        let l = local();
        tri!(ready(&l));
        let Some(c) = l.ctxs.get(&ctx) else {
            return SUCCESS;
        };
        let seq = l.streams.values().filter(|s| s.ctx == ctx);
        (c.dev, seq.map(|s| s.last_seq).max().unwrap_or(0))
    };
    if seq != 0 {
        crate::queue::wait(dev, seq);
    }
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
