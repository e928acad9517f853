//! Every real CUDA driver function vgpu calls, typed: the hooked ones
//! (`exports.rs`) and those it only calls itself (`driver.rs`, `events`,
//! `graph`). `reals!` makes each a lazily resolved slot and a function
//! `real::name(args) -> CUresult` that answers `CUDA_ERROR_NOT_FOUND`
//! when the driver lacks the symbol. Resolved with libc's own `dlsym`,
//! never through our hooks.
//!
//! `fn` or `unsafe fn` per function, as `reals!` explains; below the list,
//! safe forms of the `unsafe` ones that vgpu calls itself.

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_void};

use super::sys::*;
use crate::ffi::{In, Out};
use crate::interpose::real::Lib;

type Args = *mut *mut c_void;

crate::interpose::reals::reals! {
    lib: Lib::Cuda, missing: CUresult::ERROR_NOT_FOUND;
    // memory: every allocation family and its frees
    fn cuMemAlloc_v2(dptr: Out<CUdeviceptr>, bytes: usize) -> CUresult;
    fn cuMemAllocPitch_v2(dptr: Out<CUdeviceptr>, pitch: Out<usize>, width: usize, height: usize, elem: c_uint) -> CUresult;
    fn cuMemAllocManaged(dptr: Out<CUdeviceptr>, bytes: usize, flags: c_uint) -> CUresult;
    fn cuMemAllocAsync(dptr: Out<CUdeviceptr>, bytes: usize, stream: CUstream) -> CUresult;
    fn cuMemAllocAsync_ptsz(dptr: Out<CUdeviceptr>, bytes: usize, stream: CUstream) -> CUresult;
    fn cuMemAllocFromPoolAsync(dptr: Out<CUdeviceptr>, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult;
    fn cuMemAllocFromPoolAsync_ptsz(dptr: Out<CUdeviceptr>, bytes: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult;
    fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult;
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult;
    unsafe fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const MemAllocationProp, flags: u64) -> CUresult;
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult;
    fn cuMemGetAddressRange_v2(base: Out<CUdeviceptr>, size: Out<usize>, dptr: CUdeviceptr) -> CUresult;
    fn cuIpcGetMemHandle(handle: Out<[u8; 64]>, dptr: CUdeviceptr) -> CUresult;
    fn cuIpcOpenMemHandle_v2(dptr: Out<CUdeviceptr>, handle: IpcMemHandle, flags: c_uint) -> CUresult;
    fn cuIpcOpenMemHandle(dptr: Out<CUdeviceptr>, handle: IpcMemHandle, flags: c_uint) -> CUresult;
    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult;
    unsafe fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, kind: c_int, flags: u64) -> CUresult;
    unsafe fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, kind: c_int) -> CUresult;
    unsafe fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) -> CUresult;
    unsafe fn cuPointerGetAttributes(count: c_uint, attributes: *const c_int, data: *mut *mut c_void, ptr: CUdeviceptr) -> CUresult;
    fn cuMemAddressReserve(ptr: Out<CUdeviceptr>, bytes: usize, align: usize, addr: CUdeviceptr, flags: u64) -> CUresult;
    fn cuMemAddressFree(ptr: CUdeviceptr, bytes: usize) -> CUresult;
    fn cuMemMap(ptr: CUdeviceptr, bytes: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult;
    fn cuMemUnmap(ptr: CUdeviceptr, bytes: usize) -> CUresult;
    unsafe fn cuMemSetAccess(ptr: CUdeviceptr, bytes: usize, desc: *const MemAccessDesc, count: usize) -> CUresult;
    unsafe fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) -> CUresult;
    unsafe fn cuMemFreeHost(p: *mut c_void) -> CUresult;
    unsafe fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, flags: c_uint) -> CUresult;
    unsafe fn cuMemHostUnregister(p: *mut c_void) -> CUresult;
    fn cuArrayCreate_v2(array: Out<CUarray>, desc: In<ArrayDescriptor>) -> CUresult;
    fn cuArray3DCreate_v2(array: Out<CUarray>, desc: In<Array3dDescriptor>) -> CUresult;
    fn cuArrayDestroy(array: CUarray) -> CUresult;
    fn cuMipmappedArrayCreate(array: Out<CUmipmappedArray>, desc: In<Array3dDescriptor>, levels: c_uint) -> CUresult;
    fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult;
    unsafe fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const MemPoolProps) -> CUresult;
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult;
    // context: creation, destruction, primary-context retain/release/reset
    fn cuCtxCreate_v2(ctx: Out<CUcontext>, flags: c_uint, dev: CUdevice) -> CUresult;
    unsafe fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut c_void, n: c_int, flags: c_uint, dev: CUdevice) -> CUresult;
    unsafe fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult;
    fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult;
    fn cuDevicePrimaryCtxRetain(ctx: Out<CUcontext>, dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult;
    // info: cuInit and the virtual view of memory
    fn cuInit(flags: c_uint) -> CUresult;
    fn cuMemGetInfo_v2(free: Out<usize>, total: Out<usize>) -> CUresult;
    fn cuDeviceTotalMem_v2(bytes: Out<usize>, dev: CUdevice) -> CUresult;
    // proc_address: the entry point cudart reaches everything through
    unsafe fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> CUresult;
    unsafe fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> CUresult;
    // launch: every launch family, through the compute bucket
    unsafe fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args, extra: Args) -> CUresult;
    unsafe fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args, extra: Args) -> CUresult;
    unsafe fn cuLaunchKernelEx(config: *const LaunchConfig, f: CUfunction, params: Args, extra: Args) -> CUresult;
    unsafe fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: CUfunction, params: Args, extra: Args) -> CUresult;
    unsafe fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args) -> CUresult;
    unsafe fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: Args) -> CUresult;
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult;
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult;
    // graph: instantiation (cost) and stream capture
    fn cuGraphInstantiateWithFlags(exec: Out<CUgraphExec>, graph: CUgraph, flags: u64) -> CUresult;
    unsafe fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, size: usize) -> CUresult;
    unsafe fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, size: usize) -> CUresult;
    unsafe fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) -> CUresult;
    unsafe fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) -> CUresult;
    fn cuStreamBeginCapture(stream: CUstream) -> CUresult;
    fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult;
    fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CUresult;
    fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_int) -> CUresult;
    unsafe fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_int) -> CUresult;
    unsafe fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_int) -> CUresult;
    fn cuStreamEndCapture(stream: CUstream, graph: Out<CUgraph>) -> CUresult;
    fn cuStreamEndCapture_ptsz(stream: CUstream, graph: Out<CUgraph>) -> CUresult;
    // wake: calls that restore a suspended process (oversub), passed through
    // (synchronisations noted for the turns' probes); copies and sets are
    // unsafe even between device addresses: under unified addressing a
    // CUdeviceptr may be host memory
    fn cuCtxSynchronize() -> CUresult;
    fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult;
    fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult;
    fn cuStreamSynchronize(stream: CUstream) -> CUresult;
    fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult;
    unsafe fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult;
    unsafe fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult;
    unsafe fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult;
    unsafe fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult;
    unsafe fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult;
    unsafe fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult;
    unsafe fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) -> CUresult;
    unsafe fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) -> CUresult;
    unsafe fn cuMemsetD8_v2(dst: CUdeviceptr, v: c_uchar, n: usize) -> CUresult;
    unsafe fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult;
    unsafe fn cuMemsetD8Async(dst: CUdeviceptr, v: c_uchar, n: usize, stream: CUstream) -> CUresult;
    unsafe fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, stream: CUstream) -> CUresult;
    // checkpoint: a process suspending and restoring itself (oversub)
    fn cuCheckpointProcessLock(pid: c_int, args: In<CheckpointLockArgs>) -> CUresult;
    unsafe fn cuCheckpointProcessCheckpoint(pid: c_int, args: *mut c_void) -> CUresult;
    unsafe fn cuCheckpointProcessRestore(pid: c_int, args: *mut c_void) -> CUresult;
    unsafe fn cuCheckpointProcessUnlock(pid: c_int, args: *mut c_void) -> CUresult;
    fn cuCheckpointProcessGetState(pid: c_int, state: Out<c_int>) -> CUresult;
    // called, not hooked
    fn cuCtxGetCurrent(ctx: Out<CUcontext>) -> CUresult;
    fn cuCtxGetDevice(dev: Out<CUdevice>) -> CUresult;
    fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult;
    fn cuCtxPopCurrent_v2(ctx: Out<CUcontext>) -> CUresult;
    fn cuDeviceGetUuid_v2(uuid: Out<[u8; 16]>, dev: CUdevice) -> CUresult;
    fn cuDeviceGetUuid(uuid: Out<[u8; 16]>, dev: CUdevice) -> CUresult;
    fn cuDeviceGetAttribute(value: Out<c_int>, attr: c_int, dev: CUdevice) -> CUresult;
    fn cuDeviceGetCount(count: Out<c_int>) -> CUresult;
    fn cuDeviceCanAccessPeer(can: Out<c_int>, dev: CUdevice, peer: CUdevice) -> CUresult;
    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: Out<c_uint>, active: Out<c_int>) -> CUresult;
    fn cuEventCreate(event: Out<CUevent>, flags: c_uint) -> CUresult;
    fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult;
    fn cuEventQuery(event: CUevent) -> CUresult;
    fn cuEventSynchronize(event: CUevent) -> CUresult;
    fn cuEventElapsedTime(ms: Out<f32>, start: CUevent, end: CUevent) -> CUresult;
    fn cuEventDestroy_v2(event: CUevent) -> CUresult;
    fn cuStreamIsCapturing(stream: CUstream, status: Out<c_int>) -> CUresult;
    fn cuStreamQuery(stream: CUstream) -> CUresult;
    unsafe fn cuGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) -> CUresult;
    fn cuGraphNodeGetType(node: CUgraphNode, kind: Out<c_int>) -> CUresult;
    fn cuGraphKernelNodeGetParams_v2(node: CUgraphNode, params: Out<KernelNodeParams>) -> CUresult;
    fn cuGraphChildGraphNodeGetGraph(node: CUgraphNode, graph: Out<CUgraph>) -> CUresult;
}

