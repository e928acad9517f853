//! The memory families. Every allocation is reserved against the quota
//! before the driver sees it (reserve-then-check, `vgpu_shm::quota`), and
//! released when it is freed. A free of something we never counted goes to
//! the driver untouched. The device an allocation counts against comes from
//! the allocation: the current context's device, `location.id` for
//! `cuMemCreate`, the pool's device for `cuMemAllocFromPoolAsync`.
#![forbid(unsafe_code)]

use std::ffi::{c_int, c_uint};

use vgpu_shm::{EntryIndex, Kind};

use super::real;
use super::sys::*;
use super::{device, driver};
use crate::attach::Attach;
use crate::ffi::{In, Out};
use crate::init;
use crate::process::POOLS;
use crate::quota::{self, Charge, Key};

/// Which device an allocation lands on.
#[derive(Clone, Copy)]
enum On {
    CurrentContext,
    Ordinal(CUdevice),
}

impl On {
    /// The device entry, asked once the quota needs it.
    fn entry(self) -> impl FnOnce(&Attach) -> Option<EntryIndex> {
        move |attach| match self {
            On::CurrentContext => device::current_entry(attach).map(|(d, _)| d),
            On::Ordinal(o) => device::entry(attach, o),
        }
    }
}

/// Counts `bytes` of `kind` around `alloc`; `key` names the result.
fn counted(
    on: On,
    kind: Kind,
    bytes: u64,
    alloc: impl FnMut() -> CUresult,
    key: impl FnOnce() -> Option<Key>,
) -> CUresult {
    quota::counted(init::attach(), kind, bytes, on.entry(), alloc, || {
        Some((key()?, current_context()))
    })
}

/// Frees `key` through `free`, releasing what it counted. (A free never
/// starts the runtime: before it, nothing can have been counted.)
fn uncounted(key: Key, free: impl FnOnce() -> CUresult) -> CUresult {
    quota::uncounted(init::attach_if_started(), key, free)
}

/// The current context as the tracker names it (0: none).
fn current_context() -> usize {
    driver::current_context().map_or(0, |c| c as usize)
}

fn ptr_key(p: Out<CUdeviceptr>) -> impl FnOnce() -> Option<Key> {
    move || p.get().map(Key::Ptr)
}

pub fn alloc(dptr: Out<CUdeviceptr>, bytes: usize) -> CUresult {
    if dptr.is_null() || bytes == 0 {
        return real::cuMemAlloc_v2(dptr, bytes);
    }
    if crate::oversub::backing::wanted(bytes) {
        // Counted at the mapped size: what the card gives it.
        return crate::oversub::backing::serving(|| {
            counted(
                On::CurrentContext,
                Kind::Buffer,
                crate::oversub::backing::mapped_size(bytes),
                || crate::oversub::backing::alloc(dptr, bytes),
                ptr_key(dptr),
            )
        });
    }
    counted(
        On::CurrentContext,
        Kind::Buffer,
        bytes as u64,
        || real::cuMemAlloc_v2(dptr, bytes),
        ptr_key(dptr),
    )
}

pub fn alloc_managed(dptr: Out<CUdeviceptr>, bytes: usize, flags: c_uint) -> CUresult {
    let call = || real::cuMemAllocManaged(dptr, bytes, flags);
    if dptr.is_null() || bytes == 0 {
        return call();
    }
    counted(
        On::CurrentContext,
        Kind::Buffer,
        bytes as u64,
        call,
        ptr_key(dptr),
    )
}

/// The driver pads rows to its texture pitch alignment (512 bytes on every
/// GPU we know); the real pitch is settled after the call.
const PITCH_ALIGN: usize = 512;

