//! `cuGetProcAddress` and `cuGetProcAddress_v2`, resolving (symbol, CUDA
//! version, flags) the way the real driver does: each base name has a list
//! of ABI versions, each introduced in some CUDA release, and separate
//! per-thread-default-stream variants (`_ptsz`/`_ptds`) for calls that take
//! or imply a stream. `tests/proc_address.rs` checks this against the table
//! recorded from the real driver on an H200 (tests/data/proc_address_table.csv).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::ffi::*;

/// The CUDA version this driver implements.
pub const DRIVER_VERSION: c_int = 13000;

const FLAG_PER_THREAD: u64 = 2;
const STATUS_FOUND: c_int = 0;
const STATUS_NOT_FOUND: c_int = 1;
const STATUS_VERSION_INSUFFICIENT: c_int = 2;

/// (introduced in, exported name), oldest first.
type Versions = &'static [(c_int, &'static str)];

/// Base name, legacy-stream versions, per-thread-stream versions (empty when
/// the call has no stream semantics and both flags resolve alike).
#[rustfmt::skip]
const TABLE: &[(&str, Versions, Versions)] = &[
    ("cuInit", &[(2000, "cuInit")], &[]),
    ("cuDriverGetVersion", &[(2020, "cuDriverGetVersion")], &[]),
    ("cuDeviceGet", &[(2000, "cuDeviceGet")], &[]),
    ("cuDeviceGetCount", &[(2000, "cuDeviceGetCount")], &[]),
    ("cuDeviceGetName", &[(2000, "cuDeviceGetName")], &[]),
    ("cuDeviceTotalMem", &[(2000, "cuDeviceTotalMem"), (3020, "cuDeviceTotalMem_v2")], &[]),
    ("cuDeviceGetUuid", &[(9020, "cuDeviceGetUuid"), (11040, "cuDeviceGetUuid_v2")], &[]),
    ("cuDeviceGetAttribute", &[(2000, "cuDeviceGetAttribute")], &[]),
    ("cuDeviceGetMemPool", &[(11020, "cuDeviceGetMemPool")], &[]),
    ("cuDeviceGetDefaultMemPool", &[(11020, "cuDeviceGetDefaultMemPool")], &[]),
    ("cuCtxCreate", &[(2000, "cuCtxCreate"), (3020, "cuCtxCreate_v2"), (11040, "cuCtxCreate_v3"), (12050, "cuCtxCreate_v4")], &[]),
    ("cuCtxDestroy", &[(2000, "cuCtxDestroy"), (4000, "cuCtxDestroy_v2")], &[]),
    ("cuCtxGetCurrent", &[(4000, "cuCtxGetCurrent")], &[]),
    ("cuCtxSetCurrent", &[(4000, "cuCtxSetCurrent")], &[]),
    ("cuCtxPushCurrent", &[(2000, "cuCtxPushCurrent"), (4000, "cuCtxPushCurrent_v2")], &[]),
    ("cuCtxPopCurrent", &[(2000, "cuCtxPopCurrent"), (4000, "cuCtxPopCurrent_v2")], &[]),
    ("cuCtxSynchronize", &[(2000, "cuCtxSynchronize"), (13000, "cuCtxSynchronize_v2")], &[]),
    ("cuCtxGetDevice", &[(2000, "cuCtxGetDevice"), (13000, "cuCtxGetDevice_v2")], &[]),
    ("cuDevicePrimaryCtxRetain", &[(7000, "cuDevicePrimaryCtxRetain")], &[]),
    ("cuDevicePrimaryCtxRelease", &[(7000, "cuDevicePrimaryCtxRelease"), (11000, "cuDevicePrimaryCtxRelease_v2")], &[]),
    ("cuDevicePrimaryCtxReset", &[(7000, "cuDevicePrimaryCtxReset"), (11000, "cuDevicePrimaryCtxReset_v2")], &[]),
    ("cuDevicePrimaryCtxSetFlags", &[(7000, "cuDevicePrimaryCtxSetFlags"), (11000, "cuDevicePrimaryCtxSetFlags_v2")], &[]),
    ("cuDevicePrimaryCtxGetState", &[(7000, "cuDevicePrimaryCtxGetState")], &[]),
    ("cuMemAlloc", &[(2000, "cuMemAlloc"), (3020, "cuMemAlloc_v2")], &[]),
    ("cuMemAllocPitch", &[(2000, "cuMemAllocPitch"), (3020, "cuMemAllocPitch_v2")], &[]),
    ("cuMemAllocManaged", &[(6000, "cuMemAllocManaged")], &[]),
    ("cuMemAllocAsync", &[(11020, "cuMemAllocAsync")], &[(11020, "cuMemAllocAsync_ptsz")]),
    ("cuMemAllocFromPoolAsync", &[(11020, "cuMemAllocFromPoolAsync")], &[(11020, "cuMemAllocFromPoolAsync_ptsz")]),
    ("cuMemFree", &[(2000, "cuMemFree"), (3020, "cuMemFree_v2")], &[]),
    ("cuMemFreeAsync", &[(11020, "cuMemFreeAsync")], &[(11020, "cuMemFreeAsync_ptsz")]),
    ("cuMemCreate", &[(10020, "cuMemCreate")], &[]),
    ("cuMemRelease", &[(10020, "cuMemRelease")], &[]),
    ("cuMemAddressReserve", &[(10020, "cuMemAddressReserve")], &[]),
    ("cuMemAddressFree", &[(10020, "cuMemAddressFree")], &[]),
    ("cuMemMap", &[(10020, "cuMemMap")], &[]),
    ("cuMemUnmap", &[(10020, "cuMemUnmap")], &[]),
    ("cuMemSetAccess", &[(10020, "cuMemSetAccess")], &[]),
    ("cuMemGetAccess", &[(10020, "cuMemGetAccess")], &[]),
    ("cuDeviceCanAccessPeer", &[(4000, "cuDeviceCanAccessPeer")], &[]),
    ("cuMemGetAllocationGranularity", &[(10020, "cuMemGetAllocationGranularity")], &[]),
    ("cuArrayCreate", &[(2000, "cuArrayCreate"), (3020, "cuArrayCreate_v2")], &[]),
    ("cuArray3DCreate", &[(2000, "cuArray3DCreate"), (3020, "cuArray3DCreate_v2")], &[]),
    ("cuArrayDestroy", &[(2000, "cuArrayDestroy")], &[]),
    ("cuMipmappedArrayCreate", &[(5000, "cuMipmappedArrayCreate")], &[]),
    ("cuMipmappedArrayDestroy", &[(5000, "cuMipmappedArrayDestroy")], &[]),
    ("cuMemGetInfo", &[(2000, "cuMemGetInfo"), (3020, "cuMemGetInfo_v2")], &[]),
    ("cuMemPoolCreate", &[(11020, "cuMemPoolCreate")], &[]),
    ("cuMemPoolDestroy", &[(11020, "cuMemPoolDestroy")], &[]),
    ("cuMemPoolTrimTo", &[(11020, "cuMemPoolTrimTo")], &[]),
    ("cuMemHostAlloc", &[(2020, "cuMemHostAlloc")], &[]),
    ("cuMemcpy", &[(4000, "cuMemcpy")], &[(7000, "cuMemcpy_ptds")]),
    ("cuMemcpyHtoD", &[(2000, "cuMemcpyHtoD"), (3020, "cuMemcpyHtoD_v2")], &[(7000, "cuMemcpyHtoD_v2_ptds")]),
    ("cuMemcpyDtoH", &[(2000, "cuMemcpyDtoH"), (3020, "cuMemcpyDtoH_v2")], &[(7000, "cuMemcpyDtoH_v2_ptds")]),
    ("cuMemcpyAsync", &[(4000, "cuMemcpyAsync")], &[(7000, "cuMemcpyAsync_ptsz")]),
    ("cuMemcpyHtoDAsync", &[(2000, "cuMemcpyHtoDAsync"), (3020, "cuMemcpyHtoDAsync_v2")], &[(7000, "cuMemcpyHtoDAsync_v2_ptsz")]),
    ("cuMemsetD8", &[(2000, "cuMemsetD8"), (3020, "cuMemsetD8_v2")], &[(7000, "cuMemsetD8_v2_ptds")]),
    ("cuMemsetD32Async", &[(3020, "cuMemsetD32Async")], &[(7000, "cuMemsetD32Async_ptsz")]),
    ("cuMemPrefetchAsync", &[(8000, "cuMemPrefetchAsync"), (12020, "cuMemPrefetchAsync_v2")], &[(8000, "cuMemPrefetchAsync_ptsz"), (12020, "cuMemPrefetchAsync_v2_ptsz")]),
    ("cuMemAdvise", &[(8000, "cuMemAdvise"), (12020, "cuMemAdvise_v2")], &[]),
    ("cuIpcGetMemHandle", &[(4010, "cuIpcGetMemHandle")], &[]),
    ("cuIpcOpenMemHandle", &[(4010, "cuIpcOpenMemHandle"), (11000, "cuIpcOpenMemHandle_v2")], &[]),
    ("cuIpcCloseMemHandle", &[(4010, "cuIpcCloseMemHandle")], &[]),
    ("cuMemExportToShareableHandle", &[(10020, "cuMemExportToShareableHandle")], &[]),
    ("cuMemImportFromShareableHandle", &[(10020, "cuMemImportFromShareableHandle")], &[]),
    ("cuPointerGetAttribute", &[(4000, "cuPointerGetAttribute")], &[]),
    ("cuPointerGetAttributes", &[(7000, "cuPointerGetAttributes")], &[]),
    ("cuMemGetAddressRange", &[(2000, "cuMemGetAddressRange"), (3020, "cuMemGetAddressRange_v2")], &[]),
    ("cuMemHostRegister", &[(4000, "cuMemHostRegister"), (6050, "cuMemHostRegister_v2")], &[]),
    ("cuLaunchKernel", &[(4000, "cuLaunchKernel")], &[(7000, "cuLaunchKernel_ptsz")]),
    ("cuLaunchKernelEx", &[(11060, "cuLaunchKernelEx")], &[(11060, "cuLaunchKernelEx_ptsz")]),
    ("cuLaunchCooperativeKernel", &[(9000, "cuLaunchCooperativeKernel")], &[(9000, "cuLaunchCooperativeKernel_ptsz")]),
    ("cuLaunchHostFunc", &[(10000, "cuLaunchHostFunc")], &[(10000, "cuLaunchHostFunc_ptsz")]),
    ("cuGraphLaunch", &[(10000, "cuGraphLaunch")], &[(10000, "cuGraphLaunch_ptsz")]),
    ("cuGraphInstantiate", &[(10000, "cuGraphInstantiate"), (11000, "cuGraphInstantiate_v2")], &[]),
    ("cuGraphInstantiateWithFlags", &[(11040, "cuGraphInstantiateWithFlags")], &[]),
    ("cuGraphInstantiateWithParams", &[(12000, "cuGraphInstantiateWithParams")], &[(12000, "cuGraphInstantiateWithParams_ptsz")]),
    ("cuGraphCreate", &[(10000, "cuGraphCreate")], &[]),
    ("cuGraphAddKernelNode", &[(10000, "cuGraphAddKernelNode"), (12000, "cuGraphAddKernelNode_v2")], &[]),
    ("cuGraphExecDestroy", &[(10000, "cuGraphExecDestroy")], &[]),
    ("cuGraphDestroy", &[(10000, "cuGraphDestroy")], &[]),
    ("cuGraphUpload", &[(11010, "cuGraphUpload")], &[(11010, "cuGraphUpload_ptsz")]),
    ("cuGraphGetNodes", &[(10000, "cuGraphGetNodes")], &[]),
    ("cuGraphNodeGetType", &[(10000, "cuGraphNodeGetType")], &[]),
    ("cuGraphKernelNodeGetParams", &[(10000, "cuGraphKernelNodeGetParams"), (12000, "cuGraphKernelNodeGetParams_v2")], &[]),
    ("cuStreamCreate", &[(2000, "cuStreamCreate")], &[]),
    ("cuStreamDestroy", &[(2000, "cuStreamDestroy"), (4000, "cuStreamDestroy_v2")], &[]),
    ("cuStreamSynchronize", &[(2000, "cuStreamSynchronize")], &[(7000, "cuStreamSynchronize_ptsz")]),
    ("cuStreamQuery", &[(2000, "cuStreamQuery")], &[(7000, "cuStreamQuery_ptsz")]),
    ("cuStreamWaitEvent", &[(3020, "cuStreamWaitEvent")], &[(7000, "cuStreamWaitEvent_ptsz")]),
    ("cuStreamBeginCapture", &[(10000, "cuStreamBeginCapture"), (10010, "cuStreamBeginCapture_v2")], &[(10000, "cuStreamBeginCapture_ptsz"), (10010, "cuStreamBeginCapture_v2_ptsz")]),
    ("cuStreamEndCapture", &[(10000, "cuStreamEndCapture")], &[(10000, "cuStreamEndCapture_ptsz")]),
    ("cuStreamIsCapturing", &[(10000, "cuStreamIsCapturing")], &[(10000, "cuStreamIsCapturing_ptsz")]),
    ("cuStreamGetCaptureInfo", &[(11030, "cuStreamGetCaptureInfo_v2"), (12030, "cuStreamGetCaptureInfo_v3")], &[(11030, "cuStreamGetCaptureInfo_v2_ptsz"), (12030, "cuStreamGetCaptureInfo_v3_ptsz")]),
    ("cuStreamGetCtx", &[(9020, "cuStreamGetCtx"), (12050, "cuStreamGetCtx_v2")], &[(9020, "cuStreamGetCtx_ptsz"), (12050, "cuStreamGetCtx_v2_ptsz")]),
    ("cuEventCreate", &[(2000, "cuEventCreate")], &[]),
    ("cuEventRecord", &[(2000, "cuEventRecord")], &[(7000, "cuEventRecord_ptsz")]),
    ("cuEventQuery", &[(2000, "cuEventQuery")], &[]),
    ("cuEventSynchronize", &[(2000, "cuEventSynchronize")], &[]),
    ("cuEventElapsedTime", &[(2000, "cuEventElapsedTime"), (13000, "cuEventElapsedTime_v2")], &[]),
    ("cuEventDestroy", &[(2000, "cuEventDestroy"), (4000, "cuEventDestroy_v2")], &[]),
    ("cuModuleLoadData", &[(2000, "cuModuleLoadData")], &[]),
    ("cuModuleGetFunction", &[(2000, "cuModuleGetFunction")], &[]),
    ("cuModuleUnload", &[(2000, "cuModuleUnload")], &[]),
    ("cuLibraryLoadData", &[(12000, "cuLibraryLoadData")], &[]),
    ("cuGetProcAddress", &[(11030, "cuGetProcAddress"), (12000, "cuGetProcAddress_v2")], &[]),
    ("cuGetErrorString", &[(6000, "cuGetErrorString")], &[]),
    ("cuFuncGetAttribute", &[(2020, "cuFuncGetAttribute")], &[]),
    ("cuOccupancyMaxActiveBlocksPerMultiprocessor", &[(6050, "cuOccupancyMaxActiveBlocksPerMultiprocessor")], &[]),
    ("cuMemHostGetDevicePointer", &[(2020, "cuMemHostGetDevicePointer"), (3020, "cuMemHostGetDevicePointer_v2")], &[]),
    ("cuMemFreeHost", &[(2000, "cuMemFreeHost")], &[]),
];