/// `cuGraphGetNodes` into `nodes` (NULL when empty: the count only):
/// `count` says how many the graph has, capped by `nodes.len()` when
/// `nodes` is not empty.
pub(crate) fn graph_nodes(
    graph: CUgraph,
    nodes: &mut [CUgraphNode],
    count: &mut usize,
) -> CUresult {
    let buf = if nodes.is_empty() {
        std::ptr::null_mut()
    } else {
        *count = (*count).min(nodes.len());
        nodes.as_mut_ptr()
    };
    // SAFETY: `buf` is NULL (the driver then writes only `count`) or holds
    // `nodes.len()` ≥ `*count` writable nodes, and `count` is a live usize.
    unsafe { cuGraphGetNodes(graph, buf, count) }
}

/// `cuCheckpointProcessCheckpoint` with its documented default (NULL args).
pub(crate) fn checkpoint_process(pid: c_int) -> CUresult {
    // SAFETY: NULL args are the documented default.
    unsafe { cuCheckpointProcessCheckpoint(pid, std::ptr::null_mut()) }
}

/// `cuCheckpointProcessRestore` with its documented default (NULL args).
pub(crate) fn restore_process(pid: c_int) -> CUresult {
    // SAFETY: NULL args are the documented default.
    unsafe { cuCheckpointProcessRestore(pid, std::ptr::null_mut()) }
}