pub fn alloc_pitch(
    dptr: Out<CUdeviceptr>,
    pitch: Out<usize>,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let call = || real::cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 {
        return call();
    }
    let estimate = (width.div_ceil(PITCH_ALIGN) * PITCH_ALIGN).saturating_mul(height) as u64;
    let charge = match Charge::take(
        init::attach(),
        Kind::Buffer,
        estimate,
        On::CurrentContext.entry(),
    ) {
        Ok(c) => c,
        Err(rc) => return rc,
    };
    let rc = call();
    let Some(mut c) = charge else { return rc };
    let (Some(p), Some(row), true) = (dptr.get(), pitch.get(), rc.is_ok()) else {
        return rc;
    };
    if let Err(deny) = c.settle((row as u64).saturating_mul(height as u64)) {
        drop(c);
        let _ = real::cuMemFree_v2(p);
        return deny;
    }
    c.keep(Key::Ptr(p), current_context());
    rc
}

pub fn alloc_async(dptr: Out<CUdeviceptr>, bytes: usize, stream: CUstream) -> CUresult {
    counted_async(dptr, bytes, On::CurrentContext, || {
        real::cuMemAllocAsync(dptr, bytes, stream)
    })
}

pub fn alloc_async_ptsz(dptr: Out<CUdeviceptr>, bytes: usize, stream: CUstream) -> CUresult {
    counted_async(dptr, bytes, On::CurrentContext, || {
        real::cuMemAllocAsync_ptsz(dptr, bytes, stream)
    })
}

pub fn alloc_from_pool(
    dptr: Out<CUdeviceptr>,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let on = pool_device(pool);
    counted_async(dptr, bytes, on, || {
        real::cuMemAllocFromPoolAsync(dptr, bytes, pool, stream)
    })
}

pub fn alloc_from_pool_ptsz(
    dptr: Out<CUdeviceptr>,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    let on = pool_device(pool);
    counted_async(dptr, bytes, on, || {
        real::cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, stream)
    })
}

fn counted_async(
    dptr: Out<CUdeviceptr>,
    bytes: usize,
    on: On,
    mut call: impl FnMut() -> CUresult,
) -> CUresult {
    if dptr.is_null() || bytes == 0 {
        return call();
    }
    counted(on, Kind::Pool, bytes as u64, call, ptr_key(dptr))
}

pub fn free(p: CUdeviceptr) -> CUresult {
    uncounted(Key::Ptr(p), || {
        crate::oversub::free_backed(p).unwrap_or_else(|| real::cuMemFree_v2(p))
    })
}

/// `cuMemGetAddressRange_v2`: a VMM-backed block answers the base and the
/// size the program asked for, as cuMemAlloc would (the driver says the
/// mapped size, docs/vmm-facts.md fact 5).
pub fn address_range(
    call: &impl Fn() -> CUresult,
    base: Out<CUdeviceptr>,
    size: Out<usize>,
    p: CUdeviceptr,
) -> CUresult {
    let rc = call();
    if rc.is_ok()
        && let Some((b, asked)) = crate::oversub::backing::asked(p)
    {
        base.put(b);
        size.put(asked as usize);
    }
    rc
}

/// `CU_POINTER_ATTRIBUTE_CONTEXT`, `_IS_LEGACY_CUDA_IPC_CAPABLE`,
/// `_RANGE_START_ADDR` and `_RANGE_SIZE` (cuda.h).
const CONTEXT: c_int = 1;
const IS_LEGACY_CUDA_IPC_CAPABLE: c_int = 10;
const RANGE_START_ADDR: c_int = 11;
const RANGE_SIZE: c_int = 12;

/// A pointer attribute's value where vgpu answers it, not the driver: a
/// VMM-backed block's context, base and the size the program asked for,
/// as cuMemAlloc's block would answer (the driver says NULL and the
/// mapped size, docs/vmm-facts.md fact 5), and whether legacy IPC can
/// export it (vgpu's export can, where its memory has a file descriptor;
/// the driver says 0).
pub fn block_attribute(attribute: c_int, p: CUdeviceptr) -> Option<u64> {
    match attribute {
        CONTEXT => crate::oversub::backing::context_of(p).map(|c| c as u64),
        IS_LEGACY_CUDA_IPC_CAPABLE => crate::oversub::backing::shareable(p).map(u64::from),
        RANGE_START_ADDR => crate::oversub::backing::asked(p).map(|(base, _)| base),
        RANGE_SIZE => crate::oversub::backing::asked(p).map(|(_, size)| size),
        _ => None,
    }
}

