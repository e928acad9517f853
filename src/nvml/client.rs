//! vgpu's own NVML calls: per-process used memory (context overhead) and
//! per-process SM utilisation (the compute controller). Every call runs
//! inside a [`Guard`], through real slots only, so NVML never sees our
//! hooks, and never while we hold a lock.
//!
//! [`Guard`]: crate::guard::Guard
#![forbid(unsafe_code)]

use std::ffi::{CString, c_uint};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use super::real;
use super::sys::*;
use crate::ffi::Out;
use crate::guard::Guard;
use crate::lock::{Listed, Lock, Map, Name, map};

const IDLE: u8 = 0;
const STARTING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(IDLE);

/// Initialises NVML once; true when it is usable. Concurrent callers wait
/// for the first (at most 2 s).
pub fn init() -> bool {
    match STATE.compare_exchange(IDLE, STARTING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            let rc = {
                let _internal = Guard::enter();
                real::nvmlInit_v2()
            };
            let ok = rc.is_ok();
            if !ok {
                crate::warn_once!(
                    "NVML unavailable ({rc}): context overhead is not reconciled and the SM limit runs open-loop"
                );
            }
            STATE.store(if ok { READY } else { FAILED }, Ordering::Release);
            ok
        }
        Err(_) => wait_ready(Duration::from_secs(2)),
    }
}

/// Whether NVML is initialised (never waits).
pub fn is_ready() -> bool {
    STATE.load(Ordering::Acquire) == READY
}

/// Waits up to `timeout` for a running [`init`] to finish.
pub fn wait_ready(timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    loop {
        match STATE.load(Ordering::Acquire) {
            READY => return true,
            STARTING if Instant::now() < until => std::thread::sleep(Duration::from_micros(200)),
            _ => return false,
        }
    }
}

/// NVML's handles by GPU UUID. A forked child starts over: it initialises
/// NVML again before use, and asks for the handles again.
pub static DEVICES: Lock<Map<[u8; 16], usize>> = Lock::new(map(), |devices| {
    devices.clear();
    STATE.store(IDLE, Ordering::Release);
});

/// This module's lock, for the fork handlers (`fork.rs`).
pub fn locks() -> [Listed; 1] {
    [(Name::of("nvml.devices"), &DEVICES)]
}

/// NVML's handle for the GPU with this UUID.
pub fn device(uuid: &[u8; 16]) -> Option<NvmlDevice> {
    if let Some(&d) = DEVICES.lock().get(uuid) {
        return Some(d as NvmlDevice);
    }
    let text = CString::new(vgpu_shm::format_uuid(uuid)).ok()?;
    let mut dev: NvmlDevice = std::ptr::null_mut();
    let rc = {
        let _internal = Guard::enter();
        real::handle_by_uuid(&text, &mut dev)
    };
    if !rc.is_ok() || dev.is_null() {
        return None;
    }
    DEVICES.lock().insert(*uuid, dev as usize);
    Some(dev)
}

/// NVML's index of the GPU with this UUID: where it stands in NVML's
/// enumeration. None when NVML cannot be used or does not know the GPU.
pub fn index_of(uuid: &[u8; 16]) -> Option<NvmlIndex> {
    if !init() {
        return None;
    }
    let dev = device(uuid)?;
    let mut index = NvmlIndex::default();
    let rc = {
        let _internal = Guard::enter();
        real::nvmlDeviceGetIndex(dev, Out::from(&mut index))
    };
    rc.is_ok().then_some(index)
}

/// (pid, used bytes) of every compute process on `dev`.
pub fn processes(dev: NvmlDevice) -> Result<Vec<(u32, u64)>, NvmlReturn> {
    let _internal = Guard::enter();
    let mut cap: c_uint = 64;
    loop {
        let mut buf = vec![ProcessInfo::default(); cap as usize];
        let mut n = cap;
        let mut rc = real::processes_v3(dev, &mut n, &mut buf);
        if rc == NvmlReturn::ERROR_FUNCTION_NOT_FOUND {
            n = cap;
            rc = real::processes_v2(dev, &mut n, &mut buf);
        }
        if rc == NvmlReturn::ERROR_FUNCTION_NOT_FOUND {
            let mut v1 = vec![ProcessInfoV1::default(); cap as usize];
            n = cap;
            rc = real::processes_v1(dev, &mut n, &mut v1);
            buf = v1
                .iter()
                .map(|p| ProcessInfo {
                    pid: p.pid,
                    used: p.used,
                    ..Default::default()
                })
                .collect();
        }
        match rc {
            NvmlReturn::SUCCESS => {
                return Ok(buf
                    .iter()
                    .take(n as usize)
                    .map(|p| (p.pid, p.used))
                    .collect());
            }
            NvmlReturn::ERROR_INSUFFICIENT_SIZE if cap < 65_536 => cap = (n + 16).max(cap * 2),
            rc => return Err(rc),
        }
    }
}

/// The card's free memory as NVML sees it (what room there is for a
/// process to come back to).
pub fn free_memory(uuid: &[u8; 16]) -> Option<u64> {
    memory(uuid).map(|(free, _)| free)
}

/// The card's free and total memory as NVML sees them.
pub fn memory(uuid: &[u8; 16]) -> Option<(u64, u64)> {
    if !init() {
        return None;
    }
    let dev = device(uuid)?;
    let mut m = Memory::default();
    let rc = {
        let _internal = Guard::enter();
        real::nvmlDeviceGetMemoryInfo(dev, Out::from(&mut m))
    };
    rc.is_ok().then_some((m.free, m.total))
}

/// The memory allocated on `dev`, processes' and the driver's, less what
/// the driver reserves for itself (`nvmlMemory_v2_t`'s `used`).
pub fn allocated_memory(dev: NvmlDevice) -> Option<u64> {
    let mut m = MemoryV2 {
        version: MEMORY_V2,
        ..MemoryV2::default()
    };
    let rc = {
        let _internal = Guard::enter();
        real::nvmlDeviceGetMemoryInfo_v2(dev, Out::from(&mut m))
    };
    rc.is_ok().then_some(m.used)
}

/// Per-process utilisation samples on `dev` newer than `since` (µs since
/// the epoch). No samples is `Ok(empty)`.
pub fn utilization(dev: NvmlDevice, since: u64) -> Result<Vec<UtilSample>, NvmlReturn> {
    let _internal = Guard::enter();
    let mut cap: c_uint = 256;
    loop {
        let mut buf = vec![UtilSample::default(); cap as usize];
        let mut n = cap;
        match real::process_utilization(dev, &mut buf, &mut n, since) {
            NvmlReturn::SUCCESS => {
                buf.truncate(n as usize);
                return Ok(buf);
            }
            NvmlReturn::ERROR_NOT_FOUND => return Ok(Vec::new()),
            NvmlReturn::ERROR_INSUFFICIENT_SIZE if cap < 65_536 => cap = (n + 64).max(cap * 2),
            rc => return Err(rc),
        }
    }
}
