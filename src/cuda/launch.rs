//! The launch families, each through the compute limiter: kernels, `Ex`,
//! cooperative kernels and graphs, with their per-thread-stream variants.
//! Each hook describes its launch and makes one call
//! (`limiter::launch::run`).
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::ffi::{c_uint, c_void};

use vgpu_shm::EntryIndex;

use super::real;
use super::sys::*;
use super::{device, driver};
use crate::attach::Attach;
use crate::ffi::In;
use crate::limiter::launch::Launch;
use crate::limiter::{self, estimate};
use crate::{hami, init, process};

type Args = *mut *mut c_void;

/// A kernel launch's description.
fn kernel_launch(
    func: CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    stream: CUstream,
    per_thread: bool,
) -> Launch {
    Launch {
        key: estimate::kernel_key(func as usize, grid, block),
        stream: event_stream(stream, per_thread),
    }
}

/// A graph launch's description.
fn graph_launch(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> Launch {
    Launch {
        key: estimate::graph_key(exec as usize),
        stream: event_stream(stream, per_thread),
    }
}

fn event_stream(stream: CUstream, per_thread: bool) -> CUstream {
    if per_thread && stream.is_null() {
        STREAM_PER_THREAD
    } else {
        stream
    }
}

/// Runs a launch through HAMi's gate (priority time-sharing) and the
/// bucket of its device. Without an SM limit in this process, two atomic
/// loads.
#[inline]
fn launched(describe: impl FnOnce() -> Launch, go: impl FnOnce() -> CUresult) -> CUresult {
    hami::launching();
    if !limiter::any_limit() {
        return go();
    }
    limiter::launch::run(describe(), launch_device, go)
}

thread_local! {
    /// (context, device entry) of this thread's last launch.
    static LAST: Cell<(usize, Option<EntryIndex>)> = const { Cell::new((0, None)) };
}

/// The device entry a launch runs on: the one device this process uses,
/// or the current context's (remembered per thread and context).
fn launch_device() -> Option<(&'static Attach, EntryIndex)> {
    let attach = init::attach()?;
    if let Some(only) = process::only_device() {
        return Some((attach, only));
    }
    let ctx = driver::current_context()? as usize;
    if let (c, Some(d)) = LAST.with(Cell::get)
        && c == ctx
    {
        return Some((attach, d));
    }
    let (dev, _) = device::current_entry(attach)?;
    LAST.with(|l| l.set((ctx, Some(dev))));
    Some((attach, dev))
}

/// Context `ctx` is gone: this thread's remembered device of it too.
pub fn context_gone(ctx: usize) {
    LAST.with(|l| {
        if l.get().0 == ctx {
            l.set((0, None));
        }
    });
}

#[allow(clippy::too_many_arguments)]
pub fn kernel(
    call: &impl Fn() -> CUresult,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shmem: c_uint,
    stream: CUstream,
    _params: Args,
    _extra: Args,
) -> CUresult {
    launched(
        || kernel_launch(f, [gx, gy, gz], [bx, by, bz], stream, false),
        call,
    )
}

#[allow(clippy::too_many_arguments)]
pub fn kernel_ptsz(
    call: &impl Fn() -> CUresult,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shmem: c_uint,
    stream: CUstream,
    _params: Args,
    _extra: Args,
) -> CUresult {
    launched(
        || kernel_launch(f, [gx, gy, gz], [bx, by, bz], stream, true),
        call,
    )
}

/// A NULL config is the driver's to reject; it is passed straight through.
fn config_launch(
    config: In<LaunchConfig>,
    f: CUfunction,
    per_thread: bool,
) -> impl FnOnce() -> Launch {
    move || match config.get() {
        Some(c) => kernel_launch(f, c.grid, c.block, c.stream, per_thread),
        None => kernel_launch(f, [0; 3], [0; 3], std::ptr::null_mut(), per_thread),
    }
}

pub fn kernel_ex(
    go: &impl Fn() -> CUresult,
    config: In<LaunchConfig>,
    f: CUfunction,
    _params: Args,
    _extra: Args,
) -> CUresult {
    if config.is_null() {
        return go();
    }
    launched(config_launch(config, f, false), go)
}

pub fn kernel_ex_ptsz(
    go: &impl Fn() -> CUresult,
    config: In<LaunchConfig>,
    f: CUfunction,
    _params: Args,
    _extra: Args,
) -> CUresult {
    if config.is_null() {
        return go();
    }
    launched(config_launch(config, f, true), go)
}

#[allow(clippy::too_many_arguments)]
pub fn cooperative(
    call: &impl Fn() -> CUresult,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shmem: c_uint,
    stream: CUstream,
    _params: Args,
) -> CUresult {
    launched(
        || kernel_launch(f, [gx, gy, gz], [bx, by, bz], stream, false),
        call,
    )
}

#[allow(clippy::too_many_arguments)]
pub fn cooperative_ptsz(
    call: &impl Fn() -> CUresult,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shmem: c_uint,
    stream: CUstream,
    _params: Args,
) -> CUresult {
    launched(
        || kernel_launch(f, [gx, gy, gz], [bx, by, bz], stream, true),
        call,
    )
}

pub fn graph(exec: CUgraphExec, stream: CUstream) -> CUresult {
    launched(
        || graph_launch(exec, stream, false),
        || real::cuGraphLaunch(exec, stream),
    )
}

pub fn graph_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    launched(
        || graph_launch(exec, stream, true),
        || real::cuGraphLaunch_ptsz(exec, stream),
    )
}
