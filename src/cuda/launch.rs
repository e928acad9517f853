//! The launch families, each through the compute bucket: kernels, `Ex`,
//! cooperative kernels and graphs, with their per-thread-stream variants.

use std::ffi::{c_uint, c_void};

use super::sys::*;
use crate::ffi::get;
use crate::interpose::real::Lib;
use crate::limiter::{self, Launch};

type Args = *mut *mut c_void;

crate::interpose::table::hooks! {
    lib: Lib::Cuda, missing: CUresult::ERROR_NOT_FOUND;
    fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args, extra: Args) -> CUresult => kernel;
    fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args, extra: Args) -> CUresult => kernel_ptsz;
    fn cuLaunchKernelEx(config: *const LaunchConfig, f: CUfunction, params: Args, extra: Args) -> CUresult => kernel_ex;
    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: CUfunction, params: Args, extra: Args) -> CUresult => kernel_ex_ptsz;
    fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args) -> CUresult => cooperative;
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args) -> CUresult => cooperative_ptsz;
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult => graph;
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult => graph_ptsz;
}

macro_rules! real_call {
    ($f:ident ( $($a:expr),* $(,)? )) => {
        match real::$f() {
            // SAFETY: the program's arguments pass through unchanged.
            Some(f) => unsafe { f($($a),*) },
            None => CUresult::ERROR_NOT_FOUND,
        }
    };
}

#[allow(clippy::too_many_arguments)]
fn kernel(
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
        || {
            real_call!(cuLaunchKernel(
                f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra
            ))
        },
    )
}

#[allow(clippy::too_many_arguments)]
fn kernel_ptsz(
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
        || {
            real_call!(cuLaunchKernel_ptsz(
                f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra
            ))
        },
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

fn kernel_ex(config: *const LaunchConfig, f: CUfunction, params: Args, extra: Args) -> CUresult {
    let go = || real_call!(cuLaunchKernelEx(config, f, params, extra));
    if config.is_null() {
        return go();
    }
    limiter::around(config_launch(config, f, false), go)
}

fn kernel_ex_ptsz(
    config: *const LaunchConfig,
    f: CUfunction,
    params: Args,
    extra: Args,
) -> CUresult {
    let go = || real_call!(cuLaunchKernelEx_ptsz(config, f, params, extra));
    if config.is_null() {
        return go();
    }
    limiter::around(config_launch(config, f, true), go)
}

#[allow(clippy::too_many_arguments)]
fn cooperative(
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
        || {
            real_call!(cuLaunchCooperativeKernel(
                f, gx, gy, gz, bx, by, bz, shmem, stream, params
            ))
        },
    )
}

#[allow(clippy::too_many_arguments)]
fn cooperative_ptsz(
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
        || {
            real_call!(cuLaunchCooperativeKernel_ptsz(
                f, gx, gy, gz, bx, by, bz, shmem, stream, params
            ))
        },
    )
}

fn graph(exec: CUgraphExec, stream: CUstream) -> CUresult {
    limiter::around(
        || Launch::graph(exec, stream, false),
        || real_call!(cuGraphLaunch(exec, stream)),
    )
}

fn graph_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    limiter::around(
        || Launch::graph(exec, stream, true),
        || real_call!(cuGraphLaunch_ptsz(exec, stream)),
    )
}