/// `cuCheckpointProcessUnlock` with its documented default (NULL args).
pub(crate) fn unlock_process(pid: c_int) -> CUresult {
    // SAFETY: NULL args are the documented default.
    unsafe { cuCheckpointProcessUnlock(pid, std::ptr::null_mut()) }
}

/// `cuMemCreate` of `bytes` with `prop` into `handle`.
pub(crate) fn mem_create(
    handle: &mut CUmemGenericAllocationHandle,
    bytes: usize,
    prop: &MemAllocationProp,
) -> CUresult {
    // SAFETY: `handle` and `prop` are live references for the call.
    unsafe { cuMemCreate(handle, bytes, prop, 0) }
}

/// `cuMemExportToShareableHandle` of `handle` as a POSIX file descriptor
/// (the memory must have been made with that handle type), owned.
pub(crate) fn mem_export_fd(
    handle: CUmemGenericAllocationHandle,
) -> Result<std::os::fd::OwnedFd, CUresult> {
    use std::os::fd::FromRawFd;
    let mut fd: c_int = -1;
    // SAFETY: for this handle type the driver writes one int at the
    // pointer, a live local.
    let rc = unsafe {
        cuMemExportToShareableHandle((&raw mut fd).cast(), handle, MEM_HANDLE_TYPE_POSIX_FD, 0)
    };
    if !rc.is_ok() {
        return Err(rc);
    }
    if fd < 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the driver made this descriptor for the caller, who owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// `cuMemImportFromShareableHandle` of a POSIX file descriptor (the
/// caller keeps it; the handle holds the memory on its own).
pub(crate) fn mem_import_fd(
    fd: std::os::fd::BorrowedFd<'_>,
) -> Result<CUmemGenericAllocationHandle, CUresult> {
    use std::os::fd::AsRawFd;
    let mut handle = 0;
    // SAFETY: for this handle type the driver takes the descriptor's
    // number in the pointer's place, and writes the handle to a live local.
    let rc = unsafe {
        cuMemImportFromShareableHandle(
            &mut handle,
            fd.as_raw_fd() as usize as *mut c_void,
            MEM_HANDLE_TYPE_POSIX_FD,
        )
    };
    if rc.is_ok() { Ok(handle) } else { Err(rc) }
}

/// `cuMemSetAccess` of one descriptor.
pub(crate) fn mem_set_access(ptr: CUdeviceptr, bytes: usize, desc: &MemAccessDesc) -> CUresult {
    mem_set_access_all(ptr, bytes, std::slice::from_ref(desc))
}

/// `cuMemSetAccess` of several descriptors.
pub(crate) fn mem_set_access_all(
    ptr: CUdeviceptr,
    bytes: usize,
    descs: &[MemAccessDesc],
) -> CUresult {
    // SAFETY: `descs` lives for the call, and the count is its length.
    unsafe { cuMemSetAccess(ptr, bytes, descs.as_ptr(), descs.len()) }
}

/// A pinned host buffer, freed when dropped; device memory is copied in
/// and out of it by offset, bounds checked.
///
/// Anonymous memory the kernel fills first (`MADV_POPULATE_WRITE`),
/// then registered: `cuMemHostAlloc` pins at 1-2 GB/s holding the driver's
/// lock throughout, so a thread pinning beside a running job held its
/// calls up for seconds (run 100: a memset waited 7.2 s), while
/// registering memory already touched runs at ~24 GB/s
/// (docs/vmm-facts.md fact 2). `cuMemHostAlloc` where that fails.
pub(crate) struct Pinned {
    ptr: *mut c_void,
    len: usize,
    /// From `mmap` and registered (else from `cuMemHostAlloc`).
    mapped: bool,
}

// SAFETY: plain host memory owned by this value alone; it is touched only
// through `&mut self` (writes) or `&self` (reads).
unsafe impl Send for Pinned {}

/// `CU_MEMHOSTALLOC_PORTABLE` and `CU_MEMHOSTREGISTER_PORTABLE` (both 1,
/// cuda.h): pinned for every context, not just the one current at the
/// call, so that blocks of another card copy at the pinned rate too.
const HOST_PORTABLE: c_uint = 1;

impl Pinned {
    /// `len` bytes of pinned host memory (a context must be current).
    pub(crate) fn new(len: usize) -> Result<Pinned, CUresult> {
        if let Some(p) = Self::registered(len)? {
            return Ok(p);
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a live pointer slot the driver writes once.
        let rc = unsafe { cuMemHostAlloc(&mut ptr, len, HOST_PORTABLE) };
        if !rc.is_ok() {
            return Err(rc);
        }
        if ptr.is_null() {
            return Err(CUresult::ERROR_OUT_OF_MEMORY);
        }
        Ok(Pinned {
            ptr,
            len,
            mapped: false,
        })
    }

    /// Populated anonymous memory, registered with the driver; None where
    /// registering fails (`cuMemHostAlloc` then), out of memory where the
    /// kernel would not fill it.
    fn registered(len: usize) -> Result<Option<Pinned>, CUresult> {
        // SAFETY: a fresh private anonymous mapping; no address is given.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Ok(None);
        }
        // Not into a child: a fork copies pinned private pages at once (15
        // GiB for each of the program's forked workers, and for the bare
        // clone that reads NVML's free memory). Huge pages where the
        // kernel has them: 512 times fewer faults to fill the arena and
        // pages to pin, beside a job that runs meanwhile (its throughput
        // fell to 0.92 while 15 GiB of small pages filled, run 104).
        // SAFETY: the mapping made just now; advice only.
        unsafe {
            libc::madvise(ptr, len, libc::MADV_DONTFORK);
            libc::madvise(ptr, len, libc::MADV_HUGEPAGE);
        }
        // Filled before it is registered (registering touched memory runs
        // at ~24 GB/s); page by page where the kernel (before 5.14) has no
        // MADV_POPULATE_WRITE. Where the kernel says it has no memory, the
        // arena is refused with out of memory (no slower fallback that
        // pins the same); inside a memory-limited cgroup the OOM killer
        // may act before it says so.
        // SAFETY: the mapping made just now; advice only.
        if unsafe { libc::madvise(ptr, len, libc::MADV_POPULATE_WRITE) } != 0 {
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                // SAFETY: the mapping made above, unused.
                unsafe { libc::munmap(ptr, len) };
                return Err(CUresult::ERROR_OUT_OF_MEMORY);
            }
            // SAFETY: sysconf reads a constant of the system.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
                .unwrap_or(4096)
                .max(1);
            for off in (0..len).step_by(page) {
                // SAFETY: `off < len`: inside the writable mapping above,
                // which nothing else uses yet.
                unsafe { ptr.cast::<u8>().add(off).write_volatile(0) };
            }
        }
        // SAFETY: `len` bytes mapped just now at `ptr`, owned here.
        let rc = unsafe { cuMemHostRegister_v2(ptr, len, HOST_PORTABLE) };
        if rc.is_ok() {
            return Ok(Some(Pinned {
                ptr,
                len,
                mapped: true,
            }));
        }
        crate::warn_once!(
            "CUDA_OVERSUBSCRIBE: cuMemHostRegister failed ({rc}): the host arena is pinned by cuMemHostAlloc instead, at 1-2 GB/s"
        );
        // SAFETY: the mapping made above, unused.
        unsafe { libc::munmap(ptr, len) };
        Ok(None)
    }

    fn fits(&self, off: usize, n: usize) -> bool {
        off.checked_add(n).is_some_and(|end| end <= self.len)
    }

    /// Copies `n` bytes of device memory at `src` to `self[off..]`.
    pub(crate) fn copy_from_device(&mut self, off: usize, src: CUdeviceptr, n: usize) -> CUresult {
        if !self.fits(off, n) {
            return CUresult::ERROR_INVALID_VALUE;
        }
        // SAFETY: `off + n <= len`, inside the buffer this value owns.
        unsafe { cuMemcpyDtoH_v2(self.ptr.cast::<u8>().add(off).cast(), src, n) }
    }

    /// Copies `self[off..off + n]` to device memory at `dst`.
    pub(crate) fn copy_to_device(&self, off: usize, dst: CUdeviceptr, n: usize) -> CUresult {
        if !self.fits(off, n) {
            return CUresult::ERROR_INVALID_VALUE;
        }
        // SAFETY: `off + n <= len`, inside the buffer this value owns.
        unsafe { cuMemcpyHtoD_v2(dst, self.ptr.cast::<u8>().add(off).cast(), n) }
    }
}

impl Pinned {
    /// Gives the memory back without the driver, whose contexts (and
    /// registrations with them) are gone: a registered mapping is
    /// unmapped; memory from `cuMemHostAlloc` is the driver's to reclaim.
    pub(crate) fn forget_driver(self) {
        let me = std::mem::ManuallyDrop::new(self);
        if me.mapped {
            // SAFETY: `ptr` was mapped by `registered`, `len` bytes, and
            // `ManuallyDrop` keeps `drop` from giving it back again.
            unsafe { libc::munmap(me.ptr, me.len) };
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: `ptr` was registered and mapped by `registered` and
            // is given back once, here.
            unsafe {
                let _ = cuMemHostUnregister(self.ptr);
                libc::munmap(self.ptr, self.len);
            }
        } else {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed once, here.
            let _ = unsafe { cuMemFreeHost(self.ptr) };
        }
    }
}
