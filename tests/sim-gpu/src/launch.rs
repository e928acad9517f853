//! The simulated CUDA driver API: modules and kernel launches.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_char, c_uint, c_void};
use std::sync::atomic::Ordering;

use crate::cuda::*;
use crate::ffi::*;
use crate::local::*;
use crate::queue;
use crate::state::shared;
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
    let ns = match name.as_str() {
        "vgpu_spin" => kernel_arg_u64(params, 0).unwrap_or(0).saturating_mul(waves),
        "vgpu_empty" => 100,
        _ => d.block_ns.load(Ordering::Relaxed).saturating_mul(waves),
    };
    // As the device's wandering clock and this launch's jitter take it; a
    // year at most: the scheduler's clock must not overflow.
    let ns = crate::state::wandered(ns, crate::state::now_ns());
    Some(crate::state::jittered(ns).min(MAX_KERNEL_NS))
}

const MAX_KERNEL_NS: u64 = 365 * 86_400 * 1_000_000_000;

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
    if !l.streams.contains_key(&s) {
        return INVALID_HANDLE;
    }
    let (seq, old) = queue::push(dev, dur);
    l.harvest(dev, old);
    if let Some(st) = l.streams.get_mut(&s) {
        st.last_seq = seq;
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
