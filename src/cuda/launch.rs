//! The launch families, each through the compute bucket: kernels, `Ex`,
//! cooperative kernels and graphs, with their per-thread-stream variants.
#![forbid(unsafe_code)]

use std::ffi::{c_uint, c_void};

use super::exports::real;
use super::sys::*;
use crate::ffi::get;
use crate::limiter::{self, Launch};

type Args = *mut *mut c_void;

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
    limiter::around(
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
    limiter::around(
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
    limiter::around(config_launch(config, f, false), go)
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
    limiter::around(config_launch(config, f, true), go)
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
    limiter::around(
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
    limiter::around(
        || Launch::kernel(f, [gx, gy, gz], [bx, by, bz], stream, true),
        || real::cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params),
    )
}

pub fn graph(exec: CUgraphExec, stream: CUstream) -> CUresult {
    limiter::around(
        || Launch::graph(exec, stream, false),
        || real::cuGraphLaunch(exec, stream),
    )
}

pub fn graph_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    limiter::around(
        || Launch::graph(exec, stream, true),
        || real::cuGraphLaunch_ptsz(exec, stream),
    )
}
