//! VMM-backed `cuMemAlloc_v2` blocks (`VGPU_OVERSUBSCRIBE_VMM`,
//! docs/oversubscription.md section 2b): a block of at least the
//! granularity is served by reserve + create + map + set access, so that a
//! suspension can copy it to the host and release its physical memory
//! itself (mover.rs), at bus speed, keeping its address. This registry
//! records each block: base, the size asked for, the mapped size, device,
//! context and its physical handle (None while moved out).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

use super::state::{ACTIVE, settings};
use crate::cuda::sys::*;
use crate::cuda::{driver, real};
use crate::ffi::Out;
use crate::lock::{Listed, Lock, Name, keep};

/// The driver's granularity for pinned device memory (2 MiB on every card
/// measured, docs/vmm-facts.md fact 3); smaller blocks keep cuMemAlloc.
pub(super) const GRANULARITY: u64 = 2 << 20;

/// One VMM-backed block.
#[derive(Clone, Copy, Debug)]
pub(super) struct Backed {
    pub(super) base: CUdeviceptr,
    /// What the program asked for (what the hooks answer as its size).
    pub(super) size: u64,
    /// What is mapped: `size` rounded up to the granularity.
    pub(super) mapped: u64,
    pub(super) dev: CUdevice,
    /// The context current at the allocation (as a number).
    pub(super) ctx: usize,
    /// Its physical memory; None while it is on the host.
    pub(super) handle: Option<CUmemGenericAllocationHandle>,
    /// Shared with another process through legacy IPC (shared.rs): it
    /// stays on the card.
    pub(super) shared: bool,
    /// Its memory is exportable as a file descriptor (shareable).
    pub(super) fd: bool,
}

impl Backed {
    /// Whether a suspension moves it: on the card and not shared.
    fn movable(&self) -> bool {
        self.handle.is_some() && !self.shared
    }
}

static BACKED: Lock<Vec<Backed>> = Lock::new(Vec::new(), keep);
/// A program exported a VMM-backed block through legacy IPC that could
/// not be shared (shared.rs): from then on it gets cuMemAlloc's blocks.
static LEGACY: AtomicBool = AtomicBool::new(false);
/// The driver refused VMM memory exportable as a file descriptor: blocks
/// are made without (and cannot be shared).
static NO_FD: AtomicBool = AtomicBool::new(false);
/// The driver refused to map a block for its GPU's peers: blocks are
/// mapped for their own GPU only.
static NO_PEERS: AtomicBool = AtomicBool::new(false);

/// This module's lock, for the fork handlers (`fork.rs`).
pub(super) fn locks() -> [Listed; 1] {
    [(Name::of("oversub.backed"), &BACKED)]
}

/// Whether an allocation of `bytes` is served VMM-backed.
pub fn wanted(bytes: usize) -> bool {
    ACTIVE.load(Ordering::Relaxed)
        && settings().vmm()
        && bytes as u64 >= GRANULARITY
        && !LEGACY.load(Ordering::Relaxed)
}

thread_local! {
    /// This thread is counting a VMM-backed allocation ([`serving`]).
    static SERVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, the counting of an allocation [`wanted`] said to serve: an
/// admission that waits pins the arena for it meanwhile (mover.rs).
pub fn serving<R>(f: impl FnOnce() -> R) -> R {
    /// Clears the flag however `f` ends (a panic caught at the boundary
    /// must not leave it set).
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            let _ = SERVING.try_with(|s| s.set(false));
        }
    }
    let _ = SERVING.try_with(|s| s.set(true));
    let _clear = Clear;
    f()
}

/// Whether this thread is inside [`serving`].
pub(super) fn serving_now() -> bool {
    SERVING.try_with(std::cell::Cell::get).unwrap_or(false)
}

/// `bytes` rounded up to the granularity (what the quota counts).
pub fn mapped_size(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(GRANULARITY) * GRANULARITY
}

/// The block holding `p`, if VMM-backed.
pub(super) fn find(p: CUdeviceptr) -> Option<Backed> {
    BACKED
        .lock()
        .iter()
        .find(|b| p >= b.base && p < b.base + b.mapped)
        .copied()
}

/// For the program's questions: the base of the VMM-backed block holding
/// `p` and the size it asked for.
pub fn asked(p: CUdeviceptr) -> Option<(CUdeviceptr, u64)> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    find(p).map(|b| (b.base, b.size))
}

/// The context the VMM-backed block holding `p` was allocated in (as a
/// number), as cuMemAlloc's block would name it.
pub fn context_of(p: CUdeviceptr) -> Option<usize> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    find(p).map(|b| b.ctx)
}

