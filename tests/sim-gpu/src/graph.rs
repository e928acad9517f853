//! The minimal graph path: build a graph of kernel nodes (explicitly or by
//! stream capture), instantiate it, launch it. A launch runs every kernel
//! node in order on the stream's device.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_int, c_uint, c_void};

use crate::cuda::current_device;
use crate::ffi::*;
use crate::launch::kernel_duration;
use crate::local::{KernelNode, local};
use crate::queue;

type Handle = *mut c_void;

/// `CUDA_KERNEL_NODE_PARAMS` (v1 layout; v2 appends fields we ignore).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParams {
    pub func: Handle,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shmem: c_uint,
    pub params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

pub const NODE_TYPE_KERNEL: c_int = 0;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(g: *mut Handle, _flags: c_uint) -> CUresult {
    let mut l = local();
    let id = l.new_id();
    l.graphs.insert(id, Vec::new());
    if put(g, id as Handle) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    node: *mut Handle,
    graph: Handle,
    _deps: *const Handle,
    _ndeps: usize,
    p: *const KernelNodeParams,
) -> CUresult {
    let Some(p) = get(p) else {
        return INVALID_VALUE;
    };
    let (_, dev) = match current_device() {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    let mut l = local();
    let Some(dur) = kernel_duration(&l, p.func as usize, p.grid, p.params, dev) else {
        return INVALID_VALUE;
    };
    if !l.graphs.contains_key(&(graph as usize)) {
        return INVALID_VALUE;
    }
    let id = l.new_id();
    l.nodes.insert(
        id,
        KernelNode {
            func: p.func as usize,
            grid: p.grid,
            block: p.block,
            dur,
        },
    );
    l.graphs.entry(graph as usize).or_default().push(id);
    put(node, id as Handle);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    node: *mut Handle,
    graph: Handle,
    deps: *const Handle,
    ndeps: usize,
    p: *const KernelNodeParams,
) -> CUresult {
    // SAFETY: the v1 params are a prefix of the v2 layout.
    unsafe { cuGraphAddKernelNode_v2(node, graph, deps, ndeps, p) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: Handle,
    nodes: *mut Handle,
    count: *mut usize,
) -> CUresult {
    let l = local();
    let Some(list) = l.graphs.get(&(graph as usize)) else {
        return INVALID_VALUE;
    };
    if nodes.is_null() {
        return if put(count, list.len()) {
            SUCCESS
        } else {
            INVALID_VALUE
        };
    }
    let Some(cap) = get(count) else {
        return INVALID_VALUE;
    };
    for (i, &n) in list.iter().take(cap).enumerate() {
        put_at(nodes, i, n as Handle);
    }
    put(count, list.len().min(cap));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetType(node: Handle, t: *mut c_int) -> CUresult {
    if !local().nodes.contains_key(&(node as usize)) {
        return INVALID_VALUE;
    }
    if put(t, NODE_TYPE_KERNEL) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams_v2(
    node: Handle,
    out: *mut KernelNodeParams,
) -> CUresult {
    let l = local();
    let Some(n) = l.nodes.get(&(node as usize)) else {
        return INVALID_VALUE;
    };
    let p = KernelNodeParams {
        func: n.func as Handle,
        grid: n.grid,
        block: n.block,
        shmem: 0,
        params: std::ptr::null_mut(),
        extra: std::ptr::null_mut(),
    };
    if put(out, p) { SUCCESS } else { INVALID_VALUE }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams(
    node: Handle,
    out: *mut KernelNodeParams,
) -> CUresult {
    // SAFETY: same contract; the v1 struct is a prefix of v2.
    unsafe { cuGraphKernelNodeGetParams_v2(node, out) }
}

fn instantiate(exec: *mut Handle, graph: Handle) -> CUresult {
    let (_, dev) = match current_device() {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    let mut l = local();
    let Some(list) = l.graphs.get(&(graph as usize)) else {
        return INVALID_VALUE;
    };
    let nodes: Vec<KernelNode> = list
        .iter()
        .filter_map(|n| l.nodes.get(n).cloned())
        .collect();
    let id = l.new_id();
    l.execs.insert(id, (dev, nodes));
    if put(exec, id as Handle) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut Handle,
    graph: Handle,
    _f: u64,
) -> CUresult {
    instantiate(exec, graph)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut Handle,
    graph: Handle,
    _err: *mut Handle,
    _log: *mut std::ffi::c_char,
    _n: usize,
) -> CUresult {
    instantiate(exec, graph)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut Handle,
    graph: Handle,
    _err: *mut Handle,
    _log: *mut std::ffi::c_char,
    _n: usize,
) -> CUresult {
    instantiate(exec, graph)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut Handle,
    graph: Handle,
    _p: *mut c_void,
) -> CUresult {
    instantiate(exec, graph)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut Handle,
    graph: Handle,
    p: *mut c_void,
) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuGraphInstantiateWithParams(exec, graph, p) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: Handle, stream: Handle) -> CUresult {
    let (ctx, _) = match current_device() {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    let mut l = local();
    let Some((dev, nodes)) = l.execs.get(&(exec as usize)).cloned() else {
        return INVALID_VALUE;
    };
    let s = l.resolve_stream(stream as usize, ctx);
    if !l.streams.contains_key(&s) {
        return INVALID_HANDLE;
    }
    for n in &nodes {
        let (seq, old) = queue::push(dev, n.dur);
        l.harvest(dev, old);
        if let Some(st) = l.streams.get_mut(&s) {
            st.last_seq = seq;
        }
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: Handle, stream: Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuGraphLaunch(exec, stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphUpload(exec: Handle, _s: Handle) -> CUresult {
    if local().execs.contains_key(&(exec as usize)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphUpload_ptsz(exec: Handle, s: Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuGraphUpload(exec, s) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: Handle) -> CUresult {
    if local().execs.remove(&(exec as usize)).is_some() {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphDestroy(graph: Handle) -> CUresult {
    let mut l = local();
    match l.graphs.remove(&(graph as usize)) {
        Some(nodes) => {
            for n in nodes {
                l.nodes.remove(&n);
            }
            SUCCESS
        }
        None => INVALID_VALUE,
    }
}

// ---- stream capture ----------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: Handle, _mode: c_int) -> CUresult {
    let (ctx, _) = match current_device() {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    let mut l = local();
    let s = l.resolve_stream(stream as usize, ctx);
    let g = l.new_id();
    l.graphs.insert(g, Vec::new());
    match l.streams.get_mut(&s) {
        Some(st) if st.capture.is_none() => {
            st.capture = Some(g);
            SUCCESS
        }
        Some(_) => INVALID_VALUE,
        None => INVALID_HANDLE,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(stream: Handle, mode: c_int) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuStreamBeginCapture_v2(stream, mode) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture(stream: Handle) -> CUresult {
    // SAFETY: the v1 form is the v2 form in global mode.
    unsafe { cuStreamBeginCapture_v2(stream, 0) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCapture_ptsz(stream: Handle) -> CUresult {
    // SAFETY: as above.
    unsafe { cuStreamBeginCapture_v2(stream, 0) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(stream: Handle, graph: *mut Handle) -> CUresult {
    let (ctx, _) = match current_device() {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    let mut l = local();
    let s = l.resolve_stream(stream as usize, ctx);
    let Some(g) = l.streams.get_mut(&s).and_then(|st| st.capture.take()) else {
        return INVALID_VALUE;
    };
    put(graph, g as Handle);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(stream: Handle, graph: *mut Handle) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuStreamEndCapture(stream, graph) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: Handle, status: *mut c_int) -> CUresult {
    let (ctx, _) = match current_device() {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    let l = local();
    let s = l.resolve_stream(stream as usize, ctx);
    let Some(st) = l.streams.get(&s) else {
        return INVALID_HANDLE;
    };
    if put(status, c_int::from(st.capture.is_some())) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(stream: Handle, status: *mut c_int) -> CUresult {
    // SAFETY: same contract as the legacy-stream entry point.
    unsafe { cuStreamIsCapturing(stream, status) }
}
