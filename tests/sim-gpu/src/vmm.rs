//! The simulated CUDA driver API: virtual memory management, arrays and
//! memory pools.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_int, c_uint, c_void};

use crate::cuda::*;
use crate::ffi::*;
use crate::local::*;
use crate::state::{phys_alloc, phys_free};
// ---- VMM, arrays, pools ------------------------------------------------------

pub const MEM_LOCATION_DEVICE: c_int = 1;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    bytes: usize,
    prop: *const [c_int; 4],
    _flags: u64,
) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    let Some(p) = get(prop) else {
        return INVALID_VALUE;
    };
    if p[2] != MEM_LOCATION_DEVICE || handle.is_null() || bytes == 0 {
        return INVALID_VALUE;
    }
    let dev = tri!(physical(&l, p[3]));
    let ctx = current_ctx().unwrap_or(0);
    // `SIM_GPU_NO_FD_HANDLES=1`: a driver that makes no memory exportable
    // as a file descriptor.
    if p[1] & HANDLE_TYPE_POSIX_FD != 0
        && std::env::var_os("SIM_GPU_NO_FD_HANDLES").is_some_and(|v| v == "1")
    {
        return NOT_SUPPORTED;
    }
    if !phys_alloc(dev, bytes as u64) {
        return OUT_OF_MEMORY;
    }
    let id = l.new_id();
    l.handles.insert(
        id,
        Alloc {
            dev,
            bytes: bytes as u64,
            ctx,
        },
    );
    if p[1] & HANDLE_TYPE_POSIX_FD != 0 {
        l.exportable.insert(id);
    }
    put(handle, id as u64);
    SUCCESS
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const HANDLE_TYPE_POSIX_FD: c_int = 1;

/// Forgets the contents of handle `id` once it is neither held nor mapped.
fn drop_contents(l: &mut Local, id: usize) {
    if !l.handles.contains_key(&id) && !l.mapped.values().any(|&(m, _)| m == id) {
        l.hdata.remove(&id);
        l.shared.remove(&id);
    }
}

/// A memfd of `bytes` mapped shared: the contents of VMM memory that
/// another process may map too.
fn memfd(bytes: u64) -> Option<(std::fs::File, memmap2::MmapMut)> {
    use std::os::fd::FromRawFd;
    // SAFETY: a C string literal; memfd_create returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"sim-gpu-vmm".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor owned by nothing else.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(bytes).ok()?;
    mapped(file)
}

/// `file` mapped shared, read-write.
fn mapped(file: std::fs::File) -> Option<(std::fs::File, memmap2::MmapMut)> {
    // SAFETY: a memfd of the simulated driver's: its size changes only
    // through `set_len` above, before the mapping.
    let map = unsafe { memmap2::MmapMut::map_mut(&file) }.ok()?;
    Some((file, map))
}

/// `cuMemExportToShareableHandle`: a POSIX file descriptor for memory made
/// with that handle type (a memfd holding its contents from now on).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    out: *mut c_void,
    handle: u64,
    kind: c_int,
    _flags: u64,
) -> CUresult {
    use std::os::fd::AsRawFd;
    let mut l = local();
    tri!(ready(&l));
    let id = handle as usize;
    let Some(a) = l.handles.get(&id).copied() else {
        return INVALID_HANDLE;
    };
    if kind != HANDLE_TYPE_POSIX_FD || !l.exportable.contains(&id) || out.is_null() {
        return INVALID_VALUE;
    }
    if !l.shared.contains_key(&id) {
        let Some((file, mut map)) = memfd(a.bytes) else {
            return OUT_OF_MEMORY;
        };
        if let Some(v) = l.hdata.remove(&id) {
            map[..v.len()].copy_from_slice(&v);
        }
        l.shared.insert(id, (file, map));
    }
    let Some((file, _)) = l.shared.get(&id) else {
        return INVALID_HANDLE;
    };
    // SAFETY: dup of a descriptor this table owns.
    let fd = unsafe { libc::dup(file.as_raw_fd()) };
    if fd < 0 {
        return OUT_OF_MEMORY;
    }
    if put(out.cast::<c_int>(), fd) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

/// `cuMemImportFromShareableHandle`: a handle to the memory behind another
/// process's file descriptor. The memory is the exporter's: the card does
/// not count it again (size 0 here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    kind: c_int,
) -> CUresult {
    use std::os::fd::FromRawFd;
    let mut l = local();
    let (ctx, dev) = tri!(current(&l));
    if kind != HANDLE_TYPE_POSIX_FD || handle.is_null() {
        return INVALID_VALUE;
    }
    let fd = os_handle as usize as c_int;
    // SAFETY: dup of the caller's descriptor (its own stays the caller's).
    let own = unsafe { libc::dup(fd) };
    if own < 0 {
        return INVALID_VALUE;
    }
    // SAFETY: `own` is a fresh descriptor owned by nothing else.
    let file = unsafe { std::fs::File::from_raw_fd(own) };
    let Some(shared) = mapped(file) else {
        return INVALID_VALUE;
    };
    let id = l.new_id();
    l.handles.insert(id, Alloc { dev, bytes: 0, ctx });
    l.shared.insert(id, shared);
    put(handle, id as u64);
    SUCCESS
}