/// Whether legacy IPC can export the VMM-backed block holding `p`
/// (shared.rs): its memory was made exportable as a file descriptor.
/// None: not VMM-backed.
pub fn shareable(p: CUdeviceptr) -> Option<bool> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    find(p).map(|b| b.fd)
}

/// From now on this process's blocks are cuMemAlloc's (legacy IPC).
pub fn go_legacy() {
    LEGACY.store(true, Ordering::Relaxed);
}

/// The blocks a suspension moves now: on the card and not shared.
pub(super) fn movable() -> Vec<Backed> {
    BACKED
        .lock()
        .iter()
        .filter(|b| b.movable())
        .copied()
        .collect()
}

/// Marks the block at `base` shared (shared.rs): it stays on the card.
pub(super) fn set_shared(base: CUdeviceptr) {
    if let Some(b) = BACKED.lock().iter_mut().find(|b| b.base == base) {
        b.shared = true;
    }
}

/// Whether this process holds any VMM-backed block.
pub(super) fn any() -> bool {
    !BACKED.lock().is_empty()
}

/// The bytes of the VMM-backed blocks a suspension would move now.
pub(super) fn mapped_bytes() -> u64 {
    BACKED
        .lock()
        .iter()
        .filter(|b| b.movable())
        .map(|b| b.mapped)
        .fold(0, u64::saturating_add)
}

/// The mapped bytes of this process's VMM-backed blocks that a
/// suspension moves, on the card or not (what decides its quantum).
pub(super) fn backed_bytes() -> u64 {
    BACKED
        .lock()
        .iter()
        .filter(|b| !b.shared)
        .map(|b| b.mapped)
        .fold(0, u64::saturating_add)
}

/// Whether this process gets ordinary blocks from now on (legacy IPC).
pub(super) fn legacy() -> bool {
    LEGACY.load(Ordering::Relaxed)
}

/// Records the physical handle of the block at `base` (None: moved out)
/// and, for new memory, whether it is exportable as a file descriptor.
pub(super) fn set_handle(base: CUdeviceptr, handle: Option<(CUmemGenericAllocationHandle, bool)>) {
    if let Some(b) = BACKED.lock().iter_mut().find(|b| b.base == base) {
        b.handle = handle.map(|(h, _)| h);
        if let Some((_, fd)) = handle {
            b.fd = fd;
        }
    }
}

/// The GPUs that can reach memory on `dev` (`driver::peers_of`), asked
/// of the driver once for every GPU the process sees: the answer does not
/// change, and an allocation should not ask it again.
fn peers_of(dev: CUdevice) -> Vec<CUdevice> {
    static PEERS: std::sync::OnceLock<Vec<Vec<CUdevice>>> = std::sync::OnceLock::new();
    let all = match PEERS.get() {
        Some(all) => all,
        None => {
            let Some(n) = driver::device_count() else {
                return driver::peers_of(dev);
            };
            PEERS.get_or_init(|| {
                (0..n)
                    .filter_map(|i| i32::try_from(i).ok().map(CudaOrdinal))
                    .map(driver::peers_of)
                    .collect()
            })
        }
    };
    usize::try_from(dev.0)
        .ok()
        .and_then(|i| all.get(i))
        .cloned()
        .unwrap_or_default()
}