/// `cuPointerGetAttribute`: a VMM-backed block's context and range are
/// the ones cuMemAlloc's would have, as `cuMemGetAddressRange_v2` answers
/// ([`block_attribute`]).
pub fn pointer_attribute(
    call: &impl Fn() -> CUresult,
    data: crate::ffi::AttributeOut<'_>,
    attribute: c_int,
    p: CUdeviceptr,
) -> CUresult {
    let rc = call();
    if rc.is_ok()
        && let Some(v) = block_attribute(attribute, p)
    {
        data.put(attribute, v);
    }
    rc
}

/// `cuPointerGetAttributes` (cudart's `cudaPointerGetAttributes`): as
/// [`pointer_attribute`], for each attribute asked.
pub fn pointer_attributes(
    call: &impl Fn() -> CUresult,
    count: crate::ffi::AttributeCount,
    attributes: crate::ffi::AttributeList<'_>,
    data: crate::ffi::AttributeOuts<'_>,
    p: CUdeviceptr,
) -> CUresult {
    let rc = call();
    if rc.is_ok() && crate::oversub::backing::asked(p).is_some() {
        for i in 0..count.get() as usize {
            let (Some(a), Some(out)) = (attributes.at(count, i), data.at(count, i)) else {
                break;
            };
            if let Some(v) = block_attribute(a, p) {
                out.put(a, v);
            }
        }
    }
    rc
}

/// `cuIpcGetMemHandle`: legacy IPC cannot export VMM memory (the driver
/// answers `CUDA_ERROR_INVALID_VALUE`), so a VMM-backed block is shared
/// through a file descriptor instead (`oversub::shared`): the handle names
/// it, and the peer's `cuIpcOpenMemHandle`, vgpu's too, maps it. Where
/// that cannot be, the driver's answer stands, and this process's next
/// blocks are ordinary ones, so that a new buffer can be exported.
pub fn ipc_get_mem_handle(
    call: &impl Fn() -> CUresult,
    handle: Out<[u8; 64]>,
    p: CUdeviceptr,
) -> CUresult {
    if crate::oversub::backing::asked(p).is_none() {
        return call();
    }
    if handle.is_null() {
        return CUresult::ERROR_INVALID_VALUE;
    }
    match crate::oversub::shared::export(p) {
        Ok(named) => {
            handle.put(named);
            CUresult::SUCCESS
        }
        Err(why) => {
            crate::oversub::backing::go_legacy();
            log::warn!(
                "VGPU_OVERSUBSCRIBE_VMM: cuIpcGetMemHandle of a VMM-backed block: CUDA_ERROR_INVALID_VALUE ({why}); this process's next allocations are ordinary ones, and VGPU_OVERSUBSCRIBE_VMM=false avoids this altogether"
            );
            CUresult::ERROR_INVALID_VALUE
        }
    }
}

/// `cuIpcOpenMemHandle` (both versions): a handle that names a VMM-backed
/// block of another process (`ipc_get_mem_handle`) is mapped here from its
/// file descriptor; any other goes to the driver.
pub fn ipc_open_mem_handle(
    call: &impl Fn() -> CUresult,
    dptr: Out<CUdeviceptr>,
    handle: IpcMemHandle,
    flags: c_uint,
) -> CUresult {
    if !crate::oversub::shared::names_ours(&handle.reserved) {
        return call();
    }
    if dptr.is_null() {
        return CUresult::ERROR_INVALID_VALUE;
    }
    match crate::oversub::shared::open(&handle.reserved, flags) {
        Ok(base) => {
            dptr.put(base);
            CUresult::SUCCESS
        }
        Err(rc) => rc,
    }
}

/// `cuIpcCloseMemHandle`: unmaps a block `ipc_open_mem_handle` mapped;
/// any other goes to the driver.
pub fn ipc_close_mem_handle(call: &impl Fn() -> CUresult, p: CUdeviceptr) -> CUresult {
    crate::oversub::shared::close(p).unwrap_or_else(call)
}

