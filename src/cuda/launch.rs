//! The launch families, each through the compute bucket: kernels, `Ex`,
//! cooperative kernels and graphs, with their per-thread-stream variants.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};

use vgpu_shm::EntryIndex;

use super::real;
use super::sys::*;
use super::{device, driver, events, probes};
use crate::attach::Attach;
use crate::ffi::get;
use crate::limiter::{self, estimate};
use crate::{hami, init, process};

type Args = *mut *mut c_void;

/// What a launch is, for the bucket and for timing.
#[derive(Clone, Copy)]
struct Launch {
    /// Its shape: the kernel and its grid, or the executable graph.
    key: u64,
    /// The stream as the event API names it (`CU_STREAM_PER_THREAD` for a
    /// `_ptsz` launch on the default stream).
    stream: CUstream,
}

impl Launch {
    fn kernel(
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

    fn graph(exec: CUgraphExec, stream: CUstream, per_thread: bool) -> Launch {
        Launch {
            key: estimate::graph_key(exec as usize),
            stream: event_stream(stream, per_thread),
        }
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
    limited(describe(), go)
}

fn limited(l: Launch, go: impl FnOnce() -> CUresult) -> CUresult {
    let capture = limiter::capturing();
    if capture && capturing(l.stream) {
        // Recorded into a graph, not run: the graph's launches pay.
        return go();
    }
    let Some((attach, dev)) = launch_device() else {
        return go();
    };
    if !limiter::enforced(dev) {
        return go();
    }
    let shape = limiter::shape(l.key);
    if shape.cost_ns() == 0 && !capture {
        // The second launch of a new shape does not run on a guess.
        events::wait_for(shape);
    }
    limiter::admit(attach, dev, shape);
    let (sample, probe) = if capture {
        (None, None)
    } else {
        // Finished probes are collected before the timing sample begins
        // (`probes::poll_if_due`); the sample asks whether the stream is
        // idle before the probe records its start event there.
        let in_turns = probes::poll_if_due(attach, dev);
        (
            events::begin(shape, l.stream, crate::clock::coarse_ns()),
            in_turns.and_then(|t| probes::before(t, dev, l.stream, limiter::cost_ns(shape))),
        )
    };
    let rc = go();
    if let Some(s) = sample {
        events::end(s, rc);
    }
    if let Some(p) = probe {
        probes::after(p, rc);
    }
    rc
}

fn capturing(stream: CUstream) -> bool {
    let mut status: c_int = 0;
    real::cuStreamIsCapturing(stream, &mut status).is_ok() && status != 0
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
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: Args,
    extra: Args,
) -> CUresult {
    launched(
        || Launch::kernel(f, [gx, gy, gz], [bx, by, bz], stream, false),
        || real::cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra),
    )
}

#[allow(clippy::too_many_arguments)]
pub fn kernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: Args,
    extra: Args,
) -> CUresult {
    launched(
        || Launch::kernel(f, [gx, gy, gz], [bx, by, bz], stream, true),
        || real::cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra),
    )
}

/// A NULL config is the driver's to reject; it is passed straight through.
fn config_launch(
    config: *const LaunchConfig,
    f: CUfunction,
    per_thread: bool,
) -> impl FnOnce() -> Launch {
    move || match get(config) {
        Some(c) => Launch::kernel(f, c.grid, c.block, c.stream, per_thread),
        None => Launch::kernel(f, [0; 3], [0; 3], std::ptr::null_mut(), per_thread),
    }
}

pub fn kernel_ex(
    config: *const LaunchConfig,
    f: CUfunction,
    params: Args,
    extra: Args,
) -> CUresult {
    let go = || real::cuLaunchKernelEx(config, f, params, extra);
    if config.is_null() {
        return go();
    }
    launched(config_launch(config, f, false), go)
}

pub fn kernel_ex_ptsz(
    config: *const LaunchConfig,
    f: CUfunction,
    params: Args,
    extra: Args,
) -> CUresult {
    let go = || real::cuLaunchKernelEx_ptsz(config, f, params, extra);
    if config.is_null() {
        return go();
    }
    launched(config_launch(config, f, true), go)
}

#[allow(clippy::too_many_arguments)]
pub fn cooperative(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: Args,
) -> CUresult {
    launched(
        || Launch::kernel(f, [gx, gy, gz], [bx, by, bz], stream, false),
        || real::cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params),
    )
}

#[allow(clippy::too_many_arguments)]
pub fn cooperative_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    stream: CUstream,
    params: Args,
) -> CUresult {
    launched(
        || Launch::kernel(f, [gx, gy, gz], [bx, by, bz], stream, true),
        || real::cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params),
    )
}

pub fn graph(exec: CUgraphExec, stream: CUstream) -> CUresult {
    launched(
        || Launch::graph(exec, stream, false),
        || real::cuGraphLaunch(exec, stream),
    )
}

pub fn graph_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    launched(
        || Launch::graph(exec, stream, true),
        || real::cuGraphLaunch_ptsz(exec, stream),
    )
}