/// The newest version in `list` introduced at or before `version`.
fn pick(list: Versions, version: c_int) -> Option<&'static str> {
    list.iter()
        .rev()
        .find(|(v, _)| *v <= version)
        .map(|(_, n)| *n)
}

/// Resolves like the driver: `Err(rc)` for an invalid request, otherwise
/// the exported name (or None) and the symbol status.
pub fn resolve(
    symbol: &str,
    version: c_int,
    flags: u64,
) -> Result<(Option<&'static str>, c_int), CUresult> {
    if version > DRIVER_VERSION {
        return Err(INVALID_VALUE);
    }
    let Some(&(_, legacy, per_thread)) = TABLE.iter().find(|(b, _, _)| *b == symbol) else {
        return Ok((None, STATUS_NOT_FOUND));
    };
    let list = if flags & FLAG_PER_THREAD != 0 && !per_thread.is_empty() {
        per_thread
    } else {
        legacy
    };
    Ok(match pick(list, version) {
        Some(name) => (Some(name), STATUS_FOUND),
        None => (None, STATUS_VERSION_INSUFFICIENT),
    })
}

fn get_proc(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let Some(sym) = c_str(symbol) else {
        return INVALID_VALUE;
    };
    if pfn.is_null() {
        return INVALID_VALUE;
    }
    let (name, st) = match resolve(&sym, version, flags) {
        Ok(v) => v,
        Err(rc) => return rc,
    };
    let addr = name.and_then(|n| exports().get(n).copied()).unwrap_or(0);
    put(pfn, addr as *mut c_void);
    put(status, st);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    get_proc(symbol, pfn, version, flags, status)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    // The 4-argument form has no status out-parameter: "not found" and
    // "version too old" become CUDA_ERROR_NOT_FOUND.
    let mut status = STATUS_FOUND;
    let rc = get_proc(symbol, pfn, version, flags, &mut status);
    if rc == SUCCESS && status != STATUS_FOUND {
        CUDA_ERROR_NOT_FOUND
    } else {
        rc
    }
}

