//! Contexts: creation reserves what a context costs and registers the
//! device (and starts the watcher); destruction and primary-context reset
//! release everything the context held. The accounting is `quota`'s.
#![forbid(unsafe_code)]

use std::ffi::{c_int, c_uint, c_void};

use super::real;
use super::sys::*;
use super::{device, driver, launch};
use crate::ffi::Out;
use crate::limiter::{events, probes};
use crate::process::{CONTEXTS, LiveContext};
use crate::quota::{self, Freeing, overhead};
use crate::{hostpid, init, limiter, watcher};

/// Runs a context-creating call: reserves what a new context costs, then
/// registers what it made.
fn created(
    ordinal: CUdevice,
    primary: bool,
    out: Out<CUcontext>,
    create: impl FnOnce() -> CUresult,
) -> CUresult {
    if let Some(attach) = init::attach()
        && let Err(rc) = quota::counted_slot(attach)
    {
        return rc;
    }
    let entry = init::attach().and_then(|a| Some((a, device::entry(a, ordinal)?)));
    // Retaining a primary context that exists costs nothing new; nor does
    // one another thread is creating and has reserved.
    let fresh = !(primary && primary_of(ordinal).is_some());
    let charge = match entry.filter(|_| fresh) {
        Some((attach, dev)) => {
            let first = || hostpid::before_first_context(attach, dev);
            match quota::context::reserve(attach, dev, primary, first) {
                Ok(c) => c,
                Err(rc) => return rc,
            }
        }
        None => None,
    };
    let rc = {
        // Ends before the new context is measured, which wants quiet.
        let _in_driver = entry.map(|(_, dev)| overhead::in_driver(dev));
        create()
    };
    let (Some((attach, dev)), true, Some(ctx)) = (entry, rc.is_ok(), out.get()) else {
        return rc;
    };
    if let Some(c) = charge {
        c.keep();
    }
    let live = LiveContext {
        dev,
        ordinal,
        primary,
    };
    // The creation took a while: the region file is checked again.
    if CONTEXTS.lock().insert(ctx as usize, live).is_none() && attach.intact() {
        quota::context::created(attach, dev);
        // (The measurement may have asked NVML: check the file again.)
        if attach.intact() {
            limiter::device_in_use(attach, dev);
        }
        watcher::start(attach);
        watcher::kick();
    }
    rc
}

/// Releases what context `ctx` held, once the driver has destroyed it.
fn forget(ctx: usize) {
    let Some(live) = CONTEXTS.lock().remove(&ctx) else {
        return;
    };
    quota::context::gone(init::attach(), ctx, live.dev, live.primary);
    events::forget_context(ctx);
    probes::forget_context(ctx);
    launch::context_gone(ctx);
}

fn primary_of(ordinal: CUdevice) -> Option<usize> {
    CONTEXTS
        .lock()
        .iter()
        .find(|(_, l)| l.primary && l.ordinal == ordinal)
        .map(|(&c, _)| c)
}

pub fn create_v2(ctx: Out<CUcontext>, flags: c_uint, dev: CUdevice) -> CUresult {
    created(dev, false, ctx, || real::cuCtxCreate_v2(ctx, flags, dev))
}

pub fn create_v3(
    call: &impl Fn() -> CUresult,
    ctx: Out<CUcontext>,
    _params: *mut c_void,
    _n: c_int,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    created(dev, false, ctx, call)
}

pub fn create_v4(
    call: &impl Fn() -> CUresult,
    ctx: Out<CUcontext>,
    _params: *mut c_void,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    created(dev, false, ctx, call)
}

pub fn primary_retain(ctx: Out<CUcontext>, dev: CUdevice) -> CUresult {
    created(dev, true, ctx, || real::cuDevicePrimaryCtxRetain(ctx, dev))
}

pub fn destroy(ctx: CUcontext) -> CUresult {
    let held = quota::context::held_in(ctx as usize);
    let mut freeing = Freeing::begin(&held);
    events::destroy_idle_events(ctx as usize);
    let rc = real::cuCtxDestroy_v2(ctx);
    freeing.done(rc);
    if rc.is_ok() {
        forget(ctx as usize);
    }
    rc
}

/// After a release, the primary context is gone if nobody retains it.
fn released(dev: CUdevice, rc: CUresult) -> CUresult {
    if rc.is_ok()
        && !driver::primary_active(dev)
        && let Some(ctx) = primary_of(dev)
    {
        forget(ctx);
    }
    rc
}

pub fn primary_release_v2(dev: CUdevice) -> CUresult {
    released(dev, real::cuDevicePrimaryCtxRelease_v2(dev))
}

pub fn primary_release_v1(dev: CUdevice) -> CUresult {
    released(dev, real::cuDevicePrimaryCtxRelease(dev))
}

/// A reset destroys every allocation of the primary context.
fn reset(dev: CUdevice, reset: impl FnOnce() -> CUresult) -> CUresult {
    let ctx = primary_of(dev);
    let held = ctx.map(quota::context::held_in).unwrap_or_default();
    let mut freeing = Freeing::begin(&held);
    if let Some(ctx) = ctx {
        events::destroy_idle_events(ctx);
    }
    let rc = reset();
    freeing.done(rc);
    if rc.is_ok()
        && let Some(ctx) = ctx
    {
        forget(ctx);
    }
    rc
}

pub fn primary_reset_v2(dev: CUdevice) -> CUresult {
    reset(dev, || real::cuDevicePrimaryCtxReset_v2(dev))
}

pub fn primary_reset_v1(dev: CUdevice) -> CUresult {
    reset(dev, || real::cuDevicePrimaryCtxReset(dev))
}
