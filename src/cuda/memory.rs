//! The memory families. Every allocation is reserved against the quota
//! before the driver sees it (reserve-then-check, `vgpu_shm::quota`), and
//! released when it is freed. A free of something we never counted goes to
//! the driver untouched. The device an allocation counts against comes from
//! the allocation: the current context's device, `location.id` for
//! `cuMemCreate`, the pool's device for `cuMemAllocFromPoolAsync`.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_uint;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use vgpu_shm::{EntryIndex, Kind, Owners, Reservation, SlotIndex, format_uuid};

use super::exports::real;
use super::sys::*;
use super::{device, driver};
use crate::attach::Attach;
use crate::ffi::get;
use crate::init;
use crate::quota::overhead;
use crate::quota::tracker::{self, Key, Tracked};

/// Which device an allocation lands on.
#[derive(Clone, Copy)]
enum On {
    CurrentContext,
    Ordinal(CUdevice),
}

/// Bytes reserved for an allocation in flight.
struct Charge {
    attach: &'static Attach,
    slot: SlotIndex,
    dev: EntryIndex,
    kind: Kind,
    bytes: u64,
    /// What `tracker::flight_started` was told.
    in_flight: u64,
}

impl Charge {
    /// Reserves `bytes` on the device `on` names. `Ok(None)` when nothing
    /// is enforced there (no region, no context: the driver will answer).
    fn take(on: On, kind: Kind, bytes: u64) -> Result<Option<Charge>, CUresult> {
        let Some(attach) = init::attach() else {
            return Ok(None);
        };
        let slot = counted_slot(attach)?;
        let dev = match on {
            On::CurrentContext => device::current_entry(attach).map(|(d, _)| d),
            On::Ordinal(o) => device::entry(attach, o),
        };
        let Some(dev) = dev else { return Ok(None) };
        reserve(attach, slot, dev, kind, bytes)?;
        tracker::flight_started(dev, kind, bytes);
        Ok(Some(Charge {
            attach,
            slot,
            dev,
            kind,
            bytes,
            in_flight: bytes,
        }))
    }

    /// The allocation failed: give the bytes back.
    fn refund(self) {
        tracker::flight_ended(self.dev, self.kind, self.in_flight);
        if self.attach.intact() {
            self.attach
                .region
                .unreserve(self.slot, self.dev, self.kind, self.bytes);
        }
    }

    /// The allocation succeeded: remember what it holds.
    fn keep(self, key: Key) {
        let ctx = driver::current_context().map_or(0, |c| c as usize);
        let t = Tracked {
            dev: self.dev,
            kind: self.kind,
            bytes: self.bytes,
            ctx,
        };
        // The driver handed out this address again, so whatever we had
        // under it is gone (freed through a path we do not see).
        if let Some(stale) = tracker::remove(key) {
            release(stale);
        }
        overhead::allocated(self.dev, self.bytes);
        tracker::insert(key, t);
        tracker::flight_ended(self.dev, self.kind, self.in_flight);
    }
}

/// Reserve-then-check, with one retry after making room: dead processes'
/// slots are reclaimed and our context overhead is re-measured.
fn reserve(
    attach: &Attach,
    slot: SlotIndex,
    dev: EntryIndex,
    kind: Kind,
    bytes: u64,
) -> Result<(), CUresult> {
    let region = &attach.region;
    // The region file is checked right before the accesses, and again
    // after each slow step (NVML, the lock): tamper.rs.
    let intact = || {
        attach
            .intact()
            .then_some(())
            .ok_or(CUresult::ERROR_OUT_OF_MEMORY)
    };
    intact()?;
    if region.reserve(slot, dev, kind, bytes) == Reservation::Granted {
        if !near_limit(attach, dev) || !overhead::reconcile_now(attach, slot, dev) {
            return intact();
        }
        intact()?;
        // Close to the limit, the overhead was just re-measured (the
        // driver's page tables grow with every allocation): still within?
        let limit = region.device(dev).mem_limit();
        if region.device_usage(dev, Owners::All) <= limit {
            return Ok(());
        }
        region.unreserve(slot, dev, kind, bytes);
    }
    attach.reclaim_dead();
    overhead::reconcile_now(attach, slot, dev);
    intact()?;
    match region.reserve(slot, dev, kind, bytes) {
        Reservation::Granted => Ok(()),
        Reservation::Denied { limit, used, asked } => {
            report_denial(attach, dev, limit, used, asked);
            Err(CUresult::ERROR_OUT_OF_MEMORY)
        }
    }
}

