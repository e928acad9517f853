//! Driver functions vgpu calls but does not hook.

use std::ffi::{c_int, c_uint};

use super::sys::*;
use crate::interpose::real::Lib;

crate::interpose::table::reals! {
    lib: Lib::Cuda;
    fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult;
    fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult;
    fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult;
    fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult;
    fn cuDeviceGetAttribute(value: *mut c_int, attr: c_int, dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CUresult;
    fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult;
    fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult;
    fn cuEventQuery(event: CUevent) -> CUresult;
    fn cuEventSynchronize(event: CUevent) -> CUresult;
    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult;
    fn cuEventDestroy_v2(event: CUevent) -> CUresult;
    fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CUresult;
    fn cuStreamQuery(stream: CUstream) -> CUresult;
    fn cuGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) -> CUresult;
    fn cuGraphNodeGetType(node: CUgraphNode, kind: *mut c_int) -> CUresult;
    fn cuGraphKernelNodeGetParams_v2(node: CUgraphNode, params: *mut KernelNodeParams) -> CUresult;
    fn cuGraphChildGraphNodeGetGraph(node: CUgraphNode, graph: *mut CUgraph) -> CUresult;
}

/// Calls a real driver function that the driver may lack.
macro_rules! call {
    ($f:ident ( $($a:expr),* $(,)? )) => {
        match $crate::cuda::driver::$f() {
            // SAFETY: arguments follow the declared C signature of $f.
            Some(f) => unsafe { f($($a),*) },
            None => $crate::cuda::sys::CUresult::ERROR_NOT_FOUND,
        }
    };
}
pub(crate) use call;

/// The current context, if any.
pub fn current_context() -> Option<CUcontext> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    call!(cuCtxGetCurrent(&mut ctx))
        .is_ok()
        .then_some(ctx)
        .filter(|c| !c.is_null())
}

/// The ordinal of the current context's device.
pub fn current_ordinal() -> Option<CUdevice> {
    let mut dev: CUdevice = -1;
    call!(cuCtxGetDevice(&mut dev)).is_ok().then_some(dev)
}

/// Whether the primary context of `dev` is still alive.
pub fn primary_active(dev: CUdevice) -> bool {
    let (mut flags, mut active) = (0, 0);
    call!(cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active)).is_ok() && active != 0
}
