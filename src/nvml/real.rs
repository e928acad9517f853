//! Every real NVML function vgpu calls, typed, in one list: the hooked
//! ones (`exports.rs`) and those our own client calls (`client.rs`,
//! `memory_info.rs`). Each answers `NVML_ERROR_FUNCTION_NOT_FOUND` when
//! the library lacks it.
//!
//! `fn` or `unsafe fn` per function, as `reals!` explains; below the list,
//! safe forms of the `unsafe` ones, over references and slices.

use std::ffi::{CStr, c_char, c_uint};

use super::sys::*;
use crate::ffi::Out;
use crate::interpose::real::Lib;

crate::interpose::reals::reals! {
    lib: Lib::Nvml, missing: NvmlReturn::ERROR_FUNCTION_NOT_FOUND;
    fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: Out<Memory>) -> NvmlReturn;
    fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: Out<MemoryV2>) -> NvmlReturn;
    // called, not hooked
    fn nvmlInit_v2() -> NvmlReturn;
    unsafe fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut NvmlDevice) -> NvmlReturn;
    unsafe fn nvmlDeviceGetUUID(device: NvmlDevice, uuid: *mut c_char, len: c_uint) -> NvmlReturn;
    fn nvmlDeviceGetIndex(device: NvmlDevice, index: Out<NvmlIndex>) -> NvmlReturn;
    unsafe fn nvmlDeviceGetComputeRunningProcesses_v3(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfo) -> NvmlReturn;
    unsafe fn nvmlDeviceGetComputeRunningProcesses_v2(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfo) -> NvmlReturn;
    unsafe fn nvmlDeviceGetComputeRunningProcesses(device: NvmlDevice, count: *mut c_uint, infos: *mut ProcessInfoV1) -> NvmlReturn;
    unsafe fn nvmlDeviceGetProcessUtilization(device: NvmlDevice, samples: *mut UtilSample, count: *mut c_uint, since: u64) -> NvmlReturn;
}

/// A slice's length as NVML's count (a longer slice offers the first
/// `c_uint::MAX`).
fn len(n: usize) -> c_uint {
    c_uint::try_from(n).unwrap_or(c_uint::MAX)
}

/// `nvmlDeviceGetHandleByUUID`.
pub(crate) fn handle_by_uuid(uuid: &CStr, device: &mut NvmlDevice) -> NvmlReturn {
    // SAFETY: a NUL-terminated string and a live handle to write.
    unsafe { nvmlDeviceGetHandleByUUID(uuid.as_ptr(), device) }
}

/// `nvmlDeviceGetUUID` into `text` (its length is NVML's limit).
pub(crate) fn uuid_of(device: NvmlDevice, text: &mut [c_char]) -> NvmlReturn {
    // SAFETY: `text` is writable for the length we pass.
    unsafe { nvmlDeviceGetUUID(device, text.as_mut_ptr(), len(text.len())) }
}

/// `nvmlDeviceGetComputeRunningProcesses_v3` into `infos`: `count` is
/// capped by `infos.len()` and comes back as NVML's count.
pub(crate) fn processes_v3(
    device: NvmlDevice,
    count: &mut c_uint,
    infos: &mut [ProcessInfo],
) -> NvmlReturn {
    *count = (*count).min(len(infos.len()));
    // SAFETY: `infos` holds at least `*count` writable entries.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos.as_mut_ptr()) }
}

/// `nvmlDeviceGetComputeRunningProcesses_v2`, as [`processes_v3`].
pub(crate) fn processes_v2(
    device: NvmlDevice,
    count: &mut c_uint,
    infos: &mut [ProcessInfo],
) -> NvmlReturn {
    *count = (*count).min(len(infos.len()));
    // SAFETY: `infos` holds at least `*count` writable entries.
    unsafe { nvmlDeviceGetComputeRunningProcesses_v2(device, count, infos.as_mut_ptr()) }
}

/// `nvmlDeviceGetComputeRunningProcesses` (v1 entries), as [`processes_v3`].
pub(crate) fn processes_v1(
    device: NvmlDevice,
    count: &mut c_uint,
    infos: &mut [ProcessInfoV1],
) -> NvmlReturn {
    *count = (*count).min(len(infos.len()));
    // SAFETY: `infos` holds at least `*count` writable entries.
    unsafe { nvmlDeviceGetComputeRunningProcesses(device, count, infos.as_mut_ptr()) }
}

/// `nvmlDeviceGetProcessUtilization` into `samples`, `count` as in
/// [`processes_v3`].
pub(crate) fn process_utilization(
    device: NvmlDevice,
    samples: &mut [UtilSample],
    count: &mut c_uint,
    since: u64,
) -> NvmlReturn {
    *count = (*count).min(len(samples.len()));
    // SAFETY: `samples` holds at least `*count` writable entries.
    unsafe { nvmlDeviceGetProcessUtilization(device, samples.as_mut_ptr(), count, since) }
}
