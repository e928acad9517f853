//! Contexts: creation registers the device and starts overhead accounting
//! (and the watcher); destruction and primary-context reset release
//! everything the context held.
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::exports::real;
use super::sys::*;
use super::{device, driver, memory};
use crate::ffi::get;
use crate::quota::{overhead, tracker};
use crate::{hostpid, init, limiter, watcher};

#[derive(Clone, Copy)]
struct Live {
    /// Region device entry.
    dev: vgpu_shm::EntryIndex,
    ordinal: CUdevice,
    primary: bool,
}

/// Our contexts, by handle.
static CONTEXTS: LazyLock<Mutex<HashMap<usize, Live>>> = LazyLock::new(Default::default);

/// Per device entry, this process's primary context reservation: threads
/// racing the first retain reserve it once (the driver makes one context
/// for all of them), the others wait for that reservation's outcome.
static PRIMARY: [AtomicU8; vgpu_shm::MAX_DEVICES] =
    [const { AtomicU8::new(NONE) }; vgpu_shm::MAX_DEVICES];
const NONE: u8 = 0;
const RESERVING: u8 = 1;
const RESERVED: u8 = 2;

/// This thread reserves the primary context of a device for every racer;
/// dropped unsettled (an error, a panic), it lets the next one try.
struct Ticket(Option<vgpu_shm::EntryIndex>);

impl Ticket {
    /// The reservation stands (or is given up) for the other racers.
    fn settle(&mut self, reserved: bool) {
        if let Some(dev) = self.0.take() {
            PRIMARY[dev.get()].store(if reserved { RESERVED } else { NONE }, Ordering::Release);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.settle(false);
    }
}

/// Whether this thread must reserve the primary context of `dev`: Some for
/// the one that wins the race, None once it is reserved. Waits (not in
/// the driver, holding nothing) while another thread reserves; after
/// [`TICKET_WAIT`] it reserves on its own rather than wait on.
fn primary_ticket(dev: vgpu_shm::EntryIndex) -> Option<Ticket> {
    let state = &PRIMARY[dev.get()];
    let until = std::time::Instant::now() + TICKET_WAIT;
    loop {
        match state.compare_exchange(NONE, RESERVING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(Ticket(Some(dev))),
            Err(RESERVED) => return None,
            Err(_) if std::time::Instant::now() >= until => return Some(Ticket(None)),
            Err(_) => std::thread::sleep(Duration::from_micros(200)),
        }
    }
}

/// Longer than a context reservation may wait for room (one second).
const TICKET_WAIT: Duration = Duration::from_secs(5);

/// Runs a context-creating call: reserves what a new context costs, then
/// registers what it made.
fn created(
    ordinal: CUdevice,
    primary: bool,
    out: *mut CUcontext,
    create: impl FnOnce() -> CUresult,
) -> CUresult {
    if let Some(attach) = init::attach()
        && let Err(rc) = memory::counted_slot(attach)
    {
        return rc;
    }
    let entry = init::attach().and_then(|a| Some((a, device::entry(a, ordinal)?)));
    // Retaining a primary context that exists costs nothing new; nor does
    // one another thread is creating and has reserved.
    let fresh = !(primary && primary_of(ordinal).is_some());
    let mut reserved = None;
    if let Some((attach, dev)) = entry.filter(|_| fresh) {
        let ticket = if primary {
            primary_ticket(dev)
        } else {
            Some(Ticket(None))
        };
        if let Some(mut t) = ticket {
            hostpid::before_first_context(attach, dev);
            match memory::reserve_context(attach, dev) {
                Ok(r) => reserved = r,
                Err(rc) => return rc,
            }
            t.settle(true);
        }
    }
    let rc = {
        // Ends before the new context is measured, which wants quiet.
        let _in_driver = entry.map(|(_, dev)| overhead::in_driver(dev));
        create()
    };
    // The creation took a while: the region file is checked again.
    let usable = entry.is_none_or(|(a, _)| a.intact());
    let (Some((attach, dev)), true, Some(ctx)) = (entry, rc.is_ok(), get(out)) else {
        if let (Some((attach, dev)), Some((slot, bytes)), true) = (entry, reserved, usable) {
            attach
                .region
                .unreserve(slot, dev, vgpu_shm::Kind::Context, bytes);
        }
        if let (true, Some((_, dev)), Some(_)) = (primary, entry, reserved) {
            // The primary's reservation is gone: the next racer reserves.
            PRIMARY[dev.get()].store(NONE, Ordering::Release);
        }
        return rc;
    };
    let live = Live {
        dev,
        ordinal,
        primary,
    };
    if CONTEXTS.lock().insert(ctx as usize, live).is_none() && usable {
        overhead::context_created(attach, dev);
        // (The measurement may have asked NVML: check the file again.)
        if attach.intact() {
            limiter::device_in_use(attach, dev);
        }
        watcher::start();
        watcher::kick();
    }
    rc
}

/// Releases what context `ctx` held, once the driver has destroyed it.
fn forget(ctx: usize) {
    let Some(live) = CONTEXTS.lock().remove(&ctx) else {
        return;
    };
    if live.primary {
        PRIMARY[live.dev.get()].store(NONE, Ordering::Release);
    }
    for t in tracker::drain_context(ctx) {
        memory::release(t);
    }
    limiter::context_gone(ctx);
    if let Some(attach) = init::attach() {
        overhead::context_destroyed(attach, live.dev);
    }
}

fn primary_of(ordinal: CUdevice) -> Option<usize> {
    CONTEXTS
        .lock()
        .iter()
        .find(|(_, l)| l.primary && l.ordinal == ordinal)
        .map(|(&c, _)| c)
}

pub fn create_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    created(dev, false, ctx, || real::cuCtxCreate_v2(ctx, flags, dev))
}