pub fn free_async(p: CUdeviceptr, stream: CUstream) -> CUresult {
    uncounted(Key::Ptr(p), || real::cuMemFreeAsync(p, stream))
}

pub fn free_async_ptsz(p: CUdeviceptr, stream: CUstream) -> CUresult {
    uncounted(Key::Ptr(p), || real::cuMemFreeAsync_ptsz(p, stream))
}

pub fn vmm_create(
    call: &impl Fn() -> CUresult,
    handle: Out<CUmemGenericAllocationHandle>,
    bytes: usize,
    prop: In<MemAllocationProp>,
    _flags: u64,
) -> CUresult {
    let Some(p) = prop.get() else { return call() };
    if handle.is_null() || bytes == 0 || p.location.kind != MEM_LOCATION_TYPE_DEVICE {
        return call();
    }
    counted(
        On::Ordinal(CudaOrdinal(p.location.id)),
        Kind::Vmm,
        bytes as u64,
        call,
        move || handle.get().map(Key::Vmm),
    )
}

pub fn vmm_release(handle: CUmemGenericAllocationHandle) -> CUresult {
    uncounted(Key::Vmm(handle), || real::cuMemRelease(handle))
}

fn array_key(a: Out<CUarray>) -> impl FnOnce() -> Option<Key> {
    move || a.get().map(|h| Key::Array(h as usize))
}

pub fn array_create(array: Out<CUarray>, desc: In<ArrayDescriptor>) -> CUresult {
    let call = || real::cuArrayCreate_v2(array, desc);
    let Some(d) = desc.get().filter(|_| !array.is_null()) else {
        return call();
    };
    let bytes = d.bytes();
    counted(
        On::CurrentContext,
        Kind::Array,
        bytes,
        call,
        array_key(array),
    )
}

pub fn array3d_create(array: Out<CUarray>, desc: In<Array3dDescriptor>) -> CUresult {
    let call = || real::cuArray3DCreate_v2(array, desc);
    let Some(d) = desc.get().filter(|_| !array.is_null()) else {
        return call();
    };
    let bytes = d.bytes();
    counted(
        On::CurrentContext,
        Kind::Array,
        bytes,
        call,
        array_key(array),
    )
}

pub fn array_destroy(array: CUarray) -> CUresult {
    uncounted(Key::Array(array as usize), || real::cuArrayDestroy(array))
}

pub fn mipmap_create(
    array: Out<CUmipmappedArray>,
    desc: In<Array3dDescriptor>,
    levels: c_uint,
) -> CUresult {
    let call = || real::cuMipmappedArrayCreate(array, desc, levels);
    let Some(d) = desc.get().filter(|_| !array.is_null()) else {
        return call();
    };
    let bytes = d.mipmap_bytes(levels);
    counted(
        On::CurrentContext,
        Kind::Array,
        bytes,
        call,
        array_key(array),
    )
}

pub fn mipmap_destroy(array: CUmipmappedArray) -> CUresult {
    uncounted(Key::Array(array as usize), || {
        real::cuMipmappedArrayDestroy(array)
    })
}

fn pool_device(pool: CUmemoryPool) -> On {
    POOLS
        .lock()
        .get(&(pool as usize))
        .map_or(On::CurrentContext, |&d| On::Ordinal(d))
}

pub fn pool_create(
    call: &impl Fn() -> CUresult,
    pool: Out<CUmemoryPool>,
    props: In<MemPoolProps>,
) -> CUresult {
    let rc = call();
    if rc.is_ok()
        && let (Some(p), Some(h)) = (props.get(), pool.get())
        && p.location.kind == MEM_LOCATION_TYPE_DEVICE
    {
        POOLS.lock().insert(h as usize, CudaOrdinal(p.location.id));
    }
    rc
}

pub fn pool_destroy(pool: CUmemoryPool) -> CUresult {
    let rc = real::cuMemPoolDestroy(pool);
    if rc.is_ok() {
        POOLS.lock().remove(&(pool as usize));
    }
    rc
}