/// Within this fraction of the limit, a grant re-measures the overhead.
const NEAR_LIMIT_DIV: u64 = 32;

fn near_limit(attach: &Attach, dev: EntryIndex) -> bool {
    let limit = attach.region.device(dev).mem_limit();
    limit != 0 && attach.region.device_usage(dev, Owners::All) + limit / NEAR_LIMIT_DIV > limit
}

/// One line per denial, at most one a second.
fn report_denial(attach: &Attach, dev: EntryIndex, limit: u64, used: u64, asked: u64) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = crate::clock::monotonic_ns() / 1_000_000_000;
    if LAST.swap(now, Ordering::Relaxed) == now {
        return;
    }
    log::warn!(
        "out of memory on {}: asked {}, the container uses {} of its {} limit; returning CUDA_ERROR_OUT_OF_MEMORY",
        format_uuid(&attach.region.device(dev).uuid()),
        fmt_bytes(asked),
        fmt_bytes(used),
        fmt_bytes(limit)
    );
}

pub fn fmt_bytes(b: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (MIB * 1024.0))
    } else {
        format!("{:.1} MiB", b as f64 / MIB)
    }
}

/// Releases what a tracked allocation held (the driver has freed it).
pub fn release(t: Tracked) {
    if let Some(attach) = init::attach()
        && attach.intact()
        && let Some(slot) = attach.slot()
    {
        attach.region.unreserve(slot, t.dev, t.kind, t.bytes);
    }
}