pub fn create_v3(
    ctx: *mut CUcontext,
    params: *mut c_void,
    n: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    created(dev, false, ctx, || {
        real::cuCtxCreate_v3(ctx, params, n, flags, dev)
    })
}

pub fn create_v4(
    ctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    created(dev, false, ctx, || {
        real::cuCtxCreate_v4(ctx, params, flags, dev)
    })
}

pub fn primary_retain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    created(dev, true, ctx, || real::cuDevicePrimaryCtxRetain(ctx, dev))
}

pub fn destroy(ctx: CUcontext) -> CUresult {
    let held = tracker::context_bytes(ctx as usize);
    let _in_driver: Vec<_> = held.iter().map(|&(d, _)| overhead::in_driver(d)).collect();
    for &(dev, bytes) in &held {
        overhead::freeing(dev, bytes);
    }
    limiter::context_ending(ctx as usize);
    let rc = real::cuCtxDestroy_v2(ctx);
    if rc.is_ok() {
        forget(ctx as usize);
    } else {
        for &(dev, bytes) in &held {
            overhead::allocated(dev, bytes);
        }
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
    let held = ctx.map(tracker::context_bytes).unwrap_or_default();
    let _in_driver: Vec<_> = held.iter().map(|&(d, _)| overhead::in_driver(d)).collect();
    for &(d, bytes) in &held {
        overhead::freeing(d, bytes);
    }
    if let Some(ctx) = ctx {
        limiter::context_ending(ctx);
    }
    let rc = reset();
    if !rc.is_ok() {
        for &(d, bytes) in &held {
            overhead::allocated(d, bytes);
        }
    }
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

/// Fork handlers: hold the table across fork; the child starts empty.
pub fn fork_prepare() {
    std::mem::forget(CONTEXTS.lock());
}

pub fn fork_parent() {
    // SAFETY: fork_prepare() locked it on this thread and forgot the guard.
    unsafe { CONTEXTS.force_unlock() };
}

pub fn fork_child() {
    // SAFETY: as fork_parent().
    unsafe { CONTEXTS.force_unlock() };
    CONTEXTS.lock().clear();
    for p in &PRIMARY {
        p.store(NONE, Ordering::Release);
    }
}