/// Physical memory of `bytes` on `dev`, mapped read-write at `base`, and
/// whether it is exportable as a file descriptor.
pub(super) fn create_map(
    base: CUdeviceptr,
    bytes: u64,
    dev: CUdevice,
) -> Result<(CUmemGenericAllocationHandle, bool), CUresult> {
    let location = MemLocation {
        kind: MEM_LOCATION_TYPE_DEVICE,
        id: dev.0,
    };
    // Exportable as a file descriptor, so that it can be shared through
    // legacy IPC (shared.rs), where the driver allows it.
    let with_fd = !NO_FD.load(Ordering::Relaxed);
    let mut prop = MemAllocationProp {
        kind: MEM_ALLOCATION_PINNED,
        handle_types: if with_fd { MEM_HANDLE_TYPE_POSIX_FD } else { 0 },
        location,
        win32: std::ptr::null_mut(),
        flags: [0; 8],
    };
    let mut handle = 0;
    let mut rc = real::mem_create(&mut handle, bytes as usize, &prop);
    if with_fd && !rc.is_ok() && rc != CUresult::ERROR_OUT_OF_MEMORY {
        prop.handle_types = 0;
        rc = real::mem_create(&mut handle, bytes as usize, &prop);
        if rc.is_ok() {
            NO_FD.store(true, Ordering::Relaxed);
            log::info!(
                "VGPU_OVERSUBSCRIBE_VMM: the driver makes no VMM memory exportable as a file descriptor; VMM-backed blocks cannot be shared through legacy IPC"
            );
        }
    }
    if !rc.is_ok() {
        return Err(rc);
    }
    let rc = real::cuMemMap(base, bytes as usize, 0, handle, 0);
    if !rc.is_ok() {
        let _ = real::cuMemRelease(handle);
        return Err(rc);
    }
    // Read-write for its own GPU and every GPU that can reach it: peer
    // access (cuCtxEnablePeerAccess) covers cuMemAlloc's blocks, never VMM
    // memory, so a kernel or copy of another GPU would fault on it.
    let desc = |d: CUdevice| MemAccessDesc {
        location: MemLocation {
            kind: MEM_LOCATION_TYPE_DEVICE,
            id: d.0,
        },
        flags: MEM_ACCESS_READWRITE,
    };
    let peers = if NO_PEERS.load(Ordering::Relaxed) {
        Vec::new()
    } else {
        peers_of(dev)
    };
    let descs: Vec<MemAccessDesc> = std::iter::once(dev).chain(peers).map(desc).collect();
    let mut rc = real::mem_set_access_all(base, bytes as usize, &descs);
    if !rc.is_ok() && descs.len() > 1 {
        // A peer refused: its own GPU alone, as before, from now on.
        rc = real::mem_set_access(base, bytes as usize, &desc(dev));
        if rc.is_ok() && !NO_PEERS.swap(true, Ordering::Relaxed) {
            log::warn!(
                "VGPU_OVERSUBSCRIBE_VMM: the driver refused to map a VMM-backed block for the GPUs that can reach its own: VMM-backed blocks are mapped for their own GPU only (kernels of another GPU cannot reach them; VGPU_OVERSUBSCRIBE_VMM=false keeps cuMemAlloc's blocks)"
            );
        }
    }
    if !rc.is_ok() {
        let _ = real::cuMemUnmap(base, bytes as usize);
        let _ = real::cuMemRelease(handle);
        return Err(rc);
    }
    Ok((handle, prop.handle_types != 0))
}

/// Unmaps and releases a block's physical memory (its addresses stay
/// reserved).
pub(super) fn unmap_release(b: &Backed, handle: CUmemGenericAllocationHandle) -> CUresult {
    let rc = real::cuMemUnmap(b.base, b.mapped as usize);
    let rel = real::cuMemRelease(handle);
    if rc.is_ok() { rel } else { rc }
}

/// `cuMemAlloc_v2` of `bytes`, VMM-backed, into `dptr` (the quota counts
/// `mapped_size(bytes)` around it, memory.rs).
pub fn alloc(dptr: Out<CUdeviceptr>, bytes: usize) -> CUresult {
    let (Some(ctx), Some(dev)) = (driver::current_context(), driver::current_ordinal()) else {
        return real::cuMemAlloc_v2(dptr, bytes);
    };
    let mapped = mapped_size(bytes);
    let mut base: CUdeviceptr = 0;
    let rc = real::cuMemAddressReserve(Out::from(&mut base), mapped as usize, 0, 0, 0);
    if !rc.is_ok() {
        return rc;
    }
    let (handle, fd) = match create_map(base, mapped, dev) {
        Ok(made) => made,
        Err(rc) => {
            let _ = real::cuMemAddressFree(base, mapped as usize);
            return rc;
        }
    };
    BACKED.lock().push(Backed {
        base,
        size: bytes as u64,
        mapped,
        dev,
        ctx: ctx as usize,
        handle: Some(handle),
        shared: false,
        fd,
    });
    dptr.put(base);
    CUresult::SUCCESS
}

/// `cuMemFree_v2` of `p` if it is a VMM-backed block (None: not ours).
/// As cuMemFree does, it waits for the work in flight first: an unmap
/// does not (docs/vmm-facts.md fact 6).
pub fn free(p: CUdeviceptr) -> Option<CUresult> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    let b = {
        let mut g = BACKED.lock();
        let i = g.iter().position(|b| b.base == p)?;
        g.remove(i)
    };
    let _ = real::cuCtxSynchronize();
    log::debug!(
        "VGPU_OVERSUBSCRIBE_VMM: freeing a VMM-backed block of {} bytes ({} mapped) at {:#x}",
        b.size,
        b.mapped,
        b.base
    );
    let rc = match b.handle {
        Some(h) => unmap_release(&b, h),
        None => CUresult::SUCCESS,
    };
    let free = real::cuMemAddressFree(b.base, b.mapped as usize);
    Some(if rc.is_ok() { free } else { rc })
}
