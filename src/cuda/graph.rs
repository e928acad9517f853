//! Graphs and stream capture. A graph's first cost estimate is computed
//! once, when it is instantiated, from its kernel nodes (the learned cost
//! of each kernel shape); event timing of its launches refines it, and
//! times it first when some shape was never seen. Launches recorded into a
//! capture are not charged: the graph's launches are.
#![forbid(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};

use super::real;
use super::sys::*;
use crate::ffi::Out;
use crate::limiter;

/// Nested child graphs deeper than this are timed rather than costed.
const MAX_DEPTH: u32 = 8;

/// Estimated GPU time of one launch of `graph`: the sum over its kernel
/// nodes of their learned costs (a serial bound; concurrent branches are
/// corrected by the controller and by timing). None when some kernel shape
/// was never timed: the graph is then timed before it runs on a guess.
pub fn cost(graph: CUgraph, depth: u32) -> Option<u64> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut n = 0usize;
    if !real::graph_nodes(graph, &mut [], &mut n).is_ok() {
        return None;
    }
    let mut nodes = vec![std::ptr::null_mut(); n];
    if n > 0 && !real::graph_nodes(graph, &mut nodes, &mut n).is_ok() {
        return None;
    }
    nodes.truncate(n);
    nodes
        .iter()
        .map(|&node| node_cost(node, depth))
        .try_fold(0u64, |acc, c| Some(acc.saturating_add(c?)))
}

fn node_cost(node: CUgraphNode, depth: u32) -> Option<u64> {
    let mut kind: c_int = -1;
    if !real::cuGraphNodeGetType(node, Out::from(&mut kind)).is_ok() {
        return None;
    }
    match kind {
        GRAPH_NODE_TYPE_KERNEL => {
            let mut p = KernelNodeParams::ZERO;
            if !real::cuGraphKernelNodeGetParams_v2(node, Out::from(&mut p)).is_ok() {
                return None;
            }
            let func = if p.func.is_null() { p.kern } else { p.func };
            limiter::kernel_cost(func as usize, p.grid, p.block)
        }
        GRAPH_NODE_TYPE_GRAPH => {
            let mut child: CUgraph = std::ptr::null_mut();
            if real::cuGraphChildGraphNodeGetGraph(node, Out::from(&mut child)).is_ok() {
                cost(child, depth + 1)
            } else {
                None
            }
        }
        _ => Some(0),
    }
}

fn instantiated(exec: Out<CUgraphExec>, graph: CUgraph, rc: CUresult) -> CUresult {
    if rc.is_ok()
        && let Some(e) = exec.get()
        && let Some(c) = cost(graph, 0).filter(|&c| c > 0)
    {
        limiter::graph_instantiated(e as usize, c);
    }
    rc
}

pub fn instantiate_with_flags(exec: Out<CUgraphExec>, graph: CUgraph, flags: u64) -> CUresult {
    instantiated(
        exec,
        graph,
        real::cuGraphInstantiateWithFlags(exec, graph, flags),
    )
}

pub fn instantiate_v2(
    call: &impl Fn() -> CUresult,
    exec: Out<CUgraphExec>,
    graph: CUgraph,
    _err: *mut CUgraphNode,
    _log: *mut c_char,
    _size: usize,
) -> CUresult {
    instantiated(exec, graph, call())
}

pub fn instantiate_v1(
    call: &impl Fn() -> CUresult,
    exec: Out<CUgraphExec>,
    graph: CUgraph,
    _err: *mut CUgraphNode,
    _log: *mut c_char,
    _size: usize,
) -> CUresult {
    instantiated(exec, graph, call())
}

pub fn instantiate_with_params(
    call: &impl Fn() -> CUresult,
    exec: Out<CUgraphExec>,
    graph: CUgraph,
    _params: *mut c_void,
) -> CUresult {
    instantiated(exec, graph, call())
}

pub fn instantiate_with_params_ptsz(
    call: &impl Fn() -> CUresult,
    exec: Out<CUgraphExec>,
    graph: CUgraph,
    _params: *mut c_void,
) -> CUresult {
    instantiated(exec, graph, call())
}

fn began(rc: CUresult) -> CUresult {
    if rc.is_ok() {
        limiter::capture_changed(1);
    }
    rc
}

/// A capture ends with its EndCapture call, whatever that returns.
fn ended(rc: CUresult) -> CUresult {
    limiter::capture_changed(-1);
    rc
}

pub fn begin_v1(stream: CUstream) -> CUresult {
    began(real::cuStreamBeginCapture(stream))
}

pub fn begin_v1_ptsz(stream: CUstream) -> CUresult {
    began(real::cuStreamBeginCapture_ptsz(stream))
}

pub fn begin_v2(stream: CUstream, mode: c_int) -> CUresult {
    began(real::cuStreamBeginCapture_v2(stream, mode))
}

pub fn begin_v2_ptsz(stream: CUstream, mode: c_int) -> CUresult {
    began(real::cuStreamBeginCapture_v2_ptsz(stream, mode))
}

pub fn begin_to_graph(
    call: &impl Fn() -> CUresult,
    _stream: CUstream,
    _graph: CUgraph,
    _deps: *const CUgraphNode,
    _data: *const c_void,
    _n: usize,
    _mode: c_int,
) -> CUresult {
    began(call())
}

pub fn begin_to_graph_ptsz(
    call: &impl Fn() -> CUresult,
    _stream: CUstream,
    _graph: CUgraph,
    _deps: *const CUgraphNode,
    _data: *const c_void,
    _n: usize,
    _mode: c_int,
) -> CUresult {
    began(call())
}

pub fn end(stream: CUstream, graph: Out<CUgraph>) -> CUresult {
    ended(real::cuStreamEndCapture(stream, graph))
}

pub fn end_ptsz(stream: CUstream, graph: Out<CUgraph>) -> CUresult {
    ended(real::cuStreamEndCapture_ptsz(stream, graph))
}
