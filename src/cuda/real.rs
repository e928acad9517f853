//! Every real CUDA driver function vgpu calls, typed: the hooked ones
//! (`exports.rs`) and those it only calls itself (`driver.rs`, `events`,
//! `graph`). `reals!` makes each a lazily resolved slot and a function
//! `real::name(args) -> CUresult` that answers `CUDA_ERROR_NOT_FOUND`
//! when the driver lacks the symbol. Resolved with libc's own `dlsym`,
//! never through our hooks.

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_void};

use super::sys::*;
use crate::interpose::real::Lib;

type Args = *mut *mut c_void;

crate::interpose::reals::reals! {
    lib: Lib::Cuda, missing: CUresult::ERROR_NOT_FOUND;
    // memory: every allocation family and its frees
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult;
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) -> CUresult;
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CUresult;
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult;
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult;
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult;
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult;
    fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult;
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult;
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const MemAllocationProp, flags: u64) -> CUresult;
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult;
    fn cuArrayCreate_v2(array: *mut CUarray, desc: *const ArrayDescriptor) -> CUresult;
    fn cuArray3DCreate_v2(array: *mut CUarray, desc: *const Array3dDescriptor) -> CUresult;
    fn cuArrayDestroy(array: CUarray) -> CUresult;
    fn cuMipmappedArrayCreate(array: *mut CUmipmappedArray, desc: *const Array3dDescriptor, levels: c_uint) -> CUresult;
    fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult;
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const MemPoolProps) -> CUresult;
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult;
    // context: creation, destruction, primary-context retain/release/reset
    fn cuCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult;
    fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut c_void, n: c_int, flags: c_uint, dev: CUdevice) -> CUresult;
    fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult;
    fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult;
    fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult;
    // info: cuInit and the virtual view of memory
    fn cuInit(flags: c_uint) -> CUresult;
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult;
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult;
    // proc_address: the entry point cudart reaches everything through
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> CUresult;
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> CUresult;
    // launch: every launch family, through the compute bucket
    fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args, extra: Args) -> CUresult;
    fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args, extra: Args) -> CUresult;
    fn cuLaunchKernelEx(config: *const LaunchConfig, f: CUfunction, params: Args, extra: Args) -> CUresult;
    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: CUfunction, params: Args, extra: Args) -> CUresult;
    fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args) -> CUresult;
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args) -> CUresult;
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult;
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult;
    // graph: instantiation (cost) and stream capture
    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) -> CUresult;
    fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, size: usize) -> CUresult;
    fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, size: usize) -> CUresult;
    fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) -> CUresult;
    fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) -> CUresult;
    fn cuStreamBeginCapture(stream: CUstream) -> CUresult;
    fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult;
    fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CUresult;
    fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_int) -> CUresult;
    fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_int) -> CUresult;
    fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_int) -> CUresult;
    fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult;
    fn cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph) -> CUresult;
    // wake: calls that restore a suspended process (oversub), passed through
    // (synchronisations noted for the turns' probes)
    fn cuCtxSynchronize() -> CUresult;
    fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult;
    fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult;
    fn cuStreamSynchronize(stream: CUstream) -> CUresult;
    fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult;
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult;
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult;
    fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult;
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult;
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult;
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult;
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) -> CUresult;
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult;
    fn cuMemsetD8_v2(dst: CUdeviceptr, v: c_uchar, n: usize) -> CUresult;
    fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult;
    fn cuMemsetD8Async(dst: CUdeviceptr, v: c_uchar, n: usize, stream: CUstream) -> CUresult;
    fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, stream: CUstream) -> CUresult;
    // checkpoint: a process suspending and restoring itself (oversub)
    fn cuCheckpointProcessLock(pid: c_int, args: *mut CheckpointLockArgs) -> CUresult;
    fn cuCheckpointProcessCheckpoint(pid: c_int, args: *mut c_void) -> CUresult;
    fn cuCheckpointProcessRestore(pid: c_int, args: *mut c_void) -> CUresult;
    fn cuCheckpointProcessUnlock(pid: c_int, args: *mut c_void) -> CUresult;
    fn cuCheckpointProcessGetState(pid: c_int, state: *mut c_int) -> CUresult;
    // called, not hooked
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