/// Reserves what a new context on device entry `dev` is expected to cost,
/// before it is created: a context is device memory too, and a container
/// at its limit gets `CUDA_ERROR_OUT_OF_MEMORY`, as a full card would give.
/// Returns the slot and bytes to give back if the creation fails.
pub fn reserve_context(
    attach: &Attach,
    dev: EntryIndex,
) -> Result<Option<(SlotIndex, u64)>, CUresult> {
    let slot = counted_slot(attach)?;
    // Processes starting together hold provisional figures for their new
    // contexts until each is measured, moments later: wait that long
    // before calling the container full.
    let deadline = crate::clock::monotonic_ns() + CONTEXT_WAIT_NS;
    loop {
        let bytes = overhead::expected_context_bytes(attach, dev);
        match reserve(attach, slot, dev, Kind::Context, bytes) {
            Ok(()) => return Ok(Some((slot, bytes))),
            Err(rc) if crate::clock::monotonic_ns() >= deadline => return Err(rc),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
        if !attach.intact() {
            return Err(CUresult::ERROR_OUT_OF_MEMORY);
        }
    }
}

/// This process's slot, with the region checked first; without one it is
/// not counted, so it gets no memory (fail closed, one line why).
pub fn counted_slot(attach: &Attach) -> Result<SlotIndex, CUresult> {
    // (A claim checks the region file itself; `reserve` checks it before
    // it counts.)
    attach.slot().ok_or_else(|| {
        crate::warn_once!(
            "{}: this process cannot be counted, so it gets no device memory (CUDA_ERROR_OUT_OF_MEMORY)",
            attach
                .claim_error()
                .unwrap_or_else(|| "no process slot".into())
        );
        CUresult::ERROR_OUT_OF_MEMORY
    })
}

/// How long a context reservation waits for room before it fails.
const CONTEXT_WAIT_NS: u64 = 1_000_000_000;

/// Counts `bytes` of `kind` around `alloc`; `key` names the result.
fn counted(
    on: On,
    kind: Kind,
    bytes: u64,
    alloc: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> Option<Key>,
) -> CUresult {
    let charge = match Charge::take(on, kind, bytes) {
        Ok(c) => c,
        Err(rc) => return rc,
    };
    let _in_driver = charge.as_ref().map(|c| overhead::in_driver(c.dev));
    let rc = alloc();
    if let Some(c) = charge {
        match key().filter(|_| rc.is_ok()) {
            Some(k) => c.keep(k),
            None => c.refund(),
        }
    }
    rc
}

/// Frees through `free`, then releases what `key` held.
fn uncounted(key: Key, free: impl FnOnce() -> CUresult) -> CUresult {
    // Taken out first: once the driver frees it, another thread may be
    // handed the same address and insert its own entry.
    let held = tracker::remove(key);
    let _in_driver = held.as_ref().map(|t| overhead::in_driver(t.dev));
    if let Some(t) = held {
        overhead::freeing(t.dev, t.bytes);
    }
    let rc = free();
    match held {
        Some(t) if rc.is_ok() => release(t),
        Some(t) => {
            overhead::allocated(t.dev, t.bytes);
            tracker::insert(key, t);
        }
        None => {}
    }
    rc
}

fn ptr_key(p: *mut CUdeviceptr) -> impl FnOnce() -> Option<Key> {
    move || get(p).map(Key::Ptr)
}

pub fn alloc(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    if dptr.is_null() || bytes == 0 {
        return real::cuMemAlloc_v2(dptr, bytes);
    }
    counted(
        On::CurrentContext,
        Kind::Buffer,
        bytes as u64,
        || real::cuMemAlloc_v2(dptr, bytes),
        ptr_key(dptr),
    )
}

pub fn alloc_managed(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CUresult {
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
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let call = || real::cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 {
        return call();
    }
    let estimate = (width.div_ceil(PITCH_ALIGN) * PITCH_ALIGN).saturating_mul(height) as u64;
    let charge = match Charge::take(On::CurrentContext, Kind::Buffer, estimate) {
        Ok(c) => c,
        Err(rc) => return rc,
    };
    let rc = call();
    let Some(mut c) = charge else { return rc };
    let (Some(p), Some(row), true) = (get(dptr), get(pitch), rc.is_ok()) else {
        c.refund();
        return rc;
    };
    let actual = (row as u64).saturating_mul(height as u64);
    if !c.attach.intact() {
        // (Counted in the private copy from here on, at the estimate.)
        c.keep(Key::Ptr(p));
        return rc;
    }
    if actual > estimate {
        if let Err(deny) = reserve(c.attach, c.slot, c.dev, Kind::Buffer, actual - estimate) {
            c.refund();
            let _ = real::cuMemFree_v2(p);
            return deny;
        }
    } else {
        c.attach
            .region
            .unreserve(c.slot, c.dev, Kind::Buffer, estimate - actual);
    }
    c.bytes = actual;
    c.keep(Key::Ptr(p));
    rc
}

pub fn alloc_async(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult {
    counted_async(dptr, bytes, On::CurrentContext, || {
        real::cuMemAllocAsync(dptr, bytes, stream)
    })
}

pub fn alloc_async_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult {
    counted_async(dptr, bytes, On::CurrentContext, || {
        real::cuMemAllocAsync_ptsz(dptr, bytes, stream)
    })
}

pub fn alloc_from_pool(
    dptr: *mut CUdeviceptr,
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
    dptr: *mut CUdeviceptr,
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
    dptr: *mut CUdeviceptr,
    bytes: usize,
    on: On,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if dptr.is_null() || bytes == 0 {
        return call();
    }
    counted(on, Kind::Pool, bytes as u64, call, ptr_key(dptr))
}

pub fn free(p: CUdeviceptr) -> CUresult {
    uncounted(Key::Ptr(p), || real::cuMemFree_v2(p))
}

pub fn free_async(p: CUdeviceptr, stream: CUstream) -> CUresult {
    uncounted(Key::Ptr(p), || real::cuMemFreeAsync(p, stream))
}

pub fn free_async_ptsz(p: CUdeviceptr, stream: CUstream) -> CUresult {
    uncounted(Key::Ptr(p), || real::cuMemFreeAsync_ptsz(p, stream))
}

pub fn vmm_create(
    handle: *mut CUmemGenericAllocationHandle,
    bytes: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> CUresult {
    let call = || real::cuMemCreate(handle, bytes, prop, flags);
    let Some(p) = get(prop) else { return call() };
    if handle.is_null() || bytes == 0 || p.location.kind != MEM_LOCATION_TYPE_DEVICE {
        return call();
    }
    counted(
        On::Ordinal(CudaOrdinal(p.location.id)),
        Kind::Vmm,
        bytes as u64,
        call,
        move || get(handle).map(Key::Vmm),
    )
}

pub fn vmm_release(handle: CUmemGenericAllocationHandle) -> CUresult {
    uncounted(Key::Vmm(handle), || real::cuMemRelease(handle))
}

/// Bytes per element of a `CUarray_format`; formats we do not model (block
/// compressed, video) are counted at 16 bytes, the widest.
fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 16,
    }
}

/// The size of a `width x height x depth` array (0 dimensions count as 1).
pub fn array_bytes(
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
) -> u64 {
    [width, height, depth]
        .iter()
        .map(|&d| d.max(1) as u64)
        .chain([format_bytes(format), u64::from(channels.max(1))])
        .fold(1u64, u64::saturating_mul)
}

fn array_key(a: *mut CUarray) -> impl FnOnce() -> Option<Key> {
    move || get(a).map(|h| Key::Array(h as usize))
}

pub fn array_create(array: *mut CUarray, desc: *const ArrayDescriptor) -> CUresult {
    let call = || real::cuArrayCreate_v2(array, desc);
    let Some(d) = get(desc).filter(|_| !array.is_null()) else {
        return call();
    };
    let bytes = array_bytes(d.width, d.height, 1, d.format, d.channels);
    counted(
        On::CurrentContext,
        Kind::Array,
        bytes,
        call,
        array_key(array),
    )
}

pub fn array3d_create(array: *mut CUarray, desc: *const Array3dDescriptor) -> CUresult {
    let call = || real::cuArray3DCreate_v2(array, desc);
    let Some(d) = get(desc).filter(|_| !array.is_null()) else {
        return call();
    };
    let bytes = array_bytes(d.width, d.height, d.depth, d.format, d.channels);
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
    array: *mut CUmipmappedArray,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult {
    let call = || real::cuMipmappedArrayCreate(array, desc, levels);
    let Some(d) = get(desc).filter(|_| !array.is_null()) else {
        return call();
    };
    let bytes = (0..levels.clamp(1, 32))
        .map(|l| {
            array_bytes(
                d.width >> l,
                d.height >> l,
                d.depth >> l,
                d.format,
                d.channels,
            )
        })
        .fold(0u64, u64::saturating_add);
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

/// Pools we saw created, with the ordinal of their device.
static POOLS: LazyLock<Mutex<HashMap<usize, CUdevice>>> = LazyLock::new(Default::default);

fn pool_device(pool: CUmemoryPool) -> On {
    POOLS
        .lock()
        .get(&(pool as usize))
        .map_or(On::CurrentContext, |&d| On::Ordinal(d))
}

pub fn pool_create(pool: *mut CUmemoryPool, props: *const MemPoolProps) -> CUresult {
    let rc = real::cuMemPoolCreate(pool, props);
    if rc.is_ok()
        && let (Some(p), Some(h)) = (get(props), get(pool))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes_cover_every_level_and_format() {
        // 1024 x 1024 float4
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 4), 16 << 20);
        // 1-D arrays have height 0
        assert_eq!(array_bytes(4096, 0, 0, 0x01, 1), 4096);
        // unknown formats count at the widest element
        assert_eq!(array_bytes(10, 10, 10, 0x91, 1), 16_000);
        assert_eq!(array_bytes(usize::MAX, usize::MAX, 2, 0x20, 4), u64::MAX);
    }

    #[test]
    fn sizes_print_readably() {
        assert_eq!(fmt_bytes(4 << 30), "4.00 GiB");
        assert_eq!(fmt_bytes(512 << 20), "512.0 MiB");
    }
}