/// The legacy IPC handle, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle(pub [u8; 64]);

/// `cuIpcOpenMemHandle`: opening another process's legacy IPC handle is
/// not simulated (processes share no device addresses here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    _p: *mut Dptr,
    _h: IpcHandle,
    _flags: c_uint,
) -> CUresult {
    INVALID_VALUE
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle(p: *mut Dptr, h: IpcHandle, flags: c_uint) -> CUresult {
    // SAFETY: the caller's own arguments, passed on.
    unsafe { cuIpcOpenMemHandle_v2(p, h, flags) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcCloseMemHandle(_p: Dptr) -> CUresult {
    INVALID_VALUE
}

fn release_handle(id: usize) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    match l.handles.remove(&id) {
        Some(a) => {
            phys_free(a.dev, a.bytes);
            l.exportable.remove(&id);
            // Still mapped: its contents stay readable until unmapped.
            drop_contents(&mut l, id);
            SUCCESS
        }
        None => INVALID_VALUE,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    release_handle(handle as usize)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut Dptr,
    bytes: usize,
    _align: usize,
    _addr: Dptr,
    _f: u64,
) -> CUresult {
    let mut l = local();
    tri!(ready(&l));
    let a = l.new_addr(0, bytes as u64);
    l.reserved.insert(a, bytes as u64);
    if put(ptr, a) { SUCCESS } else { INVALID_VALUE }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressFree(ptr: Dptr, _bytes: usize) -> CUresult {
    if local().reserved.remove(&ptr).is_some() {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    ptr: Dptr,
    bytes: usize,
    _off: usize,
    handle: u64,
    _f: u64,
) -> CUresult {
    let mut l = local();
    let id = handle as usize;
    if !l.handles.contains_key(&id) {
        return INVALID_HANDLE;
    }
    let end = ptr.saturating_add(bytes as u64);
    if bytes == 0 || l.mapped.iter().any(|(&a, &(_, n))| a < end && ptr < a + n) {
        return INVALID_VALUE;
    }
    // Shared memory (exported or imported): no more than its memfd holds.
    if l.shared.get(&id).is_some_and(|(_, m)| bytes > m.len()) {
        return INVALID_VALUE;
    }
    l.mapped.insert(ptr, (id, bytes as u64));
    SUCCESS
}

/// Detaches every mapping inside `ptr..ptr+bytes`; a handle released
/// while mapped loses its contents now.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(ptr: Dptr, bytes: usize) -> CUresult {
    let mut l = local();
    let end = ptr.saturating_add(bytes as u64);
    let gone: Vec<(u64, usize)> = l
        .mapped
        .iter()
        .filter(|&(&a, _)| a >= ptr && a < end)
        .map(|(&a, &(h, _))| (a, h))
        .collect();
    for (a, h) in gone {
        l.mapped.remove(&a);
        drop_contents(&mut l, h);
    }
    SUCCESS
}

/// Who may reach each range `cuMemSetAccess` was given (start, bytes,
/// the ordinals given read-write or read access).
static ACCESS: std::sync::Mutex<Vec<(Dptr, usize, Vec<c_int>)>> = std::sync::Mutex::new(Vec::new());

/// `CUmemAccessDesc`: a location (type, id) and its flags.
type AccessDesc = [c_int; 3];

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: Dptr,
    bytes: usize,
    desc: *const AccessDesc,
    n: usize,
) -> CUresult {
    let l = local();
    tri!(ready(&l));
    if desc.is_null() || n == 0 {
        return INVALID_VALUE;
    }
    // `SIM_GPU_ONE_ACCESS=1`: a driver that maps a range for one GPU at a
    // time only.
    if n > 1 && std::env::var_os("SIM_GPU_ONE_ACCESS").is_some_and(|v| v == "1") {
        return NOT_SUPPORTED;
    }
    // SAFETY: the caller's array of `n` descriptors.
    let descs = unsafe { std::slice::from_raw_parts(desc, n) };
    let mut devs = Vec::new();
    for d in descs {
        if d[0] != MEM_LOCATION_DEVICE {
            return INVALID_VALUE;
        }
        tri!(physical(&l, d[1]));
        if d[2] != 0 {
            devs.push(d[1]);
        }
    }
    let mut g = ACCESS.lock().unwrap_or_else(|e| e.into_inner());
    g.retain(|&(p, _, _)| p != ptr);
    g.push((ptr, bytes, devs));
    SUCCESS
}

/// `cuMemGetAccess`: 3 (read-write) where `cuMemSetAccess` gave the
/// location access to a range holding `ptr`, else 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut u64,
    location: *const [c_int; 2],
    ptr: Dptr,
) -> CUresult {
    let l = local();
    tri!(ready(&l));
    let Some(loc) = get(location) else {
        return INVALID_VALUE;
    };
    let g = ACCESS.lock().unwrap_or_else(|e| e.into_inner());
    let Some((_, _, devs)) = g.iter().find(|&&(p, b, _)| ptr >= p && ptr < p + b as Dptr) else {
        return INVALID_VALUE;
    };
    put(flags, if devs.contains(&loc[1]) { 3 } else { 0 });
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    g: *mut usize,
    _prop: *const c_void,
    _opt: c_int,
) -> CUresult {
    if put(g, 2 << 20) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

/// Bytes per element of a CUarray_format (16 for formats the simulator does
/// not model: block-compressed and video formats).
pub fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 16,
    }
}

fn array_bytes(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> u64 {
    (w.max(1) as u64)
        .saturating_mul(h.max(1) as u64)
        .saturating_mul(d.max(1) as u64)
        .saturating_mul(format_bytes(format))
        .saturating_mul(u64::from(channels.max(1)))
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3dDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

fn array_create(handle: *mut Handle, bytes: u64) -> CUresult {
    let mut l = local();
    let (ctx, dev) = tri!(current(&l));
    if handle.is_null() {
        return INVALID_VALUE;
    }
    if !phys_alloc(dev, bytes) {
        return OUT_OF_MEMORY;
    }
    let id = l.new_id();
    l.handles.insert(id, Alloc { dev, bytes, ctx });
    put(handle, h(id));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(arr: *mut Handle, desc: *const ArrayDesc) -> CUresult {
    let Some(d) = get(desc) else {
        return INVALID_VALUE;
    };
    array_create(arr, array_bytes(d.width, d.height, 1, d.format, d.channels))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    arr: *mut Handle,
    desc: *const Array3dDesc,
) -> CUresult {
    let Some(d) = get(desc) else {
        return INVALID_VALUE;
    };
    array_create(
        arr,
        array_bytes(d.width, d.height, d.depth, d.format, d.channels),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    arr: *mut Handle,
    desc: *const Array3dDesc,
    levels: c_uint,
) -> CUresult {
    let Some(d) = get(desc) else {
        return INVALID_VALUE;
    };
    let bytes = (0..levels.max(1))
        .map(|lv| {
            array_bytes(
                d.width >> lv,
                d.height >> lv,
                d.depth >> lv,
                d.format,
                d.channels,
            )
        })
        .fold(0u64, u64::saturating_add);
    array_create(arr, bytes)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(arr: Handle) -> CUresult {
    release_handle(arr as usize)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(arr: Handle) -> CUresult {
    release_handle(arr as usize)
}

fn device_pool(pool: *mut Handle, d: c_int) -> CUresult {
    let mut l = local();
    let dev = tri!(physical(&l, d));
    let id = match l.pools.iter().find(|&(_, &pd)| pd == dev) {
        Some((&id, _)) => id,
        None => {
            let id = l.new_id();
            l.pools.insert(id, dev);
            id
        }
    };
    if put(pool, h(id)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut Handle, d: c_int) -> CUresult {
    device_pool(pool, d)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut Handle, d: c_int) -> CUresult {
    device_pool(pool, d)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut Handle, props: *const [c_int; 4]) -> CUresult {
    let mut l = local();
    let Some(p) = get(props) else {
        return INVALID_VALUE;
    };
    if p[2] != MEM_LOCATION_DEVICE {
        return INVALID_VALUE;
    }
    let dev = tri!(physical(&l, p[3]));
    let id = l.new_id();
    l.pools.insert(id, dev);
    if put(pool, h(id)) {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    if local().pools.remove(&(pool as usize)).is_some() {
        SUCCESS
    } else {
        INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(_pool: Handle, _keep: usize) -> CUresult {
    SUCCESS
}