const CUDA_ERROR_NOT_FOUND: CUresult = 500;

macro_rules! export_map {
    ($($path:path),* $(,)?) => {{
        let mut m: HashMap<&'static str, usize> = HashMap::new();
        $( m.insert(stringify!($path).rsplit("::").next().unwrap_or("").trim(), $path as *const () as usize); )*
        m
    }};
}

/// Exported name -> address, built without dlsym (which an interposer may
/// wrap): the driver hands out its own entry points.
fn exports() -> &'static HashMap<&'static str, usize> {
    static MAP: OnceLock<HashMap<&'static str, usize>> = OnceLock::new();
    MAP.get_or_init(|| {
        use crate::context::*;
        use crate::cuda::*;
        use crate::graph::*;
        use crate::launch::*;
        use crate::memory::*;
        use crate::stream::*;
        use crate::stubs::*;
        use crate::vmm::*;
        let mut m = export_map![
            cuInit,
            cuDriverGetVersion,
            cuDeviceGet,
            cuDeviceGetCount,
            cuDeviceGetName,
            cuDeviceTotalMem,
            cuDeviceTotalMem_v2,
            cuDeviceGetUuid,
            cuDeviceGetUuid_v2,
            cuDeviceGetAttribute,
            cuDeviceGetMemPool,
            cuDeviceGetDefaultMemPool,
            cuCtxCreate,
            cuCtxCreate_v2,
            cuCtxCreate_v3,
            cuCtxCreate_v4,
            cuCtxDestroy,
            cuCtxDestroy_v2,
            cuCtxGetCurrent,
            cuCtxSetCurrent,
            cuCtxPushCurrent,
            cuCtxPushCurrent_v2,
            cuCtxPopCurrent,
            cuCtxPopCurrent_v2,
            cuCtxSynchronize,
            cuCtxSynchronize_v2,
            cuCtxGetDevice,
            cuCtxGetDevice_v2,
            cuDevicePrimaryCtxRetain,
            cuDevicePrimaryCtxRelease,
            cuDevicePrimaryCtxRelease_v2,
            cuDevicePrimaryCtxReset,
            cuDevicePrimaryCtxReset_v2,
            cuDevicePrimaryCtxSetFlags,
            cuDevicePrimaryCtxSetFlags_v2,
            cuDevicePrimaryCtxGetState,
            cuMemAlloc_v2,
            cuMemAllocPitch_v2,
            cuMemAllocManaged,
            cuMemAllocAsync,
            cuMemAllocAsync_ptsz,
            cuMemAllocFromPoolAsync,
            cuMemAllocFromPoolAsync_ptsz,
            cuMemFree_v2,
            cuMemFreeAsync,
            cuMemFreeAsync_ptsz,
            cuMemCreate,
            cuMemRelease,
            cuMemAddressReserve,
            cuMemAddressFree,
            cuMemMap,
            cuMemUnmap,
            cuMemSetAccess,
            cuMemGetAccess,
            cuDeviceCanAccessPeer,
            cuMemGetAllocationGranularity,
            cuArrayCreate_v2,
            cuArray3DCreate_v2,
            cuArrayDestroy,
            cuMipmappedArrayCreate,
            cuMipmappedArrayDestroy,
            cuMemGetInfo_v2,
            cuMemGetAddressRange_v2,
            cuIpcGetMemHandle,
            cuIpcOpenMemHandle,
            cuIpcOpenMemHandle_v2,
            cuIpcCloseMemHandle,
            cuMemExportToShareableHandle,
            cuMemImportFromShareableHandle,
            cuPointerGetAttribute,
            cuPointerGetAttributes,
            cuMemPoolCreate,
            cuMemPoolDestroy,
            cuMemPoolTrimTo,
            cuMemHostAlloc,
            cuMemHostGetDevicePointer_v2,
            cuMemFreeHost,
            cuMemHostRegister_v2,
            cuMemHostUnregister,
            cuMemcpyHtoD_v2,
            cuMemcpyDtoH_v2,
            cuMemcpyHtoDAsync_v2,
            cuMemcpyDtoHAsync_v2,
            cuMemsetD8_v2,
            cuModuleLoadData,
            cuModuleGetFunction,
            cuModuleUnload,
            cuLaunchKernel,
            cuLaunchKernel_ptsz,
            cuLaunchKernelEx,
            cuLaunchKernelEx_ptsz,
            cuLaunchCooperativeKernel,
            cuLaunchCooperativeKernel_ptsz,
            cuStreamCreate,
            cuStreamDestroy_v2,
            cuStreamSynchronize,
            cuStreamSynchronize_ptsz,
            cuStreamQuery,
            cuStreamQuery_ptsz,
            cuStreamGetCtx,
            cuEventCreate,
            cuEventDestroy_v2,
            cuEventRecord,
            cuEventRecord_ptsz,
            cuEventQuery,
            cuEventSynchronize,
            cuEventElapsedTime,
            cuEventElapsedTime_v2,
            cuGetErrorString,
            cuFuncGetAttribute,
            cuOccupancyMaxActiveBlocksPerMultiprocessor,
            cuGraphCreate,
            cuGraphAddKernelNode,
            cuGraphAddKernelNode_v2,
            cuGraphGetNodes,
            cuGraphNodeGetType,
            cuGraphKernelNodeGetParams,
            cuGraphKernelNodeGetParams_v2,
            cuGraphInstantiate,
            cuGraphInstantiate_v2,
            cuGraphInstantiateWithFlags,
            cuGraphInstantiateWithParams,
            cuGraphInstantiateWithParams_ptsz,
            cuGraphLaunch,
            cuGraphLaunch_ptsz,
            cuGraphUpload,
            cuGraphUpload_ptsz,
            cuGraphExecDestroy,
            cuGraphDestroy,
            cuStreamBeginCapture,
            cuStreamBeginCapture_ptsz,
            cuStreamBeginCapture_v2,
            cuStreamBeginCapture_v2_ptsz,
            cuStreamEndCapture,
            cuStreamEndCapture_ptsz,
            cuStreamIsCapturing,
            cuStreamIsCapturing_ptsz,
            cuGetProcAddress,
            cuGetProcAddress_v2,
        ];
        for &(name, addr) in stub_exports() {
            m.insert(name, addr);
        }
        m
    })
}
