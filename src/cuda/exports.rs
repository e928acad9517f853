//! The exported CUDA hooks, one line per symbol: its C signature and the
//! function that translates it into vgpu's calls. `hooks!` makes each an
//! exported C function and a table entry for `dlsym` and
//! `cuGetProcAddress`, falling back to its real function (`real.rs`).
//!
//! This file is the CUDA side's FFI edge (with `sys.rs` and `real.rs`);
//! the handlers hold no `unsafe` code: they get the program's pointers as
//! `In`/`Out`, and, marked `[real]`, the real call itself (`hooks!`).

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_void};

use super::real;
use super::sys::*;
use super::{context, graph, info, launch, memory, proc_address, wake};
use crate::interpose::real::Lib;

type Args = *mut *mut c_void;

crate::interpose::table::hooks! {
    lib: Lib::Cuda, missing: CUresult::ERROR_NOT_FOUND, real: real, enter: crate::oversub::enter;
    // memory: every allocation family and its frees
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult => memory::alloc;
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) -> CUresult => memory::alloc_pitch;
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CUresult => memory::alloc_managed;
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult => memory::alloc_async;
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult => memory::alloc_async_ptsz;
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult => memory::alloc_from_pool;
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult => memory::alloc_from_pool_ptsz;
    fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult => memory::free;
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult => memory::free_async;
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult => memory::free_async_ptsz;
    fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, dptr: CUdeviceptr) -> CUresult => memory::address_range [real];
    fn cuIpcGetMemHandle(handle: *mut [u8; 64], dptr: CUdeviceptr) -> CUresult => memory::ipc_get_mem_handle [real];
    fn cuIpcOpenMemHandle_v2(dptr: *mut CUdeviceptr, handle: IpcMemHandle, flags: c_uint) -> CUresult => memory::ipc_open_mem_handle [real];
    fn cuIpcOpenMemHandle(dptr: *mut CUdeviceptr, handle: IpcMemHandle, flags: c_uint) -> CUresult => memory::ipc_open_mem_handle [real];
    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult => memory::ipc_close_mem_handle [real];
    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) -> CUresult => memory::pointer_attribute [real];
    fn cuPointerGetAttributes(count: c_uint, attributes: *const c_int, data: *mut *mut c_void, ptr: CUdeviceptr) -> CUresult => memory::pointer_attributes [real];
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const MemAllocationProp, flags: u64) -> CUresult => memory::vmm_create [real];
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult => memory::vmm_release;
    fn cuArrayCreate_v2(array: *mut CUarray, desc: *const ArrayDescriptor) -> CUresult => memory::array_create;
    fn cuArray3DCreate_v2(array: *mut CUarray, desc: *const Array3dDescriptor) -> CUresult => memory::array3d_create;
    fn cuArrayDestroy(array: CUarray) -> CUresult => memory::array_destroy;
    fn cuMipmappedArrayCreate(array: *mut CUmipmappedArray, desc: *const Array3dDescriptor, levels: c_uint) -> CUresult => memory::mipmap_create;
    fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult => memory::mipmap_destroy;
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const MemPoolProps) -> CUresult => memory::pool_create [real];
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult => memory::pool_destroy;
    // context: creation, destruction, primary-context retain/release/reset
    fn cuCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult => context::create_v2;
    fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut c_void, n: c_int, flags: c_uint, dev: CUdevice) -> CUresult => context::create_v3 [real];
    fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult => context::create_v4 [real];
    fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult => context::destroy;
    fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult => context::primary_retain;
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult => context::primary_release_v2;
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult => context::primary_release_v1;
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult => context::primary_reset_v2;
    fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult => context::primary_reset_v1;
    // info: cuInit and the virtual view of memory
    fn cuInit(flags: c_uint) -> CUresult => info::cu_init;
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult => info::mem_get_info;
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult => info::device_total_mem;
    // proc_address: the entry point cudart reaches everything through
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> CUresult => proc_address::get_proc_address [real];
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> CUresult => proc_address::get_proc_address_v2 [real];
    // launch: every launch family, through the compute bucket
    fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args, extra: Args) -> CUresult => launch::kernel [real], idle: crate::duty::none;
    fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args, extra: Args) -> CUresult => launch::kernel_ptsz [real], idle: crate::duty::none;
    fn cuLaunchKernelEx(config: *const LaunchConfig, f: CUfunction, params: Args, extra: Args) -> CUresult => launch::kernel_ex [real], idle: crate::duty::none;
    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: CUfunction, params: Args, extra: Args) -> CUresult => launch::kernel_ex_ptsz [real], idle: crate::duty::none;
    fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args) -> CUresult => launch::cooperative [real], idle: crate::duty::none;
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args) -> CUresult => launch::cooperative_ptsz [real], idle: crate::duty::none;
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult => launch::graph, idle: crate::duty::none;
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult => launch::graph_ptsz, idle: crate::duty::none;
    // graph: instantiation (cost) and stream capture
    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) -> CUresult => graph::instantiate_with_flags;
    fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, size: usize) -> CUresult => graph::instantiate_v2 [real];
    fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, size: usize) -> CUresult => graph::instantiate_v1 [real];
    fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) -> CUresult => graph::instantiate_with_params [real];
    fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) -> CUresult => graph::instantiate_with_params_ptsz [real];
    fn cuStreamBeginCapture(stream: CUstream) -> CUresult => graph::begin_v1;
    fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult => graph::begin_v1_ptsz;
    fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CUresult => graph::begin_v2;
    fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_int) -> CUresult => graph::begin_v2_ptsz;
    fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_int) -> CUresult => graph::begin_to_graph [real];
    fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_int) -> CUresult => graph::begin_to_graph_ptsz [real];
    fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult => graph::end;
    fn cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph) -> CUresult => graph::end_ptsz;
    // wake: synchronisation, copies, memsets and the current context, so
    // that a suspended process is restored before it enters the driver;
    // the synchronisations also tell the turns' probes when they returned
    fn cuCtxSynchronize() -> CUresult => wake::ctx_synchronize, idle: crate::duty::neither_oversub_nor_limit;
    fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult => wake::ctx_synchronize_v2, idle: crate::duty::neither_oversub_nor_limit;
    fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult => wake::ctx_get_current, idle: crate::duty::no_oversub;
    fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult => wake::ctx_set_current, idle: crate::duty::no_oversub;
    fn cuStreamSynchronize(stream: CUstream) -> CUresult => wake::stream_synchronize, idle: crate::duty::neither_oversub_nor_limit;
    fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult => wake::stream_synchronize_ptsz, idle: crate::duty::neither_oversub_nor_limit;
    fn cuEventSynchronize(event: CUevent) -> CUresult => wake::event_synchronize, idle: crate::duty::neither_oversub_nor_limit;
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult => wake::memcpy [real], idle: crate::duty::no_oversub;
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult => wake::memcpy_async [real], idle: crate::duty::no_oversub;
    fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult => wake::memcpy_async_ptsz [real], idle: crate::duty::no_oversub;
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult => wake::memcpy_htod [real], idle: crate::duty::no_oversub;
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult => wake::memcpy_dtoh [real], idle: crate::duty::no_oversub;
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult => wake::memcpy_dtod [real], idle: crate::duty::no_oversub;
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) -> CUresult => wake::memcpy_htod_async [real], idle: crate::duty::no_oversub;
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult => wake::memcpy_dtoh_async [real], idle: crate::duty::no_oversub;
    fn cuMemsetD8_v2(dst: CUdeviceptr, v: c_uchar, n: usize) -> CUresult => wake::memset_d8 [real], idle: crate::duty::no_oversub;
    fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult => wake::memset_d32 [real], idle: crate::duty::no_oversub;
    fn cuMemsetD8Async(dst: CUdeviceptr, v: c_uchar, n: usize, stream: CUstream) -> CUresult => wake::memset_d8_async [real], idle: crate::duty::no_oversub;
    fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, stream: CUstream) -> CUresult => wake::memset_d32_async [real], idle: crate::duty::no_oversub;
}
