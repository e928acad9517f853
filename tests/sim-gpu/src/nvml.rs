//! The simulated NVML: devices by index and UUID, memory info (v1, v2),
//! compute process lists (v1-v3) with used memory, per-process utilisation
//! samples as the real NVML gives them under time-slicing (nvml_util.rs),
//! and device utilisation.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::cuda::device_uuid;
use crate::ffi::{c_str, get, put, put_at, put_str};
use crate::nvml_util;
use crate::state::{self, phys_used, reclaim_dead, shared};

type Ret = c_uint;
const OK: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const ARGUMENT_VERSION_MISMATCH: Ret = 25;

type Device = *mut c_void;

static INIT: AtomicI32 = AtomicI32::new(0);

fn device(d: Device) -> Result<usize, Ret> {
    if INIT.load(Ordering::Acquire) <= 0 {
        return Err(UNINITIALIZED);
    }
    let i = (d as usize).wrapping_sub(1);
    if i < shared().ndev.load(Ordering::Relaxed) as usize {
        Ok(i)
    } else {
        Err(INVALID_ARGUMENT)
    }
}

macro_rules! dev {
    ($d:expr) => {
        match device($d) {
            Ok(i) => i,
            Err(rc) => return rc,
        }
    };
}

fn uuid_text(dev: usize) -> String {
    let u = device_uuid(dev);
    vgpu_shm::format_uuid(&u)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    if std::env::var_os("SIM_GPU_NVML").is_some_and(|v| v == "0") {
        return DRIVER_NOT_LOADED;
    }
    stalls_in_the_first_fresh_child();
    state::shared();
    INIT.fetch_add(1, Ordering::AcqRel);
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> Ret {
    // SAFETY: no arguments.
    unsafe { nvmlInit_v2() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    // SAFETY: no arguments.
    unsafe { nvmlInit_v2() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    if INIT.fetch_sub(1, Ordering::AcqRel) <= 0 {
        INIT.store(0, Ordering::Release);
        return UNINITIALIZED;
    }
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(rc: Ret) -> *const c_char {
    let s: &'static [u8] = match rc {
        OK => b"Success\0",
        UNINITIALIZED => b"Uninitialized\0",
        INVALID_ARGUMENT => b"Invalid Argument\0",
        NOT_FOUND => b"Not Found\0",
        INSUFFICIENT_SIZE => b"Insufficient Size\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr() as *const c_char
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> Ret {
    if put_str(buf, len as usize, "580.159.04-sim") {
        OK
    } else {
        INVALID_ARGUMENT
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(n: *mut c_uint) -> Ret {
    if INIT.load(Ordering::Acquire) <= 0 {
        return UNINITIALIZED;
    }
    if put(n, shared().ndev.load(Ordering::Relaxed)) {
        OK
    } else {
        INVALID_ARGUMENT
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(n: *mut c_uint) -> Ret {
    // SAFETY: same contract as the _v2 entry point.
    unsafe { nvmlDeviceGetCount_v2(n) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, out: *mut Device) -> Ret {
    let d = dev!((i as usize + 1) as Device);
    if put(out, (d + 1) as Device) {
        OK
    } else {
        INVALID_ARGUMENT
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(i: c_uint, out: *mut Device) -> Ret {
    // SAFETY: same contract as the _v2 entry point.
    unsafe { nvmlDeviceGetHandleByIndex_v2(i, out) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, out: *mut Device) -> Ret {
    if INIT.load(Ordering::Acquire) <= 0 {
        return UNINITIALIZED;
    }
    let Some(text) = c_str(uuid) else {
        return INVALID_ARGUMENT;
    };
    let n = shared().ndev.load(Ordering::Relaxed) as usize;
    match (0..n).find(|&d| uuid_text(d) == text) {
        Some(d) => {
            put(out, (d + 1) as Device);
            OK
        }
        None => NOT_FOUND,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(d: Device, buf: *mut c_char, len: c_uint) -> Ret {
    let dev = dev!(d);
    if put_str(buf, len as usize, &uuid_text(dev)) {
        OK
    } else {
        INVALID_ARGUMENT
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(d: Device, buf: *mut c_char, len: c_uint) -> Ret {
    let dev = dev!(d);
    if put_str(buf, len as usize, &format!("Simulated GPU {dev}")) {
        OK
    } else {
        INVALID_ARGUMENT
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(d: Device, out: *mut c_uint) -> Ret {
    let dev = dev!(d);
    if put(out, dev as c_uint) {
        OK
    } else {
        INVALID_ARGUMENT
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

pub const MEMORY_V2: c_uint = std::mem::size_of::<MemoryV2>() as c_uint | (2 << 24);

fn memory(dev: usize) -> (u64, u64) {
    reclaim_dead();
    let total = shared().dev[dev].total.load(Ordering::Relaxed);
    (total, phys_used(dev).min(total))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(d: Device, out: *mut Memory) -> Ret {
    blocks_while_checkpointed();
    let dev = dev!(d);
    let (total, used) = memory(dev);
    answers_late_in_a_fresh_child();
    let m = Memory {
        total,
        free: total - used,
        used,
    };
    if put(out, m) { OK } else { INVALID_ARGUMENT }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(d: Device, out: *mut MemoryV2) -> Ret {
    blocks_while_checkpointed();
    let dev = dev!(d);
    let Some(m) = get(out) else {
        return INVALID_ARGUMENT;
    };
    if m.version != MEMORY_V2 {
        return ARGUMENT_VERSION_MISMATCH;
    }
    let (total, used) = memory(dev);
    answers_late_in_a_fresh_child();
    put(
        out,
        MemoryV2 {
            version: m.version,
            total,
            reserved: 0,
            free: total - used,
            used,
        },
    );
    OK
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfo {
    pub pid: c_uint,
    pub used: u64,
    pub gpu_instance: c_uint,
    pub compute_instance: c_uint,
}

/// (reported pid, bytes) of every process with a context or memory on `dev`.
fn processes(dev: usize) -> Vec<(c_uint, u64)> {
    reclaim_dead();
    shared()
        .procs
        .iter()
        .filter_map(|p| {
            let used = p.used[dev].load(Ordering::Acquire);
            let ctxs = p.contexts[dev].load(Ordering::Acquire);
            if used == 0 && ctxs == 0 {
                return None;
            }
            Some((state::reported_pid(p)?, used))
        })
        .collect()
}

fn fill_processes<T>(
    d: Device,
    count: *mut c_uint,
    out: *mut T,
    make: impl Fn(c_uint, u64) -> T,
) -> Ret {
    let dev = dev!(d);
    let list = processes(dev);
    // The real NVML takes milliseconds: the list is stale when it arrives.
    std::thread::sleep(state::nvml_delay());
    let Some(cap) = get(count) else {
        return INVALID_ARGUMENT;
    };
    put(count, list.len() as c_uint);
    if (cap as usize) < list.len() || (out.is_null() && !list.is_empty()) {
        return INSUFFICIENT_SIZE;
    }
    for (i, &(pid, used)) in list.iter().enumerate() {
        put_at(out, i, make(pid, used));
    }
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    d: Device,
    n: *mut c_uint,
    out: *mut ProcessInfoV1,
) -> Ret {
    fill_processes(d, n, out, |pid, used| ProcessInfoV1 { pid, used })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    d: Device,
    n: *mut c_uint,
    out: *mut ProcessInfo,
) -> Ret {
    fill_processes(d, n, out, |pid, used| ProcessInfo {
        pid,
        used,
        gpu_instance: u32::MAX,
        compute_instance: u32::MAX,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    d: Device,
    n: *mut c_uint,
    out: *mut ProcessInfo,
) -> Ret {
    // SAFETY: v3 shares the v2 layout.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v2(d, n, out) }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UtilSample {
    pub pid: c_uint,
    pub timestamp: u64,
    pub sm: c_uint,
    pub mem: c_uint,
    pub enc: c_uint,
    pub dec: c_uint,
}

/// One sample per process that NVML's sample periods since `last_seen`
/// gave utilisation (nvml_util.rs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    d: Device,
    out: *mut UtilSample,
    count: *mut c_uint,
    last_seen: u64,
) -> Ret {
    let dev = dev!(d);
    let samples: Vec<UtilSample> = nvml_util::process_samples(dev, last_seen)
        .into_iter()
        .map(|s| UtilSample {
            pid: s.pid,
            timestamp: s.timestamp_us,
            sm: s.sm,
            mem: 0,
            enc: 0,
            dec: 0,
        })
        .collect();
    let Some(cap) = get(count) else {
        return INVALID_ARGUMENT;
    };
    put(count, samples.len() as c_uint);
    if samples.is_empty() {
        return NOT_FOUND;
    }
    if out.is_null() || (cap as usize) < samples.len() {
        return INSUFFICIENT_SIZE;
    }
    for (i, s) in samples.into_iter().enumerate() {
        put_at(out, i, s);
    }
    OK
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(d: Device, out: *mut Utilization) -> Ret {
    let dev = dev!(d);
    let gpu = nvml_util::device_percent(dev);
    if put(out, Utilization { gpu, memory: 0 }) {
        OK
    } else {
        INVALID_ARGUMENT
    }
}

/// `SIM_GPU_NVML_STALL_FIRST=<file>`: the first NVML loaded in a
/// namespace of its own (vgpu's fresh child, `dlmopen`) stalls for ever,
/// as a child cloned while a lock it needs was held does; it makes
/// `<file>` to say so, listing the descriptors it holds ("fd target" a
/// line), and later ones answer.
fn stalls_in_the_first_fresh_child() {
    // `SIM_GPU_NVML_INIT_MS`: NVML starts this slowly in a fresh child
    // (as on a node of many cards).
    sleeps_in_a_fresh_child("SIM_GPU_NVML_INIT_MS");
    let Some(path) = std::env::var_os("SIM_GPU_NVML_STALL_FIRST") else {
        return;
    };
    if in_a_fresh_child()
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
    {
        // What it holds open while it stalls, a line each: "fd target".
        use std::io::Write;
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            for e in fds.filter_map(Result::ok) {
                let target = std::fs::read_link(e.path()).unwrap_or_default();
                let _ = writeln!(
                    f,
                    "{} {}",
                    e.file_name().to_string_lossy(),
                    target.display()
                );
            }
        }
        drop(f);
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// `SIM_GPU_NVML_ANSWER_MS`: a fresh child's memory figure, read, reaches
/// its parent this much later (as a loaded host carries it: CI, once).
fn answers_late_in_a_fresh_child() {
    sleeps_in_a_fresh_child("SIM_GPU_NVML_ANSWER_MS");
}

/// In a fresh child only, sleeps the milliseconds the variable `name` says.
fn sleeps_in_a_fresh_child(name: &str) {
    if let Some(ms) = std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok())
        && in_a_fresh_child()
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Whether this copy of the library was loaded in a namespace of its own
/// (`dlmopen`: vgpu's fresh NVML child).
fn in_a_fresh_child() -> bool {
    let mut lmid: libc::Lmid_t = 0;
    // SAFETY: dlopen with RTLD_NOLOAD finds this library (as its own
    // namespace names it) or returns NULL; dlinfo writes an Lmid_t.
    unsafe {
        let h = libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        );
        !h.is_null()
            && libc::dlinfo(h, libc::RTLD_DI_LMID, (&raw mut lmid).cast()) == 0
            && lmid != libc::LM_ID_BASE
    }
}

/// `SIM_GPU_NVML_LOCKED=1`: NVML's memory queries wait while this process
/// is locked or checkpointed, as vgpu's watcher's did on the H200 (runs
/// 21, 23 and 24: its first restore never got past one).
fn blocks_while_checkpointed() {
    if std::env::var_os("SIM_GPU_NVML_LOCKED").is_some_and(|v| v == "1") {
        crate::checkpoint::wait_open();
    }
}
